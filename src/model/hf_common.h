/*
 * hf_common.h — what the Hugging Face decoder architectures share: the config keys every one of them spells the same
 * way, and the tensor names of embeddings, norms and attention (model.layers.N.self_attn.*). An architecture file
 * (qwen3_moe.c, mixtral.c) parses and binds what is its own around these.
 */
#ifndef MOET_MODEL_HF_COMMON_H
#define MOET_MODEL_HF_COMMON_H

#include <jansson.h>
#include <stddef.h>

#include "model/model.h"

/* hidden_act (silu only), vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
 * head_dim (default hidden / heads; null counts as absent), rms_norm_eps, max_position_embeddings,
 * tie_word_embeddings, attention_bias, and the RoPE (rope_parameters | rope_theta + rope_scaling: default or yarn;
 * partial_rotary_factor from rope_parameters or the top level, prf_default where neither has it). */
int moet_hf_parse_common(const json_t *cfg, double prf_default, moet_hparams *hp, char *err, size_t errlen);

/* The sigmoid-routed MoE keys (GLM-4.5, DeepSeek-V3): intermediate_size, moe_intermediate_size, n_routed_experts,
 * num_experts_per_tok, n_shared_experts, first_k_dense_replace, n_group, topk_group, routed_scaling_factor,
 * norm_topk_prob; sets the router to MOET_ROUTER_SIGMOID, the shared expert's width and layer_moe. Absent keys take
 * the architecture's config class defaults (d). */
typedef struct {
    int32_t n_shared, first_dense, n_group, topk_group;
    double scale;
} moet_hf_sigmoid_defaults;
int moet_hf_parse_sigmoid_moe(const json_t *cfg, const moet_hf_sigmoid_defaults *d, moet_hparams *hp, char *err,
                              size_t errlen);

/* model.embed_tokens, lm_head (or the tied embedding), model.norm; allocates m->layers. */
int moet_hf_bind_model(moet_model *m, char *err, size_t errlen);

/* Layer il's input_layernorm, post_attention_layernorm, self_attn.{q,k,v,o}_proj (with attention_bias q/k/v's
 * biases, and o_proj's where the checkpoint has one), and with hp->qk_norm self_attn.{q,k}_norm. */
int moet_hf_bind_attention(moet_model *m, int il, char *err, size_t errlen);

/* Layer il's dense SwiGLU MLP under model.layers.N.<prefix>.{gate,up,down}_proj.weight, F wide (a dense layer's
 * "mlp", GLM-4.5's "mlp.shared_experts"). */
int moet_hf_bind_mlp(moet_model *m, int il, const char *prefix, int64_t F, moet_weight *gate, moet_weight *up,
                     moet_weight *down, char *err, size_t errlen);

/* Layer il as the Qwen-style MoE decoders lay it out (Qwen3-MoE, GLM-4.5): its attention (moet_hf_bind_attention),
 * then either the dense MLP "mlp" (hp->layer_moe[il] == 0, dense_ffn wide) or the router mlp.gate and the routed
 * experts under mlp.experts (per expert as save_pretrained and moet packs write them, or transformers 5's fused
 * pair). */
int moet_hf_bind_moe_layer(moet_model *m, int il, char *err, size_t errlen);
/* The same without the attention: the dense MLP, or the router and the routed experts. */
int moet_hf_bind_moe_ffn(moet_model *m, int il, char *err, size_t errlen);
/* What the sigmoid-routed MoE layers (GLM-4.5, DeepSeek-V3) add to the Qwen-style one, in MoE layers: the router's
 * mlp.gate.e_score_correction_bias where present, and with hp->shared_ffn the shared expert mlp.shared_experts. */
int moet_hf_bind_sigmoid_extras(moet_model *m, int il, char *err, size_t errlen);

/* Layer il's routed experts (L->exp_*, n_experts of expert_ffn), from the first layout present:
 *   per expert   model.layers.N.<names[k] with the expert's index>, k = gate, up, down (each layout's own names),
 *                tried for each of the n_layouts name triples in turn;
 *   fused        model.layers.N.<fused>.gate_up_proj [E, 2F, H] + .down_proj [E, H, F] (transformers 5's in-memory
 *                layout), where fused != NULL. */
int moet_hf_bind_experts(moet_model *m, int il, const char *const (*names)[3], int n_layouts, const char *fused,
                         char *err, size_t errlen);

#endif
