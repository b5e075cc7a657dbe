/*
 * mixtral.c — MixtralForCausalLM (Mixtral-8x7B / 8x22B and their shape family).
 *
 * Per layer: RMSNorm -> GQA attention (no q/k norm), rotate-half RoPE -> residual; RMSNorm -> the sparse MoE block:
 * softmax over all experts, top-k, the k weights always renormalised to sum 1 (transformers' Mixtral divides by
 * their sum unconditionally), SwiGLU experts w1 (gate), w3 (up), w2 (down). Every layer is sparse, and
 * intermediate_size is the expert's FFN width.
 *
 * Tensor names: the hub's (model.layers.N.block_sparse_moe.gate, .experts.E.w1/w2/w3), transformers 5's in-memory
 * ones (model.layers.N.mlp.gate, mlp.experts.gate_up_proj / down_proj), and a moet pack's (experts as
 * mlp.experts.E.{gate,up,down}_proj, the router under the checkpoint's own name).
 *
 * Not supported (refused by name): a sliding window shorter than the context (sliding_window), rope scaling other
 * than YaRN.
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

static int mx_parse_config(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen) {
    TRY(moet_hf_parse_common(cfg, 1.0, hp, err, errlen));
    TRY(moet_cfg_int(cfg, "intermediate_size", true, 0, 1, 1 << 20, &hp->expert_ffn, err, errlen));
    TRY(moet_cfg_int(cfg, "num_local_experts", true, 0, 1, 4096, &hp->n_experts, err, errlen));
    TRY(moet_cfg_int(cfg, "num_experts_per_tok", true, 0, 1, hp->n_experts, &hp->n_experts_used, err, errlen));
    /* a window at least as long as any context is no window: transformers masks nothing then either */
    int32_t win = 0;
    TRY(moet_cfg_int(cfg, "sliding_window", false, 0, 0, 1 << 30, &win, err, errlen));
    if (win > 0 && win < hp->max_pos)
        return moet_err(err, errlen, MOET_EUNSUP, "sliding_window %d (< max_position_embeddings %d) is not supported",
                        win, hp->max_pos);
    hp->dense_ffn = 0;
    hp->norm_topk = 1;
    hp->qk_norm = 0;
    hp->router_scoring = MOET_ROUTER_SOFTMAX;
    hp->layer_moe = malloc((size_t)hp->n_layers);
    if (!hp->layer_moe) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    memset(hp->layer_moe, 1, (size_t)hp->n_layers);
    return MOET_OK;
}

static int mx_bind(moet_model *m, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    static const char *const k_names[2][3] = {
        {"block_sparse_moe.experts.%lld.w1.weight", "block_sparse_moe.experts.%lld.w3.weight",
         "block_sparse_moe.experts.%lld.w2.weight"},
        {"mlp.experts.%lld.gate_proj.weight", "mlp.experts.%lld.up_proj.weight", "mlp.experts.%lld.down_proj.weight"}};
    char n[256];
    TRY(moet_hf_bind_model(m, err, errlen));
    for (int il = 0; il < hp->n_layers; il++) {
        moet_layer *L = &m->layers[il];
        TRY(moet_hf_bind_attention(m, il, err, errlen));
        L->is_moe = 1;
        snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.gate.weight", il);
        if (!moet_has_tensor(m, n)) snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", il);
        TRY(moet_bind_matrix(m, n, hp->n_experts, hp->hidden, &L->router, err, errlen));
        TRY(moet_hf_bind_experts(m, il, k_names, 2, "mlp.experts", err, errlen));
    }
    return MOET_OK;
}

const moet_arch moet_arch_mixtral = {
    .hf_name = "MixtralForCausalLM",
    .family = "mixtral",
    .parse_config = mx_parse_config,
    .bind = mx_bind,
};
