/*
 * expert_cache.cu — the GPU as a cache of the routed experts (DESIGN.md 5, docs/design.md "How the expert cache
 * fits"): n_slots experts in device memory, the rest where the model keeps them (its mapped pack: host RAM, or the
 * NVMe file behind the page cache; synthetic models' device buffers), fetched on a miss and the step replayed.
 *
 * Why no kernel changes: a cached layer's expert table (cu_expert_table, the one every MoE kernel reads after the
 * routing) points a resident expert at its slot and a missing one at a stand-in slot of zeros that is never handed
 * out. A step that routed to a missing expert computes garbage from it, finite and harmless, and is run again: the
 * session replays every step whose experts were not all resident (runtime/session.c, step_run), so only a step that
 * found them all survives, and that step read the same bytes as a resident forward through the same kernels. So the
 * output is bit-identical to the model without a cache, whatever the cache did, and the MoE kernels stay as they are.
 *
 * What a step records: after each cached layer's MoE launches, k_ecache_mark sets one byte per expert its picks
 * routed to (a row of `used` per layer: no atomics, every writer writes 1). After the step the host reads the rows
 * (one small copy; the step's logits copy synchronises anyway), replays them in layer order into the shared host
 * protocol (moet_ecache_use: the first missing layer's misses are needed, the later layers' a guess), and
 * moet_ecache_resolve picks what to fetch and evict; ec_fetch copies an expert's three matrices into its slot,
 * rewrites them into the tiled layout the kernels read (the same repack the mirror path runs at upload), and
 * repoints its table entries; the evicted expert's entries go back to the stand-in. Every copy is on the backend's
 * stream before the replay, and the tables stay at their device addresses, so recorded graphs replay unchanged.
 *
 * The delta (W2 base + NVFP4 residuals): an expert's residuals live in pool 1 under the slot index its base holds
 * in pool 0: one residency decision for both, so a cached expert is always whole. Pool 1 is made at the first delta
 * table (the gate may never turn the delta on), and the experts already resident get their residuals then.
 *
 * Where the other experts wait (expert_cache(..., home)): MAPPED, the model's memory as it is (a pack's mapping: the
 * page cache, or the NVMe file behind it); a fetch copies the three matrices from pageable pages (the driver stages
 * them, synchronising the stream) and rewrites them in the slot. PINNED: at a layer's first step its experts are
 * rewritten once on the device and kept as slot images in mapped pinned host RAM, so a fetch is one asynchronous
 * DMA, and more: the device can read that memory itself, so a missing expert's entries point at its pinned image
 * instead of the stand-in and the kernels read it over the bus (the same bytes: the same result). Every step then
 * completes (the protocol's direct mode: no replay, no step too large for the slots); after it, the experts it read
 * from host memory are fetched into slots for the steps to come (moet_ecache_settle).
 *
 * Not here yet (docs/design.md): the prefetch guess on the GPU (the CPU backend's moet_ecache_hint), LRU+frequency.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"
#include "backend/expert_cache.h"
#include "core/util.h"
#include "moet.h"
#include "quant/types.h"

#define EC_ALIGN 256

/* used[ids[i]] = 1 for the n picks of one layer (ids < E; anything else is ignored). */
__global__ void k_ecache_mark(const int32_t *__restrict__ ids, int64_t n, int32_t E, uint8_t *__restrict__ used) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const int32_t e = __ldcg(ids + i);
        if ((uint32_t)e < (uint32_t)E) used[e] = 1;
    }
}

static moet_ecache *ec_of(cu_backend *c) { return (moet_ecache *)c->ecache.ec; }

static size_t ec_round(size_t b) { return (b + EC_ALIGN - 1) / EC_ALIGN * EC_ALIGN; }

/* The device address of matrix k in slot s of pool p (s < 0: the stand-in). */
static uint8_t *ec_addr(cu_ecache *ce, int p, int64_t s, int k) {
    return ce->pool[p] + (size_t)(s < 0 ? ce->n_slots : s) * ce->slot_bytes[p] + ce->off[p][k];
}

/* Where the kernels read matrix k of expert e of t: slot s (s >= 0), else its pinned home image (direct mode), else
 * the stand-in. */
static uint8_t *ec_entry(cu_ecache *ce, const cu_expert_table *t, int32_t e, int64_t s, int k) {
    const int p = t->cached - 1;
    if (s < 0 && t->home_dev) return t->home_dev + (size_t)e * ce->slot_bytes[p] + ce->off[p][k];
    return ec_addr(ce, p, s, k);
}

/* Points expert e's three entries of t's host copy at slot s (s < 0: where a missing expert is read); ec_flush
 * uploads. */
static void ec_point(cu_backend *c, cu_expert_table *t, int32_t e, int64_t s) {
    for (int k = 0; k < 3; k++) t->host_table[(size_t)e * 3 + k].w = ec_entry(&c->ecache, t, e, s, k);
    t->ec_dirty = 1;
}

/* Uploads every table ec_point changed, one copy a table (E x 96 bytes) rather than one per expert: a copy from
 * pageable memory synchronises the stream first. It returns once the source is staged, so host tables may change
 * right after. */
static int ec_flush(cu_backend *c) {
    for (size_t i = 0; i < c->n_etabs; i++) {
        cu_expert_table *t = &c->etabs[i];
        if (!t->cached || !t->ec_dirty) continue;
        t->ec_dirty = 0;
        if (CU_CHECK(c, cudaMemcpyAsync(t->table, t->host_table, (size_t)t->n_experts * 3 * sizeof(cu_mat),
                                        cudaMemcpyHostToDevice, c->stream)))
            return -1;
    }
    return 0;
}

static int ec_tmp(cu_backend *c, size_t bytes) {
    cu_ecache *ce = &c->ecache;
    if (bytes <= ce->tmp_bytes) return 0;
    if (ce->tmp && (CU_CHECK(c, cudaStreamSynchronize(c->stream)) || CU_CHECK(c, cudaFree(ce->tmp)))) return -1;
    ce->tmp = NULL;
    ce->tmp_bytes = 0;
    if (CU_CHECK(c, cudaMalloc(&ce->tmp, bytes))) return -1;
    ce->tmp_bytes = bytes;
    return 0;
}

/* Copies expert e's matrices of table t (t->w3) into the slot-shaped device memory at dst (a slot of t's pool, or
 * the stage) and rewrites them as the kernels read them. */
static int ec_copy(cu_backend *c, cu_expert_table *t, int32_t e, uint8_t *dst) {
    cu_ecache *ce = &c->ecache;
    const int p = t->cached - 1;
    for (int k = 0; k < 3; k++) {
        const moet_weight *w = &t->w3[k][e];
        uint8_t *d = dst + ce->off[p][k];
        const size_t bytes = (size_t)w->rows * w->row_bytes;
        /* cudaMemcpyDefault: the model's host pages, or a synthetic model's device buffer */
        if (CU_CHECK(c, cudaMemcpyAsync(d, w->data, bytes, cudaMemcpyDefault, c->stream))) return -1;
        if (!t->tiled) continue;
        if ((p == 0 ? cu_q2_tile_repack : cu_nv_tile_repack)(c, d, w->rows, w->cols, w->row_bytes, ce->tmp)) return -1;
    }
    return 0;
}

/* Expert e of t into slot s: one DMA from its pinned image, or the copy and rewrite from the model's memory. */
static int ec_load(cu_backend *c, cu_expert_table *t, int32_t e, int64_t s) {
    cu_ecache *ce = &c->ecache;
    const int p = t->cached - 1;
    uint8_t *slot = ec_addr(ce, p, s, 0); /* off[p][0] is 0: the slot's start */
    if (!t->home) return ec_copy(c, t, e, slot);
    return CU_CHECK(c, cudaMemcpyAsync(slot, t->home + (size_t)e * ce->slot_bytes[p], ce->slot_bytes[p],
                                       cudaMemcpyHostToDevice, c->stream));
}

/* The pinned home of t's experts: each rewritten once on the device (through the stage) and kept as a slot image. */
static int ec_home(cu_backend *c, cu_expert_table *t) {
    cu_ecache *ce = &c->ecache;
    const size_t sb = ce->slot_bytes[t->cached - 1];
    size_t total;
    if (__builtin_mul_overflow((size_t)t->n_experts, sb, &total)) {
        cu_fail(c, cudaErrorMemoryAllocation, "expert cache: a layer's pinned home overflows", __FILE__, __LINE__);
        return -1;
    }
    if (sb > ce->stage_bytes) {
        if (ce->stage && (CU_CHECK(c, cudaStreamSynchronize(c->stream)) || CU_CHECK(c, cudaFree(ce->stage)))) return -1;
        ce->stage = NULL;
        ce->stage_bytes = 0;
        if (CU_CHECK(c, cudaMalloc(&ce->stage, sb))) return -1;
        ce->stage_bytes = sb;
    }
    void *dp = NULL;
    if (cudaHostAlloc(&t->home, total, cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&dp, t->home, 0) != cudaSuccess) {
        cudaGetLastError();
        if (t->home) cudaFreeHost(t->home);
        t->home = NULL;
        char what[160];
        snprintf(what, sizeof what, "expert cache: %.2f GiB of pinned host memory for a layer's experts",
                 (double)total / (1u << 30));
        cu_fail(c, cudaErrorMemoryAllocation, what, __FILE__, __LINE__);
        return -1;
    }
    t->home_dev = (uint8_t *)dp;
    for (int32_t e = 0; e < t->n_experts; e++) /* stream order: each image leaves the stage before the next arrives */
        if (ec_copy(c, t, e, ce->stage) ||
            CU_CHECK(c, cudaMemcpyAsync(t->home + (size_t)e * sb, ce->stage, sb, cudaMemcpyDeviceToHost, c->stream)))
            return -1;
    return CU_CHECK(c, cudaStreamSynchronize(c->stream));
}

static cu_expert_table *ec_table(cu_backend *c, const void *key, int delta) {
    for (size_t i = 0; i < c->n_etabs; i++) {
        cu_expert_table *t = &c->etabs[i];
        if (delta ? t->cached == 2 && t->base_gate == key : t->cached == 1 && t->gate == key) return t;
    }
    return NULL;
}

/* moet_ecache's fetch: expert e of layer key into slot s (the protocol evicted whoever held it just before). */
static void ec_fetch(void *ctx, const void *key, int32_t e, int64_t s) {
    cu_backend *c = (cu_backend *)ctx;
    cu_ecache *ce = &c->ecache;
    if (c->err[0]) return;
    if (ce->owner_key[s]) { /* the expert leaving: back to the stand-in, base and residuals */
        for (int d = 0; d < 2; d++) {
            cu_expert_table *ot = ec_table(c, ce->owner_key[s], d);
            if (ot) ec_point(c, ot, ce->owner_e[s], -1);
        }
        ce->owner_key[s] = NULL;
    }
    for (int d = 0; d < 2; d++) {
        cu_expert_table *t = ec_table(c, key, d);
        if (!t) continue;
        if (ec_load(c, t, e, s)) return;
        ec_point(c, t, e, s);
    }
    ce->owner_key[s] = key;
    ce->owner_e[s] = e;
}

/* Lays out a slot of pool p for the shapes of host (E x 3 matrices of t->w3) and makes the pool; a later table
 * must fit the same layout. */
static int ec_pool(cu_backend *c, cu_expert_table *t, int p) {
    cu_ecache *ce = &c->ecache;
    int64_t mb[3];
    for (int k = 0; k < 3; k++) {
        const moet_weight *w = &t->w3[k][0];
        mb[k] = (int64_t)w->rows * (int64_t)w->row_bytes;
        for (int32_t e = 1; e < t->n_experts; e++)
            if ((int64_t)t->w3[k][e].rows * (int64_t)t->w3[k][e].row_bytes != mb[k]) {
                cu_fail(c, cudaErrorInvalidValue, "expert cache: a layer's experts of different sizes", __FILE__, __LINE__);
                return -1;
            }
    }
    if (ce->pool[p]) {
        for (int k = 0; k < 3; k++)
            if (mb[k] > ce->mat_bytes[p][k]) {
                cu_fail(c, cudaErrorInvalidValue, "expert cache: a layer's experts larger than the first cached layer's",
                        __FILE__, __LINE__);
                return -1;
            }
        return 0;
    }
    size_t off = 0;
    for (int k = 0; k < 3; k++) {
        ce->mat_bytes[p][k] = mb[k];
        ce->off[p][k] = off;
        off += ec_round((size_t)mb[k]);
    }
    ce->slot_bytes[p] = off;
    size_t total;
    if (__builtin_mul_overflow((size_t)ce->n_slots + 1, off, &total)) {
        cu_fail(c, cudaErrorMemoryAllocation, "expert cache: slots x slot size overflows", __FILE__, __LINE__);
        return -1;
    }
    if (cudaMalloc(&ce->pool[p], total) != cudaSuccess) {
        cudaGetLastError();
        ce->pool[p] = NULL;
        char what[160];
        snprintf(what, sizeof what, "expert cache: %lld slots of %.2f MiB (%s) do not fit the GPU",
                 (long long)ce->n_slots, (double)off / (1 << 20), p ? "delta residuals" : "experts");
        cu_fail(c, cudaErrorMemoryAllocation, what, __FILE__, __LINE__);
        return -1;
    }
    MOET_LOGI("expert cache: %lld slots of %.2f MiB (%s): %.2f GiB of GPU memory; the other experts %s",
              (long long)ce->n_slots, (double)off / (1 << 20), p ? "delta residuals" : "experts",
              (double)total / (1u << 30), ce->pinned ? "in pinned host RAM, read there when missing" : "copied from the "
              "model's memory on a miss");
    /* the stand-in's zeros (and the slots' until fetched: a step never reads a slot it did not fetch into) */
    if (CU_CHECK(c, cudaMemsetAsync(ce->pool[p], 0, total, c->stream))) return -1;
    size_t big = 0;
    for (int k = 0; k < 3; k++) big = (size_t)mb[k] > big ? (size_t)mb[k] : big;
    return ec_tmp(c, big);
}

extern "C" int cu_ecache_table(cu_backend *c, cu_expert_table *t, cu_mat *host) {
    cu_ecache *ce = &c->ecache;
    moet_ecache *ec = ec_of(c);
    const int p = t->cached - 1;
    if (ec_pool(c, t, p)) return -1;
    if (ce->pinned && ec_home(c, t)) {
        if (t->home) cudaFreeHost(t->home);
        t->home = t->home_dev = NULL;
        return -1;
    }
    t->host_table = host;
    if (p == 0) {
        if (!ce->used) {
            ce->E = t->n_experts;
            const size_t nb = (size_t)CU_EC_ROWS * (size_t)ce->E;
            if (CU_CHECK(c, cudaMalloc(&ce->used, nb)) || CU_CHECK(c, cudaMallocHost(&ce->used_host, nb)) ||
                CU_CHECK(c, cudaMemsetAsync(ce->used, 0, nb, c->stream)))
                return -1;
        }
        if (t->n_experts > ce->E || ce->n_rows >= CU_EC_ROWS) {
            cu_fail(c, cudaErrorInvalidValue, "expert cache: more experts a layer than the first layer, or too many layers",
                    __FILE__, __LINE__);
            return -1;
        }
        /* rows and the protocol's layers are made together, so row r is ec->layers[r] */
        if ((size_t)ce->n_rows != ec->n_layers || !moet_ecache_layer_of(ec, t->gate, t->n_experts)) {
            cu_fail(c, cudaErrorMemoryAllocation, "expert cache: layer bookkeeping", __FILE__, __LINE__);
            return -1;
        }
        t->ec_row = ce->n_rows++;
        for (int32_t e = 0; e < t->n_experts; e++)
            for (int k = 0; k < 3; k++) host[(size_t)e * 3 + k].w = ec_entry(ce, t, e, -1, k);
        return 0;
    }
    /* delta residuals: the experts of the base layer already resident get theirs now, in the same slot */
    moet_ecache_layer *bl = NULL;
    for (size_t i = 0; i < ec->n_layers && !bl; i++)
        if (ec->layers[i].key == t->base_gate && ec->layers[i].n == t->n_experts) bl = &ec->layers[i];
    for (int32_t e = 0; e < t->n_experts; e++) {
        const int64_t s = bl ? bl->slot[e] : -1;
        if (s >= 0 && ec_load(c, t, e, s)) return -1;
        for (int k = 0; k < 3; k++) host[(size_t)e * 3 + k].w = ec_entry(ce, t, e, s, k);
    }
    return 0;
}

extern "C" void cu_ecache_mark(cu_backend *c, const cu_expert_table *t, const int32_t *ids, int64_t n) {
    cu_ecache *ce = &c->ecache;
    if (c->err[0] || t->cached != 1) return;
    k_ecache_mark<<<1, 256, 0, c->stream>>>(ids, n, t->n_experts, ce->used + (size_t)t->ec_row * (size_t)ce->E);
    CU_LAUNCHED(c, "k_ecache_mark");
}

extern "C" void cu_ecache_forget(cu_backend *c, const cu_expert_table *t) {
    cu_ecache *ce = &c->ecache;
    if (t->cached == 1) {
        moet_ecache_layer_drop(ec_of(c), t->gate);
        for (int64_t s = 0; s < ce->n_slots; s++)
            if (ce->owner_key[s] == (const void *)t->gate) ce->owner_key[s] = NULL;
        cu_expert_table *dt = ec_table(c, t->gate, 1); /* its residuals' entries named those slots too */
        for (int32_t e = 0; dt && e < dt->n_experts; e++) ec_point(c, dt, e, -1);
        ec_flush(c);
    }
    free(t->host_table);
    if (t->home) cudaFreeHost(t->home);
}

extern "C" int cu_expert_cache(moet_backend *be, int64_t n_slots, int32_t home) {
    cu_backend *c = cu_of(be);
    cu_ecache *ce = &c->ecache;
    if (n_slots < 0 || (home != MOET_EXPERT_HOME_MAPPED && home != MOET_EXPERT_HOME_PINNED)) return MOET_EINVAL;
    if (n_slots == ce->n_slots && (!n_slots || (home == MOET_EXPERT_HOME_PINNED) == ce->pinned)) return MOET_OK;
    if (c->n_etabs || ce->n_slots) return MOET_EINVAL; /* once, before the first MoE op built a table */
    moet_ecache *ec = (moet_ecache *)calloc(1, sizeof *ec);
    ce->owner_key = (const void **)calloc((size_t)n_slots, sizeof(void *));
    ce->owner_e = (int32_t *)calloc((size_t)n_slots, sizeof(int32_t));
    if (!ec || !ce->owner_key || !ce->owner_e || moet_ecache_init(ec, n_slots)) {
        free(ec);
        free(ce->owner_key);
        free(ce->owner_e);
        ce->owner_key = NULL;
        ce->owner_e = NULL;
        return MOET_ENOMEM;
    }
    ce->ec = ec;
    ce->n_slots = n_slots;
    ce->pinned = home == MOET_EXPERT_HOME_PINNED;
    ec->direct = ce->pinned; /* a missing expert is read from its pinned image: every step completes */
    return MOET_OK;
}

extern "C" int64_t cu_expert_cache_resolve(moet_backend *be) {
    cu_backend *c = cu_of(be);
    cu_ecache *ce = &c->ecache;
    moet_ecache *ec = ec_of(c);
    if (!ce->n_slots || c->err[0]) return 0; /* a failed backend reports through status, not as a replay */
    if (ce->n_rows) {
        const size_t nb = (size_t)ce->n_rows * (size_t)ce->E;
        if (CU_CHECK(c, cudaMemcpyAsync(ce->used_host, ce->used, nb, cudaMemcpyDeviceToHost, c->stream)) ||
            CU_CHECK(c, cudaStreamSynchronize(c->stream)) ||
            CU_CHECK(c, cudaMemsetAsync(ce->used, 0, nb, c->stream)))
            return 0;
        /* in step order (rows were made at each layer's first MoE op, in the order the forward runs them) */
        for (int32_t r = 0; r < ce->n_rows; r++) {
            moet_ecache_layer *l = &ec->layers[r];
            if (!l->key) continue;
            const uint8_t *u = ce->used_host + (size_t)r * (size_t)ce->E;
            for (int32_t e = 0; e < l->n; e++)
                if (u[e]) moet_ecache_use(ec, l, e);
        }
    }
    const int64_t n = ec->direct ? (moet_ecache_settle(ec, ec_fetch, c), 0) : moet_ecache_resolve(ec, ec_fetch, c);
    ec_flush(c);
    return c->err[0] ? 0 : n;
}

extern "C" void cu_expert_cache_stats(moet_backend *be, int64_t out[5]) {
    moet_ecache *ec = ec_of(cu_of(be));
    if (ec) moet_ecache_counts(ec, out);
    else memset(out, 0, 5 * sizeof(int64_t));
}

extern "C" void cu_ecache_free(cu_backend *c) {
    cu_ecache *ce = &c->ecache;
    for (int p = 0; p < 2; p++) cudaFree(ce->pool[p]);
    cudaFree(ce->tmp);
    cudaFree(ce->stage);
    cudaFree(ce->used);
    if (ce->used_host) cudaFreeHost(ce->used_host);
    free(ce->owner_key);
    free(ce->owner_e);
    if (ce->ec) moet_ecache_free(ec_of(c));
    free(ce->ec);
    memset(ce, 0, sizeof *ce);
}
