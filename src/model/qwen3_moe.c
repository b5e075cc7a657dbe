/*
 * qwen3_moe.c — Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B and their shape family).
 *
 * Per layer: RMSNorm -> GQA attention with per-head RMSNorm on q and k, rotate-half RoPE -> residual;
 * RMSNorm -> either the sparse MoE block (softmax router over all experts, top-k, optional renormalisation,
 * SwiGLU experts) or a dense SwiGLU MLP, chosen as transformers does: a layer is sparse iff it is not in
 * mlp_only_layers, num_experts > 0 and (layer + 1) % decoder_sparse_step == 0.
 *
 * Config spellings read (DESIGN.md §3): num_experts | num_local_experts; rope_theta | rope_parameters.rope_theta.
 * Experts are bound either per expert (experts.N.{gate,up,down}_proj.weight, what save_pretrained writes) or fused
 * (experts.gate_up_proj [E, 2F, H] + experts.down_proj [E, H, F], transformers 5's in-memory layout).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "format/hf_config.h"
#include "model/arch.h"
#include "model/model.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int parse_rope(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen) {
    const json_t *rp = json_object_get(cfg, "rope_parameters");
    const json_t *rs = json_object_get(cfg, "rope_scaling");
    const char *type = NULL;
    hp->rope_theta = 0;
    if (rp && json_is_object(rp)) {
        TRY(moet_cfg_num(rp, "rope_theta", false, 0, 1.0, 1e12, &hp->rope_theta, err, errlen));
        TRY(moet_cfg_str(rp, "rope_type", &type, err, errlen));
        if (!type) TRY(moet_cfg_str(rp, "type", &type, err, errlen));
        double prf = 1.0;
        TRY(moet_cfg_num(rp, "partial_rotary_factor", false, 1.0, 0.0, 1.0, &prf, err, errlen));
        if (prf != 1.0) return moet_err(err, errlen, MOET_EUNSUP, "partial_rotary_factor %g is not supported", prf);
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
    hp->rope_dim = hp->head_dim;
    return MOET_OK;
}

static int q3_parse_config(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen) {
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
    TRY(moet_cfg_int(cfg, "intermediate_size", false, 0, 0, 1 << 20, &hp->dense_ffn, err, errlen));
    TRY(moet_cfg_int(cfg, "moe_intermediate_size", false, 0, 0, 1 << 20, &hp->expert_ffn, err, errlen));
    static const char *const k_nexp[] = {"num_experts", "num_local_experts", NULL};
    const char *kexp = moet_cfg_pick(cfg, k_nexp);
    hp->n_experts = 0;
    if (kexp) TRY(moet_cfg_int(cfg, kexp, true, 0, 0, 4096, &hp->n_experts, err, errlen));
    TRY(moet_cfg_int(cfg, "num_experts_per_tok", hp->n_experts > 0, 0, hp->n_experts ? 1 : 0,
                     hp->n_experts ? hp->n_experts : 0, &hp->n_experts_used, err, errlen));
    TRY(moet_cfg_bool(cfg, "norm_topk_prob", false, &hp->norm_topk, err, errlen));
    double eps;
    TRY(moet_cfg_num(cfg, "rms_norm_eps", false, 1e-6, 0.0, 1.0, &eps, err, errlen));
    hp->rms_eps = (float)eps;
    TRY(moet_cfg_int(cfg, "max_position_embeddings", false, 32768, 1, 1 << 24, &hp->max_pos, err, errlen));
    TRY(moet_cfg_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings, err, errlen));
    TRY(moet_cfg_bool(cfg, "attention_bias", false, &hp->attn_bias, err, errlen));
    TRY(parse_rope(cfg, hp, err, errlen));
    int32_t sw = 0;
    TRY(moet_cfg_bool(cfg, "use_sliding_window", false, &sw, err, errlen));
    if (sw) return moet_err(err, errlen, MOET_EUNSUP, "use_sliding_window=true is not supported");
    const json_t *lt = json_object_get(cfg, "layer_types");
    if (lt && json_is_array(lt)) {
        size_t i;
        json_t *v;
        json_array_foreach(lt, i, v) if (!json_is_string(v) || strcmp(json_string_value(v), "full_attention") != 0)
            return moet_err(err, errlen, MOET_EUNSUP, "layer_types[%zu] is not 'full_attention' (only full attention "
                            "is supported)", i);
    }
    int32_t step;
    TRY(moet_cfg_int(cfg, "decoder_sparse_step", false, 1, 1, 1024, &step, err, errlen));
    hp->layer_moe = calloc((size_t)hp->n_layers, 1);
    if (!hp->layer_moe) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    for (int i = 0; i < hp->n_layers; i++) hp->layer_moe[i] = hp->n_experts > 0 && (i + 1) % step == 0;
    const json_t *mol = json_object_get(cfg, "mlp_only_layers");
    if (mol && !json_is_null(mol)) {
        if (!json_is_array(mol)) return moet_err(err, errlen, MOET_EFORMAT, "key 'mlp_only_layers' must be an array");
        size_t i;
        json_t *v;
        json_array_foreach(mol, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= hp->n_layers)
                return moet_err(err, errlen, MOET_EFORMAT, "mlp_only_layers[%zu] is not a layer index", i);
            hp->layer_moe[json_integer_value(v)] = 0;
        }
    }
    int any_moe = 0, any_dense = 0;
    for (int i = 0; i < hp->n_layers; i++) { any_moe |= hp->layer_moe[i]; any_dense |= !hp->layer_moe[i]; }
    if (any_moe && hp->expert_ffn <= 0)
        return moet_err(err, errlen, MOET_EFORMAT, "moe_intermediate_size must be positive for MoE layers");
    if (any_dense && hp->dense_ffn <= 0)
        return moet_err(err, errlen, MOET_EFORMAT, "intermediate_size must be positive for dense layers");
    hp->qk_norm = 1;
    hp->router_scoring = MOET_ROUTER_SOFTMAX;
    return MOET_OK;
}

static int opt_vector(moet_model *m, const char *name, int64_t n, const float **out, char *err, size_t errlen) {
    *out = NULL;
    return moet_bind_vector(m, name, n, out, err, errlen);
}

static int q3_bind(moet_model *m, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    const int64_t H = hp->hidden, Dq = (int64_t)hp->n_heads * hp->head_dim, Dkv = (int64_t)hp->n_kv_heads * hp->head_dim;
    char n[256];
    TRY(moet_bind_matrix(m, "model.embed_tokens.weight", hp->vocab, H, &m->tok_embd, err, errlen));
    if (hp->tie_embeddings && !moet_has_tensor(m, "lm_head.weight"))
        m->output = m->tok_embd;
    else
        TRY(moet_bind_matrix(m, "lm_head.weight", hp->vocab, H, &m->output, err, errlen));
    TRY(moet_bind_vector(m, "model.norm.weight", H, &m->out_norm, err, errlen));
    m->layers = calloc((size_t)hp->n_layers, sizeof(moet_layer));
    if (!m->layers) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    for (int il = 0; il < hp->n_layers; il++) {
        moet_layer *L = &m->layers[il];
#define NAME(fmt, ...) (snprintf(n, sizeof n, "model.layers.%d." fmt, il, ##__VA_ARGS__), n)
        TRY(moet_bind_vector(m, NAME("input_layernorm.weight"), H, &L->attn_norm, err, errlen));
        TRY(moet_bind_vector(m, NAME("post_attention_layernorm.weight"), H, &L->ffn_norm, err, errlen));
        TRY(moet_bind_matrix(m, NAME("self_attn.q_proj.weight"), Dq, H, &L->wq, err, errlen));
        TRY(moet_bind_matrix(m, NAME("self_attn.k_proj.weight"), Dkv, H, &L->wk, err, errlen));
        TRY(moet_bind_matrix(m, NAME("self_attn.v_proj.weight"), Dkv, H, &L->wv, err, errlen));
        TRY(moet_bind_matrix(m, NAME("self_attn.o_proj.weight"), H, Dq, &L->wo, err, errlen));
        TRY(moet_bind_vector(m, NAME("self_attn.q_norm.weight"), hp->head_dim, &L->q_norm, err, errlen));
        TRY(moet_bind_vector(m, NAME("self_attn.k_norm.weight"), hp->head_dim, &L->k_norm, err, errlen));
        if (hp->attn_bias) {
            TRY(opt_vector(m, NAME("self_attn.q_proj.bias"), Dq, &L->bq, err, errlen));
            TRY(opt_vector(m, NAME("self_attn.k_proj.bias"), Dkv, &L->bk, err, errlen));
            TRY(opt_vector(m, NAME("self_attn.v_proj.bias"), Dkv, &L->bv, err, errlen));
            TRY(opt_vector(m, NAME("self_attn.o_proj.bias"), H, &L->bo, err, errlen));
        }
        L->is_moe = hp->layer_moe[il];
        if (!L->is_moe) {
            const int64_t F = hp->dense_ffn;
            TRY(moet_bind_matrix(m, NAME("mlp.gate_proj.weight"), F, H, &L->gate, err, errlen));
            TRY(moet_bind_matrix(m, NAME("mlp.up_proj.weight"), F, H, &L->up, err, errlen));
            TRY(moet_bind_matrix(m, NAME("mlp.down_proj.weight"), H, F, &L->down, err, errlen));
            continue;
        }
        const int64_t E = hp->n_experts, F = hp->expert_ffn;
        TRY(moet_bind_matrix(m, NAME("mlp.gate.weight"), E, H, &L->router, err, errlen));
        L->exp_gate = calloc((size_t)E * 3, sizeof(moet_weight));
        if (!L->exp_gate) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        L->exp_up = L->exp_gate + E;
        L->exp_down = L->exp_up + E;
        char fused_gu[256], fused_d[256];
        snprintf(fused_gu, sizeof fused_gu, "model.layers.%d.mlp.experts.gate_up_proj", il);
        snprintf(fused_d, sizeof fused_d, "model.layers.%d.mlp.experts.down_proj", il);
        int fused = moet_has_tensor(m, fused_gu);
        for (int64_t e = 0; e < E; e++) {
            if (fused) {
                TRY(moet_bind_matrix_slice(m, fused_gu, E, e, 2 * F, 0, F, H, &L->exp_gate[e], err, errlen));
                TRY(moet_bind_matrix_slice(m, fused_gu, E, e, 2 * F, F, F, H, &L->exp_up[e], err, errlen));
                TRY(moet_bind_matrix_slice(m, fused_d, E, e, H, 0, H, F, &L->exp_down[e], err, errlen));
            } else {
                TRY(moet_bind_matrix(m, NAME("mlp.experts.%lld.gate_proj.weight", (long long)e), F, H,
                                     &L->exp_gate[e], err, errlen));
                TRY(moet_bind_matrix(m, NAME("mlp.experts.%lld.up_proj.weight", (long long)e), F, H, &L->exp_up[e],
                                     err, errlen));
                TRY(moet_bind_matrix(m, NAME("mlp.experts.%lld.down_proj.weight", (long long)e), H, F,
                                     &L->exp_down[e], err, errlen));
            }
        }
#undef NAME
    }
    return MOET_OK;
}

const moet_arch moet_arch_qwen3_moe = {
    .hf_name = "Qwen3MoeForCausalLM",
    .family = "qwen3_moe",
    .parse_config = q3_parse_config,
    .bind = q3_bind,
};
