/*
 * backend.h — the one ABI every compute backend implements (CPU now; CUDA builds against this same header).
 *
 * A backend is a table of ops over plain views. Two kinds of memory meet here:
 *   - weights (moet_weight data, norm and bias vectors): host memory owned by the model (the mapped file or its
 *     copies), immutable while the backend lives; a device backend mirrors each one on first use (the GPU is a cache
 *     of the model), or takes it as-is when it already lies in the backend's memory (synthetic models);
 *   - activations, KV cache, token ids and positions: backend memory from alloc(), moved with upload()/download().
 *     The KV cache is paged (kv_page.h): ops that read or write it take a moet_kv_ref (a layer's pools and a
 *     sequence's block table) and address token position p through moet_kv_row.
 * Ops are the units a fused GPU kernel would cover: the whole MoE block (route, top-k, experts, combine) is one op,
 * so a backend runs it without a host round trip. Nothing that changes from one decode step to the next is an op
 * argument: token ids and positions are read from backend memory, so a step's op sequence can be recorded once and
 * replayed (graph_run; CUDA graphs).
 *
 * Threading: a backend instance is used by one thread at a time (the session evaluating, or the server's scheduler).
 */
#ifndef MOET_BACKEND_H
#define MOET_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/kv_page.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A 2-D weight: rows × cols elements of `type`, row r at data + r * row_bytes. out = x · Wᵀ (HF Linear layout). */
typedef struct {
    const void *data;
    int32_t type;
    int64_t rows, cols;
    size_t row_bytes;
    /* Per-matrix quantization parameters (quant/blocks.h): the 2-bit formats' scale base and beta, NVFP4's tensor
     * scale. rotated: the matrix is stored as W·R (R = moet_rotate_row(seed)), so ops multiply it with x·R. */
    float qscale, qbeta;
    uint32_t rot_seed;
    int32_t rotated;
    /* MOET_TYPE_F8_E4M3 only: the f32 scales of 128 x 128 blocks, row r's at bscale + (r / 128) * bscale_ld (one per
     * 128 columns); host memory (the checkpoint's weight_scale_inv) */
    const float *bscale;
    int64_t bscale_ld;
} moet_weight;

/* The rotary embedding of a model's attention (rope, attn_prep, attn_fused, attn_rows): rotate-half (NeoX/HF form)
 * over the first `dim` dims of each head, the rest passing. Pair i (elements i and i + dim/2) of a token at position
 * p turns by angle = f32(p) * inv_freq[i] (an f32 product); cos and sin of it are rounded to f32, then multiplied by
 * attn_factor in f32 (exact when it is 1), as transformers' rotary embeddings compute them. inv_freq is the model's
 * (model/rope.c: the default (f32)(1 / theta^(2i/dim)), or YaRN's blend); a backend may copy the struct by value into
 * its kernels' arguments, so it holds the table, not a pointer. */
#define MOET_ROPE_MAX_FREQ 128 /* dim <= 256 */
typedef struct {
    int32_t dim;
    float attn_factor;
    float inv_freq[MOET_ROPE_MAX_FREQ];
} moet_rope;

/* Router scoring (moet_moe_args.scoring): SOFTMAX over all experts, top-k (Qwen3-MoE, Mixtral); SIGMOID with a
 * bias for the choice and group-limited top-k (DeepSeek-V3, GLM-4.5: route_ref.h is its reference); TOPK_SOFTMAX:
 * the K largest logits, weighted by the softmax over those K alone (gpt-oss: route_ref.h). */
enum { MOET_ROUTER_SOFTMAX = 0, MOET_ROUTER_SIGMOID = 1, MOET_ROUTER_TOPK_SOFTMAX = 2 };
enum { MOET_EXPERT_HOME_MAPPED = 0, MOET_EXPERT_HOME_PINNED = 1 };

typedef struct {
    const float *x;            /* [n_tok][hidden] normed input */
    int64_t n_tok, hidden, ffn;
    const moet_weight *router; /* [n_experts × hidden] */
    int32_t n_experts, n_used;
    int32_t scoring;           /* MOET_ROUTER_* */
    int32_t norm_topk;         /* renormalise the chosen weights to sum 1 */
    /* MOET_ROUTER_SIGMOID only (route_ref.h): the choice bias [n_experts] (host memory, NULL: none), the expert
     * groups and how many of them a token keeps, and the factor the weights are multiplied by at the end */
    const float *router_bias;
    int32_t n_group, topk_group;
    float route_scale;
    const moet_weight *gate, *up, *down; /* arrays of n_experts: gate/up [ffn × hidden], down [hidden × ffn] */
    /* gpt-oss (NULL / 0 otherwise; host memory): the router's bias [n_experts], added to its logits before anything
     * else; the experts' biases, gate_b / up_b [n_experts][ffn] and down_b [n_experts][hidden], added to each
     * product; and the clamped SwiGLU (swiglu_limit > 0): g = min(g, limit), u = clamp(u, -limit, limit),
     * act = (u + 1) g sigmoid(1.702 g), in place of silu(g) u. */
    const float *router_lbias;
    const float *gate_b, *up_b, *down_b;
    float swiglu_limit;
    /* The FP4 delta (a delta pack's residuals, NVFP4, each with its own rotation flag): NULL, or arrays of n_experts
     * matrices shaped as gate/up/down, and then expert e's matrices are gate[e] + dgate[e] (and so on), never
     * materialised: each product is the base's (mul_mat) with the delta's added (mul_mat_acc), in that order. */
    const moet_weight *dgate, *dup, *ddown;
    /* The delta on the picks that carry the token's weight (docs/quality.md): with dgate set, pick j of a token runs
     * on base + delta only where moet_delta_pick(its K weights, j, delta_pick) holds, on the base alone otherwise;
     * delta_pick <= 0: every pick (bit for bit the delta on every pick). */
    float delta_pick;
    int64_t *delta_count;      /* host memory, NULL normally: += the picks that ran with the delta [0] and all the
                                * op's picks [1]; backends without it leave it untouched */
    int32_t *topk_ids;         /* out: [n_tok][n_used], in descending weight order (SIGMOID: descending choice score) */
    float *topk_w;             /* out: [n_tok][n_used] */
    float *y;                  /* out: [n_tok][hidden]; may equal x when norm_w is set (the residual stream) */
    /* The block's pre-norm, fused (norm_w != NULL): x is the raw residual, the block runs on
     * h = rms_norm(x, eps) · norm_w, which is also written to h ([n_tok][hidden], backend memory). */
    const float *norm_w;
    float eps;
    float *h;
    int32_t accumulate;        /* y += the block's output (the residual add, fused) instead of y = it */
    void *scratch;             /* moe_scratch_bytes(...) bytes from alloc() */
    /* Calibration (host memory, NULL normally): per expert, += x x^T of gate/up inputs [E][hidden][hidden], of down
     * inputs [E][ffn][ffn], and the routed token count [E]. Backends without it leave them untouched. */
    double *calib_in, *calib_down;
    int64_t *calib_count;
    /* Router statistics (host memory, NULL normally: the gate study): per token, route_stats[2 t] = the margin of the
     * routing (the K-th pick's probability minus the best unpicked expert's) and route_stats[2 t + 1] = the entropy
     * of the router's softmax (nats). Backends without it leave them untouched. */
    float *route_stats;
    /* The expert cache's prefetch (NULL: none): the next MoE layer's router, pre-norm weights and expert array. A
     * backend with a cache may route y (this block's output stream) through them and fetch the experts it guesses
     * before that layer asks (DESIGN.md 5). Never changes y. */
    const moet_weight *next_router;
    const float *next_norm_w;
    const moet_weight *next_gate;
    const float *next_router_bias; /* MOET_ROUTER_SIGMOID: the next layer's choice bias (host memory, or NULL) */
} moet_moe_args;

/* Whether pick k of a token whose K routing weights are w (as topk_w holds them) gets the delta: its weight is at
 * least r times the mean of the K (w[k] K >= r sum_j w[j], the sum in order j = 0..K-1, f32). Relative to the mean so
 * that one r means the same for a top-4 and a top-8 router, and for weights that are not renormalised. r <= 0: all.
 * Every backend decides with this function, so they pick the same experts. */
MOET_HD int moet_delta_pick(const float *w, int32_t K, int32_t k, float r) {
    if (!(r > 0.0f)) return 1;
    float s = 0.0f;
    for (int32_t j = 0; j < K; j++) s += w[j];
    return w[k] * (float)K >= r * s;
}

typedef struct {
    const float *q;            /* [n_tok][n_heads * head_dim], already normed and rotated */
    moet_kv_ref kv;            /* the layer's cache (kv_page.h); positions 0 .. pos[t] valid for query t */
    const int32_t *pos;        /* backend memory [n_tok]: query t is at position pos[t] and sees keys 0..pos[t] */
    int64_t n_tok;
    int32_t n_heads, n_kv, head_dim, n_ctx;
    float scale;
    /* gpt-oss (NULL / 0 otherwise): per-head sink logits [n_heads] (host memory: a logit every row's softmax
     * includes, whose value is dropped), and a sliding window: query t sees keys pos[t] - window < j <= pos[t] */
    const float *sinks;
    int32_t window;
    float *out;                /* [n_tok][n_heads * head_dim] */
    void *scratch;             /* attn_scratch_bytes(n_ctx) bytes */
} moet_attn_args;

typedef struct moet_backend moet_backend;

typedef struct {
    const char *name;
    void (*destroy)(moet_backend *be);
    /* What runs the ops, for bench tables and logs ("NVIDIA H200", "x86-64, 2 threads"). */
    const char *(*device_name)(moet_backend *be);
    /* 0 while healthy; otherwise MOET_EDEVICE (-7) with the first failure (a CUDA error) in err. Ops return nothing:
     * a failing backend keeps its first error, and callers check here after each step. */
    int (*status)(moet_backend *be, char *err, size_t errlen);
    /* The weight at host (a moet_weight's data, a norm or bias vector) is about to be freed or rewritten: drop any
     * device copy of it, so a later weight at the same address is mirrored afresh. */
    void (*forget)(moet_backend *be, const void *host);
    /* Backend memory, zero-filled; NULL when out of memory. */
    void *(*alloc)(moet_backend *be, size_t bytes);
    void (*release)(moet_backend *be, void *p);
    void (*copy)(moet_backend *be, void *dst, const void *src, size_t bytes);     /* backend -> backend */
    void (*upload)(moet_backend *be, void *dst, const void *src, size_t bytes);   /* host -> backend */
    void (*download)(moet_backend *be, void *dst, const void *src, size_t bytes); /* backend -> host, waits */
    /* Fills rows × cols elements of `type` at p (backend memory) with deterministic pseudo-random values (weights of
     * synthetic models): floats ~ N(0, scale), block formats with random codes and scales near `scale`. */
    void (*fill_random)(moet_backend *be, void *p, int32_t type, int64_t rows, int64_t cols, float scale,
                        uint64_t seed);
    /* Runs step(ctx), a sequence of this backend's ops. A backend may record it the first times it sees `key` and
     * replay the record later (the step must then read everything that varies from backend memory); 0 on success. */
    int (*graph_run)(moet_backend *be, uint64_t key, void (*step)(void *ctx), void *ctx);
    /* Drops every record whose key has owner in its top 32 bits (a session going away owns its records). */
    void (*graph_release)(moet_backend *be, uint32_t owner);
    /* y[i] = row ids[i] of w widened to f32 (embedding lookup); ids in backend memory. */
    void (*get_rows)(moet_backend *be, const moet_weight *w, const int32_t *ids, int64_t n, float *y);
    /* y[r][i] += x[r][i] for n rows of dim; x == NULL adds nothing. bias != NULL: y[r][i] += bias[i] instead. */
    void (*add)(moet_backend *be, float *y, const float *x, const float *bias, int64_t n, int64_t dim);
    /* y[n][w->rows] = x[n][w->cols] · Wᵀ */
    void (*mul_mat)(moet_backend *be, const moet_weight *w, const float *x, int64_t n, float *y);
    /* y[n][w->rows] += x · Wᵀ (+ bias): a projection added onto the residual stream (the product rounded to f32
     * first, then the bias (w->rows floats, NULL: none) added, then the sum added to y: the same roundings as mul_mat
     * into a temporary, add of the bias, add onto y). */
    void (*mul_mat_acc)(moet_backend *be, const moet_weight *w, const float *x, int64_t n, const float *bias,
                        float *y);
    /* A block's pre-norm and its projections, fused: h = rms_norm(x) · norm_w for n rows of dim (written to h), then
     * y[i] = h · w[i]ᵀ (+ bias[i]) for i < nw (nw <= 4 matrices of dim columns: q, k, v; or lm_head). Exactly
     * rms_norm, then mul_mat each, then add of each bias (bias NULL, or nw entries each NULL or w[i]->rows floats:
     * the q/k/v biases of GLM-4.5 and gpt-oss); a backend may do it in one kernel. h must not alias x or any y[i]. */
    void (*norm_mul_mat)(moet_backend *be, const float *x, const float *norm_w, float eps, int64_t n, int64_t dim,
                         float *h, int32_t nw, const moet_weight *const *w, const float *const *bias, float *const *y);
    /* y[i] = x[i] / rms(x[i]) * w, for n rows of dim; y may equal x. */
    void (*rms_norm)(moet_backend *be, const float *x, const float *w, int64_t n, int64_t dim, float eps, float *y);
    /* Rotary embedding (moet_rope), in place on n_tok rows of n_heads × head_dim, token t at position pos[t]
     * (backend memory). */
    void (*rope)(moet_backend *be, float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim, const moet_rope *rp,
                 const int32_t *pos);
    /* The KV cache write: pool row moet_kv_row(blocks, shift, pos[t]) = src row t, for n_tok rows of dim floats,
     * stored as the pool's elements (type: MOET_KVE_*, kv_page.h; f16 rounded to nearest even). */
    void (*kv_store)(moet_backend *be, void *pool, int32_t type, const int32_t *blocks, int32_t shift, const float *src,
                     const int32_t *pos, int64_t n_tok, int64_t dim);
    /* The attention inputs, fused: per-head rms_norm of q (q_norm) and k (k_norm; either NULL: none) over head_dim,
     * RoPE of both (rp, positions pos[t]), in place; then k and v row t go to position pos[t] of kv.
     * Exactly rms_norm, rope and kv_store (kv->k, then kv->v) in that order. */
    void (*attn_prep)(moet_backend *be, float *q, float *k, const float *v, int64_t n_tok, int32_t n_heads,
                      int32_t n_kv, int32_t head_dim, const float *q_norm, const float *k_norm, float eps,
                      const moet_rope *rp, const int32_t *pos, const moet_kv_ref *kv);
    void (*attention)(moet_backend *be, const moet_attn_args *a);
    /* MLA (DeepSeek-V3, Kimi-K2) attention inputs in the form attn_prep takes, for n tokens of nh heads, hd = rope +
     * nope dims a q/k head:
     *   q  [n][nh][nope + rope] in place -> [n][nh][hd], the head's rope dims first: [q_pe', q_nope];
     *   k  [n][nh][hd] = [kpe', k_nope], from kpe [n][rope] (the one rotary key every head shares);
     *   v  [n][nh][hd] = [v, 0 .. 0] (hd - vd zeros: v padded to the q/k head dim, vd <= hd),
     * where kvb [n][nh][nope + vd] holds each head's k_nope then v (kv_b_proj's output), and x' is x de-interleaved
     * (x0, x2, .., x1, x3, ..) when interleave, else x as it is. A rotate-half RoPE over the first `rope` dims is then
     * transformers' rotation of the rope dims (apply_rotary_pos_emb_interleave when interleaved), and moving them
     * first changes no q . k. Copies only: every backend gives the same bits. */
    void (*mla_prep)(moet_backend *be, float *q, const float *kvb, const float *kpe, int64_t n, int32_t nh,
                     int32_t nope, int32_t rope, int32_t vd, int32_t interleave, float *k, float *v);
    /* y [n][nh][w] = the first w of each head of x [n][nh][xd] (w <= xd; MLA's attention output, v padded to the q/k
     * head dim, back to v_head_dim for o_proj). y must not overlap x. */
    void (*heads_narrow)(moet_backend *be, const float *x, int64_t n, int32_t nh, int32_t xd, int32_t w, float *y);
    /* MLA with the latent cache ("absorbed"; optional: NULL, and the session runs mla_prep + attention on full keys
     * and values instead). For n tokens at positions pos[t] (backend memory):
     *   the cache row of token t (kv->k; kv->v unused), rope + kvlr floats: [k_pe', c] with k_pe' = kpe[t]
     *     de-interleaved when asked, then rotated (rp), and c = ckv[t] (kv_a_layernorm'ed);
     *   per head h: q_pe' likewise from q[t][h][nope ..]; q_lat = W_UK[h]^T q[t][h][0 .. nope) (kvlr);
     *     s_j = scale (q_pe' . k_pe'_j + q_lat . c_j) for keys j <= pos[t]; o_lat = softmax(s) . c;
     *     out[t][h] = W_UV[h] o_lat (vd floats),
     * W_UK[h] / W_UV[h] being head h's nope / vd rows of kv_b [nh (nope + vd) x kvlr]. The same function as
     * mla_prep, attn_prep, attention and heads_narrow, in another order of sums; the cache holds 576 floats a token
     * and layer at DeepSeek-V3's shape instead of 2 x 128 x 192. */
    void (*mla_attn)(moet_backend *be, const float *q, const float *ckv, const float *kpe, const moet_weight *kv_b,
                     int64_t n, int32_t nh, int32_t nope, int32_t rope, int32_t vd, int32_t kvlr, int32_t interleave,
                     const moet_rope *rp, const int32_t *pos, const moet_kv_ref *kv, float scale, float *out);
    /* Optional (NULL: the caller composes). attn_prep(q, k, v, a->n_tok, a->n_heads, a->n_kv, a->head_dim, q_norm,
     * k_norm, eps, rp, a->pos, &a->kv) then attention(a), where a->q == q: exactly that composition,
     * except that k's contents afterwards are unspecified (the cache holds the rotated keys). A backend may run it
     * as one kernel (the CUDA backend does for one token: each decode kernel costs a few microseconds of latency
     * however little it moves). */
    void (*attn_fused)(moet_backend *be, float *q, float *k, const float *v, const float *q_norm, const float *k_norm,
                       float eps, const moet_rope *rp, const moet_attn_args *a);
    size_t (*attn_scratch_bytes)(moet_backend *be, int32_t n_ctx);
    /* Dense SwiGLU MLP added onto the residual stream: y += down(silu(gate h) * up h), the product rounded to f32
     * first (as mlp into a temporary, then add). h = x where norm_w is NULL (GLM's and DeepSeek's shared expert on
     * the MoE block's normed input), else h = rms_norm(x) · norm_w written to h (a dense layer's pre-norm, exactly
     * norm_mul_mat's). scratch: 2 * n * ffn floats. y may be x where norm_w is given (x is read by the pre-norm
     * alone, before the products); otherwise y must not alias x; never h or scratch. */
    void (*mlp)(moet_backend *be, const moet_weight *gate, const moet_weight *up, const moet_weight *down,
                const float *x, const float *norm_w, float eps, float *h, int64_t n, float *scratch, float *y);
    void (*moe)(moet_backend *be, const moet_moe_args *a);
    size_t (*moe_scratch_bytes)(moet_backend *be, int64_t n_tok, int64_t hidden, int64_t ffn, int32_t n_experts,
                                int32_t n_used);
    /* Batched decode's attention: n = a->n_tok rows, row r one token of its own sequence. Exactly, for each r,
     * attn_prep(q + r Dq, k + r Dkv, v + r Dkv, 1, ..., a->pos + r, &rows[r]) then attention over rows[r] into
     * a->out + r Dq (Dq = n_heads head_dim, Dkv = n_kv head_dim); of a->kv only its type is read: every row's
     * pools hold elements of that type (the host picks the kernel by it); a->q == q. rows is backend
     * memory (n moet_kv_ref: each row's pools and block table): what differs between steps is in backend memory,
     * so one recorded step serves every set of n sequences. Returns 0 when done (errors: status), nonzero when it
     * declines the shape before doing anything (the caller then composes per row); whether it declines depends
     * only on the shape (heads, head_dim, rp->dim). Optional: NULL means always declined. */
    int (*attn_rows)(moet_backend *be, float *q, float *k, const float *v, const float *q_norm, const float *k_norm,
                     float eps, const moet_rope *rp, const moet_kv_ref *rows, const moet_attn_args *a);
    /* Sampling candidates: the k largest of each of n rows of `vocab` floats (logits, row r at x + r vocab), in the
     * order of topk_key.h (larger first, equal values by lower index, NaN last): ids[r k + i] and vals[r k + i] =
     * x[r][ids[r k + i]] (backend memory). 1 <= k <= MOET_TOPK_MAX, k <= vocab; scratch: topk_scratch_bytes(n,
     * vocab, k) bytes of backend memory. Exact (values are copied, the order is total), so every backend gives the
     * same bits; reads only backend memory, so it records into a step like the other ops. lz (NULL: not wanted):
     * lz[r] = log sum_j exp(x[r][j] - max_j x[r][j]), so the row's top-1 softmax probability is exp(-lz[r]) (the delta
     * gate's confidence) without the row leaving the device; summed in double, rounded to float, its bits may
     * differ between backends (summation order). */
    void (*topk)(moet_backend *be, const float *x, int64_t n, int64_t vocab, int32_t k, void *scratch, int32_t *ids,
                 float *vals, float *lz);
    size_t (*topk_scratch_bytes)(moet_backend *be, int64_t n, int64_t vocab, int32_t k);
    /* The expert cache (backend/expert_cache.h; optional: NULL means every expert is always resident).
     * expert_cache: at most n_slots routed experts resident at once (0: all); an MoE op that routes to a
     * non-resident expert leaves its contribution out and records the miss. home: where the others wait,
     * MOET_EXPERT_HOME_MAPPED (the model's memory as it is: a mapped pack, so the page cache or the file) or
     * MOET_EXPERT_HOME_PINNED (a device backend copies them to pinned host memory in the layout its kernels read,
     * so a fetch is one DMA; a host backend ignores it). expert_cache_resolve, after every step:
     * 0 when the step missed nothing; > 0 experts fetched, and the caller runs the step again (it rewrites the same
     * KV rows); < 0 when the slots cannot hold one step's experts. expert_cache_stats (5 counts,
     * expert_cache.h's moet_ecache_counts): experts fetched, evicted, steps run again, expert uses checked (a layer's
     * expert a pass), uses that found it not resident. */
    int (*expert_cache)(moet_backend *be, int64_t n_slots, int32_t home);
    int64_t (*expert_cache_resolve)(moet_backend *be);
    void (*expert_cache_stats)(moet_backend *be, int64_t out[5]);
    /* Device memory free and in all (bytes), for sizing the expert cache (--expert-slots auto); NULL for a host
     * backend, whose experts already lie in the memory it computes from. 0 on success. */
    int (*mem_info)(moet_backend *be, uint64_t *free_bytes, uint64_t *total_bytes);
} moet_backend_ops;

struct moet_backend {
    const moet_backend_ops *ops;
};

/* The CPU reference backend (pthreads across rows). n_threads <= 0: all cores. */
moet_backend *moet_backend_cpu_create(int n_threads);
int moet_backend_cpu_threads(const moet_backend *be);

/* The CUDA backend on GPU `device` (cuda_backend.cu; a stub that fails when moet is built without CUDA).
 * NULL with the reason in err when there is no such GPU or the build has no CUDA. */
moet_backend *moet_backend_cuda_create(int device, char *err, size_t errlen);
/* Number of CUDA GPUs this process can use (0 without CUDA or without a GPU). */
int moet_backend_cuda_device_count(void);
/* Registers a thread of one of the decode kernels whose CTAs must share an SM (the co-residency the decode step's
 * overlap depends on, docs/performance.md "Stop 32"): "router" (k_tc_router, 1 token), "router_split" (its split-row
 * form, k_tc_router_split), "down" (k_tc_down, integer form, 256-column chunks), "mv16s" (k_mv16s, bf16,
 * pre-normed). -1: unknown name, no CUDA or no GPU. */
int moet_backend_cuda_kernel_regs(const char *kernel);
/* Launches so far in this process of a kernel that only some shapes take, so a test can tell that it ran:
 * "st_gate_up", "st_down" (moe_st.cu's streamed decode kernels). -1: unknown name or no CUDA. */
long long moet_backend_cuda_launches(const char *kernel);


#ifdef __cplusplus
}
#endif
#endif
