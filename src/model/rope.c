/*
 * rope.c — the rotary embedding's frequencies, as transformers' rope init functions compute them.
 *
 * Why a table: the default RoPE's frequency of pair i is 1 / theta^(2i / dim), but scaled variants are not a power
 * law: YaRN (DeepSeek-V3, Kimi-K2, gpt-oss, long-context Qwen3) blends each pair's extrapolated frequency with the
 * interpolated one (divided by the scaling factor) along a linear ramp between two pair indices found from the
 * pre-training context, and multiplies cos and sin by an attention factor. The ops take the finished table
 * (moet_rope), so one kernel serves every variant, and a pack stores only the few numbers it is made from.
 *
 * Numerics: frequencies are computed in double and rounded to f32 once (transformers computes them in f32; the two
 * differ by at most an ulp of a frequency, ~1e-7 of an angle).
 */
#include <math.h>
#include <string.h>

#include "core/util.h"
#include "format/hf_config.h"
#include "model/rope.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

double moet_yarn_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0; }

/* The pair index whose wavelength fits num_rot turns into the pre-training context (YaRN's find_correction_dim). */
static double yarn_corr_dim(double num_rot, int dim, double base, double max_pos) {
    return ((double)dim * log(max_pos / (num_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

int moet_rope_init(moet_hparams *hp, char *err, size_t errlen) {
    moet_rope *r = &hp->rope;
    const int dim = hp->rope_dim, half = dim / 2;
    if (dim < 2 || dim % 2 || half > MOET_ROPE_MAX_FREQ)
        return moet_err(err, errlen, MOET_EUNSUP, "%d rotated dims a head (an even count from 2 to %d is supported)",
                        dim, 2 * MOET_ROPE_MAX_FREQ);
    memset(r, 0, sizeof *r);
    r->dim = dim;
    r->attn_factor = hp->rope_type == MOET_ROPE_YARN ? hp->rope_attn_factor : 1.0f;
    const double base = hp->rope_theta;
    if (hp->rope_type != MOET_ROPE_YARN) {
        for (int i = 0; i < half; i++) r->inv_freq[i] = (float)(1.0 / pow(base, (double)(2 * i) / (double)dim));
        return MOET_OK;
    }
    if (!(base > 1.0)) return moet_err(err, errlen, MOET_EFORMAT, "yarn: rope_theta %g must exceed 1", base);
    const double factor = hp->rope_factor, omax = hp->rope_orig_max_pos;
    if (!(factor > 0) || !(omax >= 1) || !(hp->rope_beta_fast > 0) || !(hp->rope_beta_slow > 0))
        return moet_err(err, errlen, MOET_EFORMAT, "yarn: factor, original_max_position_embeddings, beta_fast and "
                        "beta_slow must be positive");
    double lo = yarn_corr_dim(hp->rope_beta_fast, dim, base, omax), hi = yarn_corr_dim(hp->rope_beta_slow, dim, base, omax);
    if (hp->rope_truncate) { lo = floor(lo); hi = ceil(hi); }
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001; /* transformers' guard against a zero-width ramp */
    for (int i = 0; i < half; i++) {
        const double pf = pow(base, (double)(2 * i) / (double)dim);
        const double extra = 1.0 / pf, inter = 1.0 / (factor * pf);
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const double ef = 1.0 - ramp; /* the extrapolated share: 1 for the fast (low-index) pairs */
        r->inv_freq[i] = (float)(inter * (1.0 - ef) + extra * ef);
        if (!(r->inv_freq[i] > 0) || !isfinite(r->inv_freq[i]))
            return moet_err(err, errlen, MOET_EFORMAT, "yarn: factor %g gives frequency %g for pair %d", factor,
                            (double)r->inv_freq[i], i);
    }
    if (!(r->attn_factor > 0) || !isfinite(r->attn_factor))
        return moet_err(err, errlen, MOET_EFORMAT, "yarn: attention factor %g", (double)r->attn_factor);
    return MOET_OK;
}

int moet_rope_parse(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen) {
    const json_t *rp = json_object_get(cfg, "rope_parameters");
    const json_t *rs = json_object_get(cfg, "rope_scaling");
    const char *type = NULL;
    const json_t *src = NULL; /* the object holding the scaling's keys */
    hp->rope_theta = 0;
    if (rp && json_is_object(rp)) {
        TRY(moet_cfg_num(rp, "rope_theta", false, 0, 1.0, 1e12, &hp->rope_theta, err, errlen));
        TRY(moet_cfg_str(rp, "rope_type", &type, err, errlen));
        if (!type) TRY(moet_cfg_str(rp, "type", &type, err, errlen));
        src = rp;
    } else if (rp && !json_is_null(rp)) {
        return moet_err(err, errlen, MOET_EFORMAT, "key 'rope_parameters' must be an object");
    }
    if (hp->rope_theta == 0) TRY(moet_cfg_num(cfg, "rope_theta", false, 10000.0, 1.0, 1e12, &hp->rope_theta, err, errlen));
    if (rs && json_is_object(rs) && (!type || strcmp(type, "default") == 0)) {
        const char *t2 = NULL;
        TRY(moet_cfg_str(rs, "rope_type", &t2, err, errlen));
        if (!t2) TRY(moet_cfg_str(rs, "type", &t2, err, errlen));
        if (!t2) t2 = "?";
        if (!type || strcmp(t2, "default") != 0) { type = t2; src = rs; }
    } else if (rs && !json_is_null(rs) && !json_is_object(rs)) {
        return moet_err(err, errlen, MOET_EFORMAT, "key 'rope_scaling' must be an object or null");
    }
    hp->rope_type = MOET_ROPE_DEFAULT;
    hp->rope_attn_factor = 1.0f;
    if (type && strcmp(type, "yarn") == 0) {
        double f, bf, bs, af, ms, msa, om;
        int32_t trunc = 1;
        TRY(moet_cfg_num(src, "factor", false, 0.0, 0.0, 1e6, &f, err, errlen));
        TRY(moet_cfg_num(src, "original_max_position_embeddings", false, 0.0, 0.0, 1 << 24, &om, err, errlen));
        if (om == 0) om = hp->max_pos;
        if (f == 0) f = (double)hp->max_pos / om; /* transformers: the ratio of the two contexts */
        /* `or 32` / `or 1` in transformers: absent, null and 0 all take the default */
        TRY(moet_cfg_num(src, "beta_fast", false, 32.0, 0.0, 1e6, &bf, err, errlen));
        TRY(moet_cfg_num(src, "beta_slow", false, 1.0, 0.0, 1e6, &bs, err, errlen));
        TRY(moet_cfg_num(src, "attention_factor", false, 0.0, 0.0, 1e6, &af, err, errlen));
        TRY(moet_cfg_num(src, "mscale", false, 0.0, 0.0, 1e6, &ms, err, errlen));
        TRY(moet_cfg_num(src, "mscale_all_dim", false, 0.0, 0.0, 1e6, &msa, err, errlen));
        TRY(moet_cfg_bool(src, "truncate", true, &trunc, err, errlen));
        if (af == 0) af = ms != 0 && msa != 0 ? moet_yarn_mscale(f, ms) / moet_yarn_mscale(f, msa) : moet_yarn_mscale(f, 1.0);
        hp->rope_type = MOET_ROPE_YARN;
        hp->rope_factor = (float)f;
        hp->rope_orig_max_pos = (int32_t)om;
        hp->rope_beta_fast = (float)(bf == 0 ? 32.0 : bf);
        hp->rope_beta_slow = (float)(bs == 0 ? 1.0 : bs);
        hp->rope_truncate = trunc;
        hp->rope_attn_factor = (float)af;
    } else if (type && strcmp(type, "default") != 0) {
        return moet_err(err, errlen, MOET_EUNSUP, "rope type '%s' is not supported (supported: default, yarn)", type);
    }
    return moet_rope_init(hp, err, errlen);
}
