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
 * Not supported (refused by name): n_group > 32, E not a multiple of n_group, rope scaling other than YaRN.
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
    TRY(moet_cfg_bool(cfg, "use_qk_norm", false, &hp->qk_norm, err, errlen));
    /* Glm4MoeConfig's defaults */
    const moet_hf_sigmoid_defaults d = {.n_shared = 1, .first_dense = 1, .n_group = 1, .topk_group = 1, .scale = 1.0};
    return moet_hf_parse_sigmoid_moe(cfg, &d, hp, err, errlen);
}

static int glm_bind(moet_model *m, char *err, size_t errlen) {
    TRY(moet_hf_bind_model(m, err, errlen));
    for (int il = 0; il < m->hp.n_layers; il++) {
        TRY(moet_hf_bind_moe_layer(m, il, err, errlen)); /* attention, then the dense MLP or router + experts */
        TRY(moet_hf_bind_sigmoid_extras(m, il, err, errlen));
    }
    return MOET_OK;
}

const moet_arch moet_arch_glm4_moe = {
    .hf_name = "Glm4MoeForCausalLM",
    .family = "glm4_moe",
    .parse_config = glm_parse_config,
    .bind = glm_bind,
};
