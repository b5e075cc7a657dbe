/*
 * deepseek_v3.c — DeepseekV3ForCausalLM (DeepSeek-V3, DeepSeek-R1, Kimi-K2 and their shape family).
 *
 * Per layer: RMSNorm -> multi-head latent attention (MLA) -> residual; RMSNorm -> a dense SwiGLU MLP (the first
 * first_k_dense_replace layers) or the MoE block -> residual. The MoE block is GLM-4.5's (glm4_moe.c): the sigmoid
 * router with its choice bias and group-limited top-k (backend/route_ref.h), routed SwiGLU experts, and the shared
 * expert on the same input.
 *
 * MLA, as transformers' DeepseekV3Attention computes it:
 *   q        = q_b_proj(RMSNorm(q_a_proj(h)))           (q_proj(h) when q_lora_rank is null), per head [nope | rope]
 *   kv_a     = kv_a_proj_with_mqa(h) = [c (kv_lora_rank) | k_rope (qk_rope_head_dim, one for all heads)]
 *   k_nope,v = kv_b_proj(RMSNorm(c)) per head [qk_nope_head_dim | v_head_dim]
 *   the rope dims of q and k rotate (rotate-half after de-interleaving the pairs when rope_interleave), then
 *   attention over [q_nope | q_rope] . [k_nope | k_rope] with softmax scale qk_head_dim^-0.5 (times YaRN's
 *   mscale(factor, mscale_all_dim)^2), values v, and o_proj.
 * moet runs it as ordinary attention (the "naive" MLA): kv_a_proj_with_mqa is bound as two row ranges so that one
 * fused projection makes c and k_rope with q's; mla_prep (backend.h) moves each head's rope dims first (q . k does
 * not change) so the partial rotate-half RoPE of the other architectures applies, and pads v to the q/k head dim;
 * heads_narrow takes the attention output back to v_head_dim for o_proj. That cache holds full keys and values,
 * 2 x n_heads x (qk_nope + qk_rope) floats a token and layer; a backend with the mla_attn op (the CPU's) runs absorbed
 * MLA instead, on a cache of the latent and the rotary key (kv_lora_rank + qk_rope floats: docs/design.md).
 * The bottleneck RMSNorms use epsilon 1e-6 (DeepseekV3RMSNorm's default: transformers does not pass rms_norm_eps).
 *
 * Tensor names: model.layers.N.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
 * kv_a_layernorm, kv_b_proj, o_proj}; the MoE's as GLM-4.5's. The multi-token-prediction layer(s) past
 * num_hidden_layers are not used (transformers skips them too).
 *
 * Not supported (refused by name): attention_bias, a scoring_func other than sigmoid, topk_method other than
 * noaux_tc, moe_layer_freq != 1, rope scaling other than YaRN. FP8 checkpoints (DeepSeek's and Kimi's own: e4m3 in
 * 128 x 128 blocks with weight_scale_inv) bind as MOET_TYPE_F8_E4M3 (model.c), for the CPU backend and `moet quantize`.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "format/hf_config.h"
#include "model/arch.h"
#include "model/hf_common.h"
#include "model/model.h"
#include "model/rope.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int ds_parse_config(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen) {
    TRY(moet_hf_parse_common(cfg, 1.0, hp, err, errlen));
    if (hp->attn_bias) return moet_err(err, errlen, MOET_EUNSUP, "attention_bias is not supported with MLA");
    const char *sf = NULL, *tm = NULL;
    TRY(moet_cfg_str(cfg, "scoring_func", &sf, err, errlen));
    if (sf && strcmp(sf, "sigmoid") != 0)
        return moet_err(err, errlen, MOET_EUNSUP, "scoring_func '%s' is not supported (supported: sigmoid)", sf);
    TRY(moet_cfg_str(cfg, "topk_method", &tm, err, errlen));
    if (tm && strcmp(tm, "noaux_tc") != 0)
        return moet_err(err, errlen, MOET_EUNSUP, "topk_method '%s' is not supported (supported: noaux_tc)", tm);
    int32_t freq = 1;
    TRY(moet_cfg_int(cfg, "moe_layer_freq", false, 1, 1, 1024, &freq, err, errlen));
    if (freq != 1) return moet_err(err, errlen, MOET_EUNSUP, "moe_layer_freq %d is not supported (supported: 1)", freq);
    /* MLA's widths */
    const json_t *ql = json_object_get(cfg, "q_lora_rank");
    hp->q_lora_rank = 0;
    if (ql && !json_is_null(ql)) TRY(moet_cfg_int(cfg, "q_lora_rank", true, 0, 1, 1 << 16, &hp->q_lora_rank, err, errlen));
    int32_t rope;
    TRY(moet_cfg_int(cfg, "kv_lora_rank", true, 0, 1, 1 << 16, &hp->kv_lora_rank, err, errlen));
    TRY(moet_cfg_int(cfg, "qk_nope_head_dim", true, 0, 0, 1024, &hp->qk_nope_dim, err, errlen));
    TRY(moet_cfg_int(cfg, "qk_rope_head_dim", true, 0, 2, 2 * MOET_ROPE_MAX_FREQ, &rope, err, errlen));
    TRY(moet_cfg_int(cfg, "v_head_dim", true, 0, 1, 1024, &hp->v_head_dim, err, errlen));
    TRY(moet_cfg_bool(cfg, "rope_interleave", true, &hp->rope_interleave, err, errlen));
    if (rope % 2) return moet_err(err, errlen, MOET_EFORMAT, "qk_rope_head_dim %d must be even", rope);
    hp->rope_dim = rope;
    hp->head_dim = hp->qk_nope_dim + rope;
    if (hp->v_head_dim > hp->head_dim)
        return moet_err(err, errlen, MOET_EUNSUP, "v_head_dim %d wider than the q/k head (%d) is not supported",
                        hp->v_head_dim, hp->head_dim);
    hp->n_kv_heads = hp->n_heads; /* every head has its own k and v (num_key_value_heads does not apply) */
    hp->mla_eps = 1e-6f;
    TRY(moet_rope_init(hp, err, errlen)); /* the rope dims are qk_rope_head_dim (DeepseekV3Config's head_dim) */
    /* the softmax scale: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under a scaled RoPE */
    double scale = 1.0 / sqrt((double)hp->head_dim);
    if (hp->rope_type != MOET_ROPE_DEFAULT) {
        const json_t *rp = json_object_get(cfg, "rope_parameters");
        if (!rp || !json_is_object(rp) || !json_object_get(rp, "factor")) rp = json_object_get(cfg, "rope_scaling");
        double msa = 0;
        if (rp && json_is_object(rp)) TRY(moet_cfg_num(rp, "mscale_all_dim", false, 0.0, 0.0, 1e6, &msa, err, errlen));
        if (msa != 0) {
            const double ms = moet_yarn_mscale(hp->rope_factor, msa);
            scale = scale * ms * ms;
        }
    }
    hp->attn_scale = (float)scale;
    /* DeepseekV3Config's defaults */
    const moet_hf_sigmoid_defaults d = {.n_shared = 1, .first_dense = 3, .n_group = 8, .topk_group = 4, .scale = 2.5};
    return moet_hf_parse_sigmoid_moe(cfg, &d, hp, err, errlen);
}

static int ds_bind_attention(moet_model *m, int il, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    moet_layer *L = &m->layers[il];
    const int64_t H = hp->hidden, nh = hp->n_heads, qd = nh * hp->head_dim, kvl = hp->kv_lora_rank;
    char n[256];
#define NAME(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, il), n)
    TRY(moet_bind_vector(m, NAME("input_layernorm.weight"), H, &L->attn_norm, err, errlen));
    TRY(moet_bind_vector(m, NAME("post_attention_layernorm.weight"), H, &L->ffn_norm, err, errlen));
    if (hp->q_lora_rank > 0) {
        TRY(moet_bind_matrix(m, NAME("self_attn.q_a_proj.weight"), hp->q_lora_rank, H, &L->q_a, err, errlen));
        TRY(moet_bind_vector(m, NAME("self_attn.q_a_layernorm.weight"), hp->q_lora_rank, &L->q_a_norm, err, errlen));
        TRY(moet_bind_matrix(m, NAME("self_attn.q_b_proj.weight"), qd, hp->q_lora_rank, &L->wq, err, errlen));
    } else {
        TRY(moet_bind_matrix(m, NAME("self_attn.q_proj.weight"), qd, H, &L->wq, err, errlen));
    }
    /* one tensor, two row ranges: the latent c and the shared rotary key */
    TRY(moet_bind_matrix_slice(m, NAME("self_attn.kv_a_proj_with_mqa.weight"), 0, 0, kvl + hp->rope_dim, 0, kvl, H,
                               &L->kv_a, err, errlen));
    TRY(moet_bind_matrix_slice(m, NAME("self_attn.kv_a_proj_with_mqa.weight"), 0, 0, kvl + hp->rope_dim, kvl,
                               hp->rope_dim, H, &L->kv_pe, err, errlen));
    TRY(moet_bind_vector(m, NAME("self_attn.kv_a_layernorm.weight"), kvl, &L->kv_a_norm, err, errlen));
    TRY(moet_bind_matrix(m, NAME("self_attn.kv_b_proj.weight"), nh * (hp->qk_nope_dim + hp->v_head_dim), kvl, &L->kv_b,
                         err, errlen));
    TRY(moet_bind_matrix(m, NAME("self_attn.o_proj.weight"), H, nh * hp->v_head_dim, &L->wo, err, errlen));
#undef NAME
    return MOET_OK;
}

static int ds_bind(moet_model *m, char *err, size_t errlen) {
    TRY(moet_hf_bind_model(m, err, errlen));
    for (int il = 0; il < m->hp.n_layers; il++) {
        TRY(ds_bind_attention(m, il, err, errlen));
        TRY(moet_hf_bind_moe_ffn(m, il, err, errlen));
        TRY(moet_hf_bind_sigmoid_extras(m, il, err, errlen));
    }
    return MOET_OK;
}

const moet_arch moet_arch_deepseek_v3 = {
    .hf_name = "DeepseekV3ForCausalLM",
    .family = "deepseek_v3",
    .parse_config = ds_parse_config,
    .bind = ds_bind,
};
