/*
 * hf_common.c — the config keys and tensor names the Hugging Face decoder architectures share (hf_common.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "format/hf_config.h"
#include "model/hf_common.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int parse_rope(const json_t *cfg, double prf_default, moet_hparams *hp, char *err, size_t errlen) {
    const json_t *rp = json_object_get(cfg, "rope_parameters");
    const json_t *rs = json_object_get(cfg, "rope_scaling");
    const char *type = NULL;
    hp->rope_theta = 0;
    if (rp && json_is_object(rp)) {
        TRY(moet_cfg_num(rp, "rope_theta", false, 0, 1.0, 1e12, &hp->rope_theta, err, errlen));
        TRY(moet_cfg_str(rp, "rope_type", &type, err, errlen));
        if (!type) TRY(moet_cfg_str(rp, "type", &type, err, errlen));
    } else if (rp && !json_is_null(rp)) {
        return moet_err(err, errlen, MOET_EFORMAT, "key 'rope_parameters' must be an object");
    }
    if (hp->rope_theta == 0) TRY(moet_cfg_num(cfg, "rope_theta", false, 10000.0, 1.0, 1e12, &hp->rope_theta, err, errlen));
    if (rs && json_is_object(rs) && !type) {
        TRY(moet_cfg_str(rs, "rope_type", &type, err, errlen));
        if (!type) TRY(moet_cfg_str(rs, "type", &type, err, errlen));
        if (!type) type = "?";
    } else if (rs && !json_is_null(rs) && !json_is_object(rs)) {
        return moet_err(err, errlen, MOET_EFORMAT, "key 'rope_scaling' must be an object or null");
    }
    if (type && strcmp(type, "default") != 0)
        return moet_err(err, errlen, MOET_EUNSUP, "rope type '%s' is not supported (supported: default)", type);
    /* partial rotary (GLM-4.5: 0.5): the first int(head_dim x factor) dims of a head rotate (rotate-half within
     * them), the rest pass; transformers 5 reads it from rope_parameters, older configs spell it at the top */
    double prf = 1.0;
    const json_t *pk = rp && json_is_object(rp) && json_object_get(rp, "partial_rotary_factor") ? rp : cfg;
    TRY(moet_cfg_num(pk, "partial_rotary_factor", false, prf_default, 0.0, 1.0, &prf, err, errlen));
    hp->rope_dim = (int32_t)((double)hp->head_dim * prf);
    if (hp->rope_dim < 2 || hp->rope_dim % 2)
        return moet_err(err, errlen, MOET_EUNSUP, "partial_rotary_factor %g gives %d rotated dims of head_dim %d (an "
                        "even count >= 2 is supported)", prf, hp->rope_dim, hp->head_dim);
    return MOET_OK;
}

int moet_hf_parse_common(const json_t *cfg, double prf_default, moet_hparams *hp, char *err, size_t errlen) {
    const char *act = NULL;
    TRY(moet_cfg_str(cfg, "hidden_act", &act, err, errlen));
    if (act && strcmp(act, "silu") != 0)
        return moet_err(err, errlen, MOET_EUNSUP, "hidden_act '%s' is not supported (supported: silu)", act);
    TRY(moet_cfg_int(cfg, "vocab_size", true, 0, 1, 1 << 22, &hp->vocab, err, errlen));
    TRY(moet_cfg_int(cfg, "hidden_size", true, 0, 1, 1 << 16, &hp->hidden, err, errlen));
    TRY(moet_cfg_int(cfg, "num_hidden_layers", true, 0, 1, 1024, &hp->n_layers, err, errlen));
    TRY(moet_cfg_int(cfg, "num_attention_heads", true, 0, 1, 1024, &hp->n_heads, err, errlen));
    TRY(moet_cfg_int(cfg, "num_key_value_heads", false, hp->n_heads, 1, 1024, &hp->n_kv_heads, err, errlen));
    TRY(moet_cfg_int(cfg, "head_dim", false, hp->hidden / hp->n_heads, 2, 1024, &hp->head_dim, err, errlen));
    if (hp->head_dim % 2) return moet_err(err, errlen, MOET_EFORMAT, "head_dim %d must be even", hp->head_dim);
    if (hp->n_heads % hp->n_kv_heads)
        return moet_err(err, errlen, MOET_EFORMAT, "num_attention_heads %d is not a multiple of num_key_value_heads %d",
                        hp->n_heads, hp->n_kv_heads);
    double eps;
    TRY(moet_cfg_num(cfg, "rms_norm_eps", false, 1e-6, 0.0, 1.0, &eps, err, errlen));
    hp->rms_eps = (float)eps;
    TRY(moet_cfg_int(cfg, "max_position_embeddings", false, 32768, 1, 1 << 24, &hp->max_pos, err, errlen));
    TRY(moet_cfg_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings, err, errlen));
    TRY(moet_cfg_bool(cfg, "attention_bias", false, &hp->attn_bias, err, errlen));
    hp->n_group = hp->topk_group = 1; /* the sigmoid router's, set by the architectures that have one */
    hp->route_scale = 1.0f;
    hp->shared_ffn = 0;
    return parse_rope(cfg, prf_default, hp, err, errlen);
}

int moet_hf_bind_model(moet_model *m, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    TRY(moet_bind_matrix(m, "model.embed_tokens.weight", hp->vocab, hp->hidden, &m->tok_embd, err, errlen));
    if (hp->tie_embeddings && !moet_has_tensor(m, "lm_head.weight"))
        m->output = m->tok_embd;
    else
        TRY(moet_bind_matrix(m, "lm_head.weight", hp->vocab, hp->hidden, &m->output, err, errlen));
    TRY(moet_bind_vector(m, "model.norm.weight", hp->hidden, &m->out_norm, err, errlen));
    m->layers = calloc((size_t)hp->n_layers, sizeof(moet_layer));
    return m->layers ? MOET_OK : moet_err(err, errlen, MOET_ENOMEM, "out of memory");
}

static int opt_vector(moet_model *m, const char *name, int64_t n, const float **out, char *err, size_t errlen) {
    *out = NULL;
    return moet_bind_vector(m, name, n, out, err, errlen);
}

int moet_hf_bind_attention(moet_model *m, int il, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    moet_layer *L = &m->layers[il];
    const int64_t H = hp->hidden, Dq = (int64_t)hp->n_heads * hp->head_dim, Dkv = (int64_t)hp->n_kv_heads * hp->head_dim;
    char n[256];
#define NAME(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, il), n)
    TRY(moet_bind_vector(m, NAME("input_layernorm.weight"), H, &L->attn_norm, err, errlen));
    TRY(moet_bind_vector(m, NAME("post_attention_layernorm.weight"), H, &L->ffn_norm, err, errlen));
    TRY(moet_bind_matrix(m, NAME("self_attn.q_proj.weight"), Dq, H, &L->wq, err, errlen));
    TRY(moet_bind_matrix(m, NAME("self_attn.k_proj.weight"), Dkv, H, &L->wk, err, errlen));
    TRY(moet_bind_matrix(m, NAME("self_attn.v_proj.weight"), Dkv, H, &L->wv, err, errlen));
    TRY(moet_bind_matrix(m, NAME("self_attn.o_proj.weight"), H, Dq, &L->wo, err, errlen));
    if (hp->qk_norm) {
        TRY(moet_bind_vector(m, NAME("self_attn.q_norm.weight"), hp->head_dim, &L->q_norm, err, errlen));
        TRY(moet_bind_vector(m, NAME("self_attn.k_norm.weight"), hp->head_dim, &L->k_norm, err, errlen));
    }
    if (hp->attn_bias) {
        TRY(opt_vector(m, NAME("self_attn.q_proj.bias"), Dq, &L->bq, err, errlen));
        TRY(opt_vector(m, NAME("self_attn.k_proj.bias"), Dkv, &L->bk, err, errlen));
        TRY(opt_vector(m, NAME("self_attn.v_proj.bias"), Dkv, &L->bv, err, errlen));
        /* o_proj's bias goes with attention_bias in Qwen's and Llama's attention, not in GLM-4.5's */
        if (moet_has_tensor(m, NAME("self_attn.o_proj.bias")))
            TRY(opt_vector(m, NAME("self_attn.o_proj.bias"), H, &L->bo, err, errlen));
    }
#undef NAME
    return MOET_OK;
}

int moet_hf_bind_mlp(moet_model *m, int il, const char *prefix, int64_t F, moet_weight *gate, moet_weight *up,
                     moet_weight *down, char *err, size_t errlen) {
    const int64_t H = m->hp.hidden;
    static const char *const kn[3] = {"gate_proj", "up_proj", "down_proj"};
    moet_weight *const ws[3] = {gate, up, down};
    char n[256];
    for (int k = 0; k < 3; k++) {
        snprintf(n, sizeof n, "model.layers.%d.%s.%s.weight", il, prefix, kn[k]);
        TRY(moet_bind_matrix(m, n, k == 2 ? H : F, k == 2 ? F : H, ws[k], err, errlen));
    }
    return MOET_OK;
}

int moet_hf_bind_experts(moet_model *m, int il, const char *const (*names)[3], int n_layouts, const char *fused,
                         char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    moet_layer *L = &m->layers[il];
    const int64_t E = hp->n_experts, F = hp->expert_ffn, H = hp->hidden;
    L->exp_gate = calloc((size_t)E * 3, sizeof(moet_weight));
    if (!L->exp_gate) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    L->exp_up = L->exp_gate + E;
    L->exp_down = L->exp_up + E;
    char gu[256], dn[256], n[256];
    if (fused) {
        snprintf(gu, sizeof gu, "model.layers.%d.%s.gate_up_proj", il, fused);
        snprintf(dn, sizeof dn, "model.layers.%d.%s.down_proj", il, fused);
    }
    if (fused && moet_has_tensor(m, gu)) {
        for (int64_t e = 0; e < E; e++) {
            TRY(moet_bind_matrix_slice(m, gu, E, e, 2 * F, 0, F, H, &L->exp_gate[e], err, errlen));
            TRY(moet_bind_matrix_slice(m, gu, E, e, 2 * F, F, F, H, &L->exp_up[e], err, errlen));
            TRY(moet_bind_matrix_slice(m, dn, E, e, H, 0, H, F, &L->exp_down[e], err, errlen));
        }
        return MOET_OK;
    }
    /* the first layout whose expert 0 gate is present; the last one otherwise, so its error names what is missing */
    int lay = n_layouts - 1;
    for (int i = 0; i < n_layouts - 1; i++) {
        char pat[200];
        snprintf(pat, sizeof pat, "model.layers.%%d.%s", names[i][0]);
        snprintf(n, sizeof n, pat, il, 0LL);
        if (moet_has_tensor(m, n)) { lay = i; break; }
    }
    moet_weight *const ws[3] = {L->exp_gate, L->exp_up, L->exp_down};
    const int64_t rows[3] = {F, F, H}, cols[3] = {H, H, F};
    for (int64_t e = 0; e < E; e++)
        for (int k = 0; k < 3; k++) {
            char pat[200];
            snprintf(pat, sizeof pat, "model.layers.%%d.%s", names[lay][k]);
            snprintf(n, sizeof n, pat, il, (long long)e);
            TRY(moet_bind_matrix(m, n, rows[k], cols[k], &ws[k][e], err, errlen));
        }
    return MOET_OK;
}

int moet_hf_bind_moe_layer(moet_model *m, int il, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    moet_layer *L = &m->layers[il];
    static const char *const k_names[1][3] = {
        {"mlp.experts.%lld.gate_proj.weight", "mlp.experts.%lld.up_proj.weight", "mlp.experts.%lld.down_proj.weight"}};
    char n[256];
    TRY(moet_hf_bind_attention(m, il, err, errlen));
    L->is_moe = hp->layer_moe[il];
    if (!L->is_moe) return moet_hf_bind_mlp(m, il, "mlp", hp->dense_ffn, &L->gate, &L->up, &L->down, err, errlen);
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", il);
    TRY(moet_bind_matrix(m, n, hp->n_experts, hp->hidden, &L->router, err, errlen));
    return moet_hf_bind_experts(m, il, k_names, 1, "mlp.experts", err, errlen);
}
