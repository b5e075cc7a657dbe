/*
 * glm4_moe.c — Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air, GLM-4.6 and their shape family).
 *
 * Per layer: RMSNorm -> GQA attention (q/k/v biases with attention_bias, o_proj without; per-head q/k RMSNorm with
 * use_qk_norm), rotate-half RoPE over the first int(head_dim x partial_rotary_factor) dims of each head (0.5 by
 * default), the rest passing -> residual; RMSNorm -> either a dense SwiGLU MLP (the first first_k_dense_replace
 * layers, intermediate_size wide) or the MoE block:
 *   router    sigmoid of the logits; the choice adds e_score_correction_bias and keeps the topk_group best of
 *             n_group expert groups; the weights are the unbiased sigmoids of the K picks, renormalised
 *             (norm_topk_prob) and times routed_scaling_factor (backend/route_ref.h is the reference);
 *   experts   n_routed_experts SwiGLU experts of moe_intermediate_size;
 *   shared    one SwiGLU MLP of moe_intermediate_size x n_shared_experts on the same input, added unweighted.
 *
 * Tensor names: model.layers.N.mlp.gate.weight (+ .e_score_correction_bias, f32), mlp.experts.E.{gate,up,down}_proj
 * (what save_pretrained and moet packs write) or transformers 5's fused mlp.experts.gate_up_proj / down_proj,
 * mlp.shared_experts.{gate,up,down}_proj; dense layers mlp.{gate,up,down}_proj. The multi-token-prediction layers
 * past num_hidden_layers (num_nextn_predict_layers) are not used (transformers skips them as well).
 *
 * Not supported (refused by name): n_group > 32, E not a multiple of n_group, rope scaling.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/route_ref.h"
#include "core/util.h"
#include "format/hf_config.h"
#include "model/arch.h"
#include "model/hf_common.h"
#include "model/model.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int glm_parse_config(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen) {
    TRY(moet_hf_parse_common(cfg, 0.5, hp, err, errlen)); /* Glm4MoeConfig's partial_rotary_factor default */
    TRY(moet_cfg_int(cfg, "intermediate_size", false, 0, 0, 1 << 20, &hp->dense_ffn, err, errlen));
    TRY(moet_cfg_int(cfg, "moe_intermediate_size", true, 0, 1, 1 << 20, &hp->expert_ffn, err, errlen));
    static const char *const k_nexp[] = {"n_routed_experts", "num_experts", "num_local_experts", NULL};
    const char *kexp = moet_cfg_pick(cfg, k_nexp);
    if (!kexp) return moet_err(err, errlen, MOET_EFORMAT, "missing key 'n_routed_experts'");
    TRY(moet_cfg_int(cfg, kexp, true, 0, 1, 4096, &hp->n_experts, err, errlen));
    TRY(moet_cfg_int(cfg, "num_experts_per_tok", true, 0, 1, hp->n_experts, &hp->n_experts_used, err, errlen));
    int32_t n_shared = 0, first_dense = 0;
    TRY(moet_cfg_int(cfg, "n_shared_experts", false, 1, 0, 64, &n_shared, err, errlen));
    TRY(moet_cfg_int(cfg, "first_k_dense_replace", false, 1, 0, hp->n_layers, &first_dense, err, errlen));
    TRY(moet_cfg_int(cfg, "n_group", false, 1, 1, MOET_ROUTE_MAX_GROUPS, &hp->n_group, err, errlen));
    TRY(moet_cfg_int(cfg, "topk_group", false, 1, 1, hp->n_group, &hp->topk_group, err, errlen));
    if (hp->n_experts % hp->n_group || (hp->n_group > 1 && hp->n_experts / hp->n_group < 2))
        return moet_err(err, errlen, MOET_EFORMAT, "n_routed_experts %d is not a multiple of n_group %d with at least "
                        "two experts a group", hp->n_experts, hp->n_group);
    /* group-limited routing must leave K experts to pick from (transformers would pick masked ones at score 0) */
    if ((int64_t)hp->topk_group * (hp->n_experts / hp->n_group) < hp->n_experts_used)
        return moet_err(err, errlen, MOET_EFORMAT, "topk_group %d of n_group %d hold fewer than num_experts_per_tok %d "
                        "experts", hp->topk_group, hp->n_group, hp->n_experts_used);
    double scale = 1.0;
    TRY(moet_cfg_num(cfg, "routed_scaling_factor", false, 1.0, 0.0, 1e6, &scale, err, errlen));
    hp->route_scale = (float)scale;
    TRY(moet_cfg_bool(cfg, "norm_topk_prob", true, &hp->norm_topk, err, errlen));
    TRY(moet_cfg_bool(cfg, "use_qk_norm", false, &hp->qk_norm, err, errlen));
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

static int glm_bind(moet_model *m, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    char n[256];
    TRY(moet_hf_bind_model(m, err, errlen));
    for (int il = 0; il < hp->n_layers; il++) {
        moet_layer *L = &m->layers[il];
        TRY(moet_hf_bind_moe_layer(m, il, err, errlen)); /* attention, then the dense MLP or router + experts */
        if (!L->is_moe) continue;
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate.e_score_correction_bias", il);
        if (moet_has_tensor(m, n)) TRY(moet_bind_vector(m, n, hp->n_experts, &L->router_bias, err, errlen));
        if (hp->shared_ffn > 0)
            TRY(moet_hf_bind_mlp(m, il, "mlp.shared_experts", hp->shared_ffn, &L->sh_gate, &L->sh_up, &L->sh_down,
                                 err, errlen));
    }
    return MOET_OK;
}

const moet_arch moet_arch_glm4_moe = {
    .hf_name = "Glm4MoeForCausalLM",
    .family = "glm4_moe",
    .parse_config = glm_parse_config,
    .bind = glm_bind,
};
