/*
 * route_ref.h — the scalar reference of the sigmoid router with a bias and group-limited top-k (MOET_ROUTER_SIGMOID:
 * DeepSeek-V3, Kimi-K2, GLM-4.5), as transformers' DeepseekV3/Glm4Moe route_tokens_to_experts does it:
 *
 *   s_e      = sigmoid(logit_e)                          the weights come from these
 *   c_e      = s_e + bias_e                              the choice (e_score_correction_bias)
 *   group g  = experts [g E/G, (g+1) E/G); its score is the sum of its two largest c_e
 *   keep the topk_group best groups; every expert outside them gets c_e = 0.0 (masked_fill 0.0, not -inf: an
 *            expert of a dropped group can still be picked over a kept one whose biased score is negative)
 *   picks    the K largest c_e (ties: the lower id), in that order
 *   weights  s_pick, divided by (their sum + 1e-20) when norm_topk, then times scale (routed_scaling_factor)
 *
 * The CPU backend runs this; the CUDA warp router (moe.cuh) must match it pick for pick. n_group <= 32 (configs
 * are refused beyond), E % n_group == 0, E / n_group >= 2 when n_group > 1 (the top-2 sum).
 */
#ifndef MOET_BACKEND_ROUTE_REF_H
#define MOET_BACKEND_ROUTE_REF_H

#include <math.h>
#include <stdint.h>

#define MOET_ROUTE_MAX_GROUPS 32

/* The K largest of E scores in descending order, ties to the lower id: every router's choice (the softmax routers
 * pick on probabilities, the sigmoid one on biased scores, gpt-oss's on logits). */
static inline void moet_route_pick(const float *score, int32_t E, int32_t K, int32_t *ids) {
    for (int32_t j = 0; j < K; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++) {
            int taken = 0;
            for (int32_t q = 0; q < j && !taken; q++) taken = ids[q] == e;
            if (!taken && (best < 0 || score[e] > score[best])) best = e;
        }
        ids[j] = best;
    }
}

/* c: E floats of scratch (the choice scores); ids / w: K entries out. */
static inline void moet_route_sigmoid_ref(const float *logits, const float *bias, int32_t E, int32_t K,
                                          int32_t n_group, int32_t topk_group, int32_t norm_topk, float scale,
                                          float *c, int32_t *ids, float *w) {
    for (int32_t e = 0; e < E; e++) c[e] = 1.0f / (1.0f + expf(-logits[e])) + (bias ? bias[e] : 0.0f);
    if (n_group > 1 && topk_group < n_group) {
        const int32_t gs = E / n_group;
        float gsc[MOET_ROUTE_MAX_GROUPS];
        for (int32_t g = 0; g < n_group; g++) {
            float a = -INFINITY, b = -INFINITY; /* the two largest of the group */
            for (int32_t e = g * gs; e < (g + 1) * gs; e++) {
                if (c[e] > a) { b = a; a = c[e]; }
                else if (c[e] > b) b = c[e];
            }
            gsc[g] = a + b;
        }
        for (int32_t g = 0; g < n_group; g++) {
            int32_t rank = 0; /* groups ahead of g: larger, or equal and of a lower index */
            for (int32_t o = 0; o < n_group; o++) rank += gsc[o] > gsc[g] || (gsc[o] == gsc[g] && o < g);
            if (rank >= topk_group)
                for (int32_t e = g * gs; e < (g + 1) * gs; e++) c[e] = 0.0f;
        }
    }
    float wsum = 0.0f;
    moet_route_pick(c, E, K, ids);
    for (int32_t j = 0; j < K; j++) {
        w[j] = 1.0f / (1.0f + expf(-logits[ids[j]]));
        wsum += w[j];
    }
    for (int32_t j = 0; j < K; j++) w[j] = (norm_topk ? w[j] / (wsum + 1e-20f) : w[j]) * scale;
}

/* MOET_ROUTER_TOPK_SOFTMAX (gpt-oss's GptOssTopKRouter): the K largest logits (ties: the lower id), in that order,
 * weighted by softmax over those K (f32, max subtracted). */
static inline void moet_route_topk_softmax_ref(const float *logits, int32_t E, int32_t K, int32_t *ids, float *w) {
    moet_route_pick(logits, E, K, ids);
    const float mx = logits[ids[0]];
    float sum = 0.0f;
    for (int32_t j = 0; j < K; j++) { w[j] = expf(logits[ids[j]] - mx); sum += w[j]; }
    for (int32_t j = 0; j < K; j++) w[j] /= sum;
}

#endif
