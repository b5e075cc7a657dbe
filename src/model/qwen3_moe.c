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
#include "model/hf_common.h"
#include "model/model.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int q3_parse_config(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen) {
    TRY(moet_hf_parse_common(cfg, 1.0, hp, err, errlen));
    TRY(moet_cfg_int(cfg, "intermediate_size", false, 0, 0, 1 << 20, &hp->dense_ffn, err, errlen));
    TRY(moet_cfg_int(cfg, "moe_intermediate_size", false, 0, 0, 1 << 20, &hp->expert_ffn, err, errlen));
    static const char *const k_nexp[] = {"num_experts", "num_local_experts", NULL};
    const char *kexp = moet_cfg_pick(cfg, k_nexp);
    hp->n_experts = 0;
    if (kexp) TRY(moet_cfg_int(cfg, kexp, true, 0, 0, 4096, &hp->n_experts, err, errlen));
    TRY(moet_cfg_int(cfg, "num_experts_per_tok", hp->n_experts > 0, 0, hp->n_experts ? 1 : 0,
                     hp->n_experts ? hp->n_experts : 0, &hp->n_experts_used, err, errlen));
    TRY(moet_cfg_bool(cfg, "norm_topk_prob", false, &hp->norm_topk, err, errlen));
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

static int q3_bind(moet_model *m, char *err, size_t errlen) {
    TRY(moet_hf_bind_model(m, err, errlen));
    for (int il = 0; il < m->hp.n_layers; il++) TRY(moet_hf_bind_moe_layer(m, il, err, errlen));
    return MOET_OK;
}

const moet_arch moet_arch_qwen3_moe = {
    .hf_name = "Qwen3MoeForCausalLM",
    .family = "qwen3_moe",
    .parse_config = q3_parse_config,
    .bind = q3_bind,
};
