/*
 * hf_common.c — the config keys and tensor names the Hugging Face decoder architectures share (hf_common.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/route_ref.h"
#include "core/util.h"
#include "format/hf_config.h"
#include "model/hf_common.h"
#include "model/rope.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

/* partial rotary (GLM-4.5: 0.5): the first int(head_dim x factor) dims of a head rotate (rotate-half within them), the
 * rest pass; transformers 5 reads it from rope_parameters, older configs spell it at the top. Then the frequencies
 * (model/rope.c: default or YaRN). */
static int parse_rope(const json_t *cfg, double prf_default, moet_hparams *hp, char *err, size_t errlen) {
    const json_t *rp = json_object_get(cfg, "rope_parameters");
    double prf = 1.0;
    const json_t *pk = rp && json_is_object(rp) && json_object_get(rp, "partial_rotary_factor") ? rp : cfg;
    TRY(moet_cfg_num(pk, "partial_rotary_factor", false, prf_default, 0.0, 1.0, &prf, err, errlen));
    hp->rope_dim = (int32_t)((double)hp->head_dim * prf);
    if (hp->rope_dim < 2 || hp->rope_dim % 2)
        return moet_err(err, errlen, MOET_EUNSUP, "partial_rotary_factor %g gives %d rotated dims of head_dim %d (an "
                        "even count >= 2 is supported)", prf, hp->rope_dim, hp->head_dim);
    return moet_rope_parse(cfg, hp, err, errlen);
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
    TRY(moet_hf_bind_attention(m, il, err, errlen));
    return moet_hf_bind_moe_ffn(m, il, err, errlen);
}

int moet_hf_bind_sigmoid_extras(moet_model *m, int il, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    moet_layer *L = &m->layers[il];
    char n[256];
    if (!L->is_moe) return MOET_OK;
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.e_score_correction_bias", il);
    if (moet_has_tensor(m, n)) TRY(moet_bind_vector(m, n, hp->n_experts, &L->router_bias, err, errlen));
    if (hp->shared_ffn > 0)
        TRY(moet_hf_bind_mlp(m, il, "mlp.shared_experts", hp->shared_ffn, &L->sh_gate, &L->sh_up, &L->sh_down, err,
                             errlen));
    return MOET_OK;
}

int moet_hf_bind_moe_ffn(moet_model *m, int il, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    moet_layer *L = &m->layers[il];
    static const char *const k_names[1][3] = {
        {"mlp.experts.%lld.gate_proj.weight", "mlp.experts.%lld.up_proj.weight", "mlp.experts.%lld.down_proj.weight"}};
    char n[256];
    L->is_moe = hp->layer_moe[il];
    if (!L->is_moe) return moet_hf_bind_mlp(m, il, "mlp", hp->dense_ffn, &L->gate, &L->up, &L->down, err, errlen);
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", il);
    TRY(moet_bind_matrix(m, n, hp->n_experts, hp->hidden, &L->router, err, errlen));
    return moet_hf_bind_experts(m, il, k_names, 1, "mlp.experts", err, errlen);
}

int moet_hf_parse_sigmoid_moe(const json_t *cfg, const moet_hf_sigmoid_defaults *d, moet_hparams *hp, char *err,
                              size_t errlen) {
    TRY(moet_cfg_int(cfg, "intermediate_size", false, 0, 0, 1 << 20, &hp->dense_ffn, err, errlen));
    TRY(moet_cfg_int(cfg, "moe_intermediate_size", true, 0, 1, 1 << 20, &hp->expert_ffn, err, errlen));
    static const char *const k_nexp[] = {"n_routed_experts", "num_experts", "num_local_experts", NULL};
    const char *kexp = moet_cfg_pick(cfg, k_nexp);
    if (!kexp) return moet_err(err, errlen, MOET_EFORMAT, "missing key 'n_routed_experts'");
    TRY(moet_cfg_int(cfg, kexp, true, 0, 1, 4096, &hp->n_experts, err, errlen));
    TRY(moet_cfg_int(cfg, "num_experts_per_tok", true, 0, 1, hp->n_experts, &hp->n_experts_used, err, errlen));
    int32_t n_shared = 0, first_dense = 0;
    TRY(moet_cfg_int(cfg, "n_shared_experts", false, d->n_shared, 0, 64, &n_shared, err, errlen));
    TRY(moet_cfg_int(cfg, "first_k_dense_replace", false, d->first_dense, 0, hp->n_layers, &first_dense, err, errlen));
    TRY(moet_cfg_int(cfg, "n_group", false, d->n_group, 1, MOET_ROUTE_MAX_GROUPS, &hp->n_group, err, errlen));
    TRY(moet_cfg_int(cfg, "topk_group", false, d->topk_group < hp->n_group ? d->topk_group : hp->n_group, 1,
                     hp->n_group, &hp->topk_group, err, errlen));
    if (hp->n_experts % hp->n_group || (hp->n_group > 1 && hp->n_experts / hp->n_group < 2))
        return moet_err(err, errlen, MOET_EFORMAT, "n_routed_experts %d is not a multiple of n_group %d with at least "
                        "two experts a group", hp->n_experts, hp->n_group);
    /* group-limited routing must leave K experts to pick from (transformers would pick masked ones at score 0) */
    if ((int64_t)hp->topk_group * (hp->n_experts / hp->n_group) < hp->n_experts_used)
        return moet_err(err, errlen, MOET_EFORMAT, "topk_group %d of n_group %d hold fewer than num_experts_per_tok %d "
                        "experts", hp->topk_group, hp->n_group, hp->n_experts_used);
    double scale = 1.0;
    TRY(moet_cfg_num(cfg, "routed_scaling_factor", false, d->scale, 0.0, 1e6, &scale, err, errlen));
    hp->route_scale = (float)scale;
    TRY(moet_cfg_bool(cfg, "norm_topk_prob", true, &hp->norm_topk, err, errlen));
    if ((int64_t)hp->expert_ffn * n_shared > (1 << 20))
        return moet_err(err, errlen, MOET_EFORMAT, "shared expert width too large");
    hp->shared_ffn = hp->expert_ffn * n_shared;
    hp->router_scoring = MOET_ROUTER_SIGMOID;
    hp->layer_moe = malloc((size_t)hp->n_layers);
    if (!hp->layer_moe) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    for (int i = 0; i < hp->n_layers; i++) hp->layer_moe[i] = i >= first_dense;
    if (first_dense > 0 && hp->dense_ffn <= 0)
        return moet_err(err, errlen, MOET_EFORMAT, "intermediate_size must be positive for the first_k_dense_replace "
                        "= %d dense layers", first_dense);
    return MOET_OK;
}
