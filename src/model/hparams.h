/*
 * hparams.h — the architecture-independent hyperparameters an architecture file fills from config.json, and the
 * per-layer plan (which weights each layer has) the runtime executes.
 */
#ifndef MOET_MODEL_HPARAMS_H
#define MOET_MODEL_HPARAMS_H

#include <stdint.h>

#include "backend/backend.h"

#define MOET_MAX_EOS 8

typedef struct {
    char architecture[64];    /* config.json architectures[0] */
    int32_t vocab, hidden, n_layers, n_heads, n_kv_heads, head_dim;
    int32_t dense_ffn;        /* intermediate_size (dense MLP layers) */
    int32_t expert_ffn;       /* moe_intermediate_size */
    int32_t n_experts, n_experts_used;
    int32_t norm_topk;        /* renormalise top-k router weights */
    int32_t router_scoring;   /* MOET_ROUTER_* */
    int32_t n_group, topk_group; /* MOET_ROUTER_SIGMOID: expert groups, and how many a token keeps (1, 1: no limit) */
    float route_scale;        /* routed_scaling_factor (MOET_ROUTER_SIGMOID; 1 otherwise) */
    int32_t shared_ffn;       /* the MoE layers' always-on shared expert: its FFN width (0: none) */
    float rms_eps;
    double rope_theta;
    int32_t rope_dim;         /* rotated dims per head (== head_dim for Qwen3) */
    /* RoPE scaling (model/rope.c): MOET_ROPE_DEFAULT, or MOET_ROPE_YARN with its factor, the pre-training context
     * (original_max_position_embeddings), beta_fast / beta_slow and whether the ramp's ends are truncated */
    int32_t rope_type;
    float rope_factor, rope_beta_fast, rope_beta_slow;
    int32_t rope_orig_max_pos, rope_truncate;
    float rope_attn_factor;   /* cos and sin multiplied by it (YaRN's attention factor, resolved); 1 */
    float attn_scale;         /* the attention's softmax scale (0: 1 / sqrt(head_dim)) */
    moet_rope rope;           /* derived from the above by moet_rope_init: what the ops take */
    /* MLA (DeepSeek-V3, Kimi-K2; kv_lora_rank > 0): queries through a rank-q_lora_rank bottleneck with its RMSNorm
     * (0: q_proj directly), keys and values through one of kv_lora_rank; a q/k head is qk_nope_dim + rope_dim =
     * head_dim wide (the rope dims first once mla_prep has moved them), a v head v_head_dim; rope_interleave: the
     * checkpoint's rope dims are pairs (x0, x1), (x2, x3), .. (mla_prep de-interleaves them). n_kv_heads = n_heads. */
    int32_t q_lora_rank, kv_lora_rank, qk_nope_dim, v_head_dim, rope_interleave;
    float mla_eps;            /* q_a_layernorm's and kv_a_layernorm's epsilon */
    /* gpt-oss: the experts' clamped SwiGLU (backend.h, moet_moe_args.swiglu_limit; 0: SiLU), and the sliding
     * window of its sliding_attention layers (moet_layer.window) */
    float swiglu_limit;
    int32_t sliding_window;
    uint8_t *layer_sliding;   /* [n_layers]: 1 = a sliding-window layer (gpt-oss's layer_types), or NULL: none */
    int32_t max_pos;
    int32_t tie_embeddings;
    int32_t attn_bias;
    int32_t qk_norm;
    uint8_t *layer_moe;       /* [n_layers]: 1 = sparse MoE block, 0 = dense MLP */
    int32_t bos_id;           /* -1 if none */
    int32_t eos_ids[MOET_MAX_EOS];
    int32_t n_eos;
} moet_hparams;

typedef struct {
    moet_weight wq, wk, wv, wo;
    const float *bq, *bk, *bv, *bo;          /* NULL without attention bias */
    const float *attn_norm, *ffn_norm;       /* [hidden] f32 */
    const float *q_norm, *k_norm;            /* [head_dim] f32, NULL without q/k norm */
    int32_t is_moe;
    moet_weight router;                      /* [n_experts × hidden] */
    const float *router_bias;                /* [n_experts] f32, the sigmoid router's choice bias, or NULL */
    moet_weight sh_gate, sh_up, sh_down;     /* the shared expert (hp.shared_ffn > 0): a dense SwiGLU MLP beside
                                              * the routed ones, on the same normed input, added unweighted */
    moet_weight *exp_gate, *exp_up, *exp_down; /* [n_experts] each */
    moet_weight *dexp_gate, *dexp_up, *dexp_down; /* base + delta ("on" weights, f32: in-memory requant), or NULL */
    moet_weight *dres_gate, *dres_up, *dres_down; /* a delta pack's NVFP4 residuals: "on" = exp_* + dres_*, or NULL */
    moet_weight gate, up, down;              /* dense MLP */
    /* MLA (hp.kv_lora_rank > 0): wq is q_b_proj (or q_proj without a q bottleneck), wk / wv are unused */
    moet_weight q_a;                         /* q_a_proj [q_lora_rank x hidden] */
    moet_weight kv_a, kv_pe;                 /* kv_a_proj_with_mqa's rows [0, kv_lora_rank) and the rope_dim after */
    moet_weight kv_b;                        /* kv_b_proj [n_heads (qk_nope_dim + v_head_dim) x kv_lora_rank] */
    const float *q_a_norm, *kv_a_norm;
    /* gpt-oss: attention sinks [n_heads] and the layer's sliding window (0: full attention); the router's bias
     * [n_experts] and the experts' biases, gate / up [n_experts][expert_ffn], down [n_experts][hidden] */
    const float *sinks;
    int32_t window;
    const float *router_lbias;
    const float *exp_gate_b, *exp_up_b, *exp_down_b;
} moet_layer;

#endif
