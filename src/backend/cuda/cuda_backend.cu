/*
 * cuda_backend.cu — the CUDA backend's lifecycle, memory, weight mirror, graphs and op table (the kernels live one
 * family per file: matmul.cu, elementwise.cu, attention.cu, moe.cu).
 *
 * The GPU as a cache of the model: weights stay host memory in the model (backend.h); the first op that touches a
 * weight copies it to device memory and remembers the pair, so later steps (and recorded graphs) read the copy.
 * Weights already in device memory (synthetic models) are used as they are. A layer's routed experts become one
 * device table of (pointer, parameters) that the MoE kernels index with the router's on-device choice: routing
 * never goes back to the host.
 *
 * Graphs: graph_run runs a step eagerly the first time it sees a key (every mirror is filled then), records it the
 * second time and replays the record from then on. Everything that varies between steps lives in device memory, so
 * a replay computes what an eager run would, bit for bit (kernels are deterministic: no atomics in any reduction).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"
#include "quant/blocks.h"
#include "quant/types.h"

extern "C" int cu_fail(cu_backend *c, cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    if (!c->err[0]) {
        const char *f = strrchr(file, '/');
        snprintf(c->err, sizeof c->err, "CUDA error in %s (%s:%d): %s", what, f ? f + 1 : file, line,
                 cudaGetErrorString(e));
        fprintf(stderr, "moet: %s\n", c->err);
    }
    return 1;
}

/* The largest shared split for kernel k, once a kernel (cuda_int.h); kernels seen are remembered by address (one
 * engine thread launches, as for the other caches here). */
void cu_carveout_max(cu_backend *c, const void *k) {
    static const void *seen[512];
    static int n_seen, off = -1;
    if (off < 0) {
        const char *e = getenv("MOET_CARVEOUT");
        off = e && e[0] == '0';
    }
    if (off) return;
    for (int i = 0; i < n_seen; i++)
        if (seen[i] == k) return;
    if (n_seen < (int)(sizeof seen / sizeof seen[0])) seen[n_seen++] = k;
    CU_CHECK(c, cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared));
}

/* ---- weight mirror ------------------------------------------------------------------------------------------- */

static size_t ptr_hash(const void *p) {
    uint64_t z = (uint64_t)(uintptr_t)p;
    z ^= z >> 33; z *= 0xff51afd7ed558ccdull; z ^= z >> 33;
    return (size_t)z;
}

static int mirror_grow(cu_backend *c) {
    size_t nc = c->cap_mirrors ? c->cap_mirrors * 2 : 1024;
    cu_mirror *nm = (cu_mirror *)calloc(nc, sizeof(cu_mirror));
    if (!nm) return -1;
    for (size_t i = 0; i < c->cap_mirrors; i++) {
        if (!c->mirrors[i].host) continue;
        size_t h = ptr_hash(c->mirrors[i].host) & (nc - 1);
        while (nm[h].host) h = (h + 1) & (nc - 1);
        nm[h] = c->mirrors[i];
    }
    free(c->mirrors);
    c->mirrors = nm;
    c->cap_mirrors = nc;
    return 0;
}

extern "C" const void *cu_weight(cu_backend *c, const void *host, size_t bytes) {
    if (!host) return NULL;
    if (c->cap_mirrors) {
        size_t h = ptr_hash(host) & (c->cap_mirrors - 1);
        while (c->mirrors[h].host) {
            if (c->mirrors[h].host == host && c->mirrors[h].bytes >= bytes) return c->mirrors[h].dev;
            if (c->mirrors[h].host == host) break; /* same address, larger view: mirror again below */
            h = (h + 1) & (c->cap_mirrors - 1);
        }
    }
    if (c->capturing) { /* a graph being recorded must not allocate: the eager first run fills every mirror */
        cu_fail(c, cudaErrorStreamCaptureUnsupported, "weight first used while recording a graph", __FILE__, __LINE__);
        return NULL;
    }
    if (2 * (c->n_mirrors + 1) > c->cap_mirrors && mirror_grow(c)) {
        cu_fail(c, cudaErrorMemoryAllocation, "mirror table", __FILE__, __LINE__);
        return NULL;
    }
    cu_mirror m = {host, NULL, bytes, 1, 0};
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, host) == cudaSuccess && at.type == cudaMemoryTypeDevice) {
        m.dev = (void *)host;
        m.owned = 0;
    } else {
        cudaGetLastError();
        if (CU_CHECK(c, cudaMalloc(&m.dev, bytes ? bytes : 16))) return NULL;
        if (CU_CHECK(c, cudaMemcpyAsync(m.dev, host, bytes, cudaMemcpyHostToDevice, c->stream)) ||
            CU_CHECK(c, cudaStreamSynchronize(c->stream)))
            return NULL;
    }
    return cu_mirror_put(c, &m) ? NULL : m.dev;
}

/* Enters m (its key m->host) into the table, replacing (and freeing, if owned) an entry of the same key. */
extern "C" int cu_mirror_put(cu_backend *c, const cu_mirror *m) {
    if (2 * (c->n_mirrors + 1) > c->cap_mirrors && mirror_grow(c))
        return cu_fail(c, cudaErrorMemoryAllocation, "mirror table", __FILE__, __LINE__);
    size_t h = ptr_hash(m->host) & (c->cap_mirrors - 1);
    while (c->mirrors[h].host && c->mirrors[h].host != m->host) h = (h + 1) & (c->cap_mirrors - 1);
    if (c->mirrors[h].host) { /* replaced by a larger view */
        if (c->mirrors[h].owned) cudaFree(c->mirrors[h].dev);
        c->n_mirrors--;
    }
    c->mirrors[h] = *m;
    c->n_mirrors++;
    return 0;
}

extern "C" const uint8_t *cu_weight_mat(cu_backend *c, const moet_weight *w) {
    if (w->type == MOET_TYPE_F8_E4M3) { /* block-scaled FP8 as a checkpoint stores it: no kernel reads it */
        cu_fail(c, cudaErrorNotSupported, "FP8 checkpoint weights: make a pack first (moet quantize), or --device cpu",
                __FILE__, __LINE__);
        return NULL;
    }
    return (const uint8_t *)cu_weight(c, w->data, (size_t)w->rows * w->row_bytes);
}

extern "C" cu_mirror *cu_mirror_of(cu_backend *c, const void *host) {
    if (!c->cap_mirrors || !host) return NULL;
    size_t h = ptr_hash(host) & (c->cap_mirrors - 1);
    while (c->mirrors[h].host) {
        if (c->mirrors[h].host == host) return &c->mirrors[h];
        h = (h + 1) & (c->cap_mirrors - 1);
    }
    return NULL;
}

/* The tensor-core MoE (moe_tc.cu) takes a layer when its experts are W2 or sym2, 4-byte aligned, gate/up rotated
 * alike for every expert, every matrix 16-row tiles of whole blocks, and rows exactly C/32 blocks. */
static int tiled_ok(const moet_moe_args *a, int32_t type, int gu_uniform, int aligned4) {
    if ((type != MOET_TYPE_W2 && type != MOET_TYPE_SYM2) || !gu_uniform || !aligned4) return 0;
    /* gpt-oss (biases, the clamp): tiled too, moe_tc.cu's epilogues take them (test_ops' W2 gpt-oss block at 1, 2, 5
     * tokens: NMSE ~1e-13 on an H100, stop 29; gpt-oss-20b decode 1.007x, pp128 1.012x the per-slot kernels').
     * MOET_OSS_TC=0 keeps moe.cu's per-slot kernels (read when a table is made). */
    const char *ot = getenv("MOET_OSS_TC");
    if ((a->gate_b || a->swiglu_limit > 0) && ot && ot[0] == '0') return 0;
    const int64_t H = a->hidden, F = a->ffn;
    if (H % 32 || F % 32 || H % 16 || F % 16) return 0;
    for (int32_t e = 0; e < a->n_experts; e++) {
        const moet_weight *ws[3] = {&a->gate[e], &a->up[e], &a->down[e]};
        for (int k = 0; k < 3; k++)
            if (ws[k]->row_bytes != (size_t)(ws[k]->cols / 32) * sizeof(moet_block_q2) || ws[k]->rows % 16) return 0;
    }
    return 1;
}

/* The rotations' signs as bits, one row of wpm words a matrix (host[e * 3 + k], k = 2 the down matrix over the FFN):
 * a table lookup in the kernels instead of a 64-bit hash per element (the same cu_rot_sign, so the same signs); sets
 * each rotated host[i].signs into *dev (made here). 0, or -1 after recording an error. */
static int tab_signs(cu_backend *c, cu_mat *host, int32_t E, int64_t hidden, int64_t ffn, uint32_t **dev) {
    const int64_t wpm = (hidden > ffn ? hidden : ffn) / 32;
    uint32_t *hs = (uint32_t *)calloc((size_t)E * 3 * wpm, sizeof(uint32_t));
    if (!hs || CU_CHECK(c, cudaMalloc(dev, (size_t)E * 3 * wpm * sizeof(uint32_t)))) {
        free(hs);
        if (!hs) cu_fail(c, cudaErrorMemoryAllocation, "rotation signs", __FILE__, __LINE__);
        return -1;
    }
    for (int32_t i = 0; i < E * 3; i++) {
        if (!host[i].rotated) continue;
        const int64_t n = i % 3 == 2 ? ffn : hidden;
        const uint32_t *same = NULL; /* gate/up usually share one rotation: compute once, point twice */
        for (int32_t j = 0; j < i && !same; j++)
            if (host[j].rotated && host[j].rot_seed == host[i].rot_seed && (j % 3 == 2) == (i % 3 == 2)) same = host[j].signs;
        if (same) { host[i].signs = same; continue; }
        uint32_t *row = hs + (size_t)i * wpm;
        for (int64_t q = 0; q < n; q++)
            if (cu_rot_sign(host[i].rot_seed, q) < 0.f) row[q >> 5] |= 1u << (q & 31);
        host[i].signs = *dev + (size_t)i * wpm;
    }
    const int cperr = CU_CHECK(c, cudaMemcpyAsync(*dev, hs, (size_t)E * 3 * wpm * sizeof(uint32_t),
                                                  cudaMemcpyHostToDevice, c->stream)) ||
                      CU_CHECK(c, cudaStreamSynchronize(c->stream));
    free(hs);
    if (cperr) { cudaFree(*dev); *dev = NULL; return -1; }
    return 0;
}

/* A new slot in c->etabs (grown as needed), or NULL after recording an error. */
static cu_expert_table *etab_slot(cu_backend *c) {
    if (c->n_etabs == c->cap_etabs) {
        size_t nc = c->cap_etabs ? 2 * c->cap_etabs : 64;
        cu_expert_table *nt = (cu_expert_table *)realloc(c->etabs, nc * sizeof(*nt));
        if (!nt) { cu_fail(c, cudaErrorMemoryAllocation, "expert tables", __FILE__, __LINE__); return NULL; }
        c->etabs = nt;
        c->cap_etabs = nc;
    }
    return &c->etabs[c->n_etabs];
}

typedef int (*cu_tile_fn)(cu_backend *c, uint8_t *d, int64_t rows, int64_t cols, size_t row_bytes, uint8_t *tmp);

/* Rewrites in place, with fn, every matrix of the three arrays w3 (gate, up, down: E each) whose mirror is not yet
 * tiled (a mirror keeps its layout across tables), through one scratch copy of the largest; host[e * 3 + k].w is
 * matrix k of expert e's device copy. 0, or -1 after recording an error. */
static int tab_tile(cu_backend *c, const moet_weight *const w3[3], int32_t E, const cu_mat *host, cu_tile_fn fn) {
    size_t big = 16;
    for (int32_t i = 0; i < E * 3; i++) {
        const moet_weight *w = &w3[i % 3][i / 3];
        big = (size_t)w->rows * w->row_bytes > big ? (size_t)w->rows * w->row_bytes : big;
    }
    uint8_t *tmp = NULL;
    if (CU_CHECK(c, cudaMalloc(&tmp, big))) return -1;
    int bad = 0;
    for (int32_t i = 0; i < E * 3 && !bad; i++) {
        const moet_weight *w = &w3[i % 3][i / 3];
        cu_mirror *mr = cu_mirror_of(c, w->data);
        if (!mr) { cu_fail(c, cudaErrorInvalidValue, "expert matrix without a mirror", __FILE__, __LINE__); bad = 1; break; }
        if (mr->tiled) continue;
        if (fn(c, (uint8_t *)host[i].w, w->rows, w->cols, w->row_bytes, tmp)) bad = 1;
        else mr->tiled = 1;
    }
    return CU_CHECK(c, cudaStreamSynchronize(c->stream)) || CU_CHECK(c, cudaFree(tmp)) || bad ? -1 : 0;
}

/* Uploads host (E * 3 entries) as t's device table, frees host (a cached table keeps it), and appends t to the tables (etab_slot made room). */
static const cu_expert_table *tab_finish(cu_backend *c, cu_expert_table *t, cu_mat *host, int32_t E) {
    const int bad = CU_CHECK(c, cudaMalloc(&t->table, (size_t)E * 3 * sizeof(cu_mat))) ||
                    CU_CHECK(c, cudaMemcpyAsync(t->table, host, (size_t)E * 3 * sizeof(cu_mat), cudaMemcpyHostToDevice, c->stream)) ||
                    CU_CHECK(c, cudaStreamSynchronize(c->stream));
    if (bad || !t->cached) free(host); /* a cached table keeps its host copy (expert_cache.cu repoints entries) */
    if (bad) { cudaFree(t->table); return NULL; }
    c->etabs[c->n_etabs] = *t;
    return &c->etabs[c->n_etabs++];
}

extern "C" const cu_expert_table *cu_experts(cu_backend *c, const moet_moe_args *a) {
    for (size_t i = 0; i < c->n_etabs; i++)
        if (c->etabs[i].gate == a->gate && c->etabs[i].n_experts == a->n_experts) return &c->etabs[i];
    if (c->capturing) {
        cu_fail(c, cudaErrorStreamCaptureUnsupported, "expert table first used while recording a graph", __FILE__, __LINE__);
        return NULL;
    }
    if (!etab_slot(c)) return NULL;
    const int32_t E = a->n_experts;
    cu_mat *host = (cu_mat *)calloc((size_t)E * 3, sizeof(cu_mat));
    if (!host) { cu_fail(c, cudaErrorMemoryAllocation, "expert table", __FILE__, __LINE__); return NULL; }
    const int32_t type = a->gate[0].type;
    const int cached = c->ecache.n_slots > 0; /* the experts arrive at fetches (expert_cache.cu): none mirrored */
    int32_t down_uniform = 1, gu_uniform = 1, aligned4 = 1, aligned16 = 1;
    for (int32_t e = 0; e < E; e++) {
        if (a->gate[e].rotated != a->up[e].rotated || (a->gate[e].rotated && a->gate[e].rot_seed != a->up[e].rot_seed)) {
            free(host);
            cu_fail(c, cudaErrorInvalidValue, "an expert's gate and up matrices rotated differently", __FILE__, __LINE__);
            return NULL;
        }
        if (a->down[e].rotated != a->down[0].rotated || a->down[e].rot_seed != a->down[0].rot_seed) down_uniform = 0;
        if (a->gate[e].rotated != a->gate[0].rotated || a->gate[e].rot_seed != a->gate[0].rot_seed) gu_uniform = 0;
        const moet_weight *ws[3] = {&a->gate[e], &a->up[e], &a->down[e]};
        for (int k = 0; k < 3; k++) {
            if (ws[k]->type != type) {
                free(host);
                cu_fail(c, cudaErrorInvalidValue, "routed experts of one layer in several types", __FILE__, __LINE__);
                return NULL;
            }
            const uint8_t *d = cached ? NULL : cu_weight_mat(c, ws[k]); /* cached: slots, 256-byte aligned */
            if (!d && !cached) { free(host); return NULL; }
            if (((uintptr_t)d & 3) || (ws[k]->row_bytes & 3)) aligned4 = 0;
            if ((uintptr_t)d & 15) aligned16 = 0;
            host[e * 3 + k] = (cu_mat){d, ws[k]->qscale, ws[k]->qbeta, ws[k]->rot_seed, ws[k]->rotated, NULL};
        }
    }
    int32_t levels_f16 = type == MOET_TYPE_SYM2;
    if (type == MOET_TYPE_W2) {
        levels_f16 = 1;
        for (int32_t i = 0; i < E * 3 && levels_f16; i++)
            levels_f16 = __half2float(__float2half_rn(host[i].qbeta)) == host[i].qbeta;
    }
    cu_expert_table t = {a->gate, E, NULL, type, down_uniform, gu_uniform, a->gate[0].rotated, a->down[0].rotated,
                         a->gate[0].rot_seed, a->down[0].rot_seed, aligned4, aligned16, 0, NULL, levels_f16};
    if (tiled_ok(a, type, gu_uniform, aligned4)) {
        const moet_weight *const w3[3] = {a->gate, a->up, a->down};
        if (!cached && tab_tile(c, w3, E, host, cu_q2_tile_repack)) { free(host); return NULL; }
        if (tab_signs(c, host, E, a->hidden, a->ffn, &t.signs)) { free(host); return NULL; }
        t.tiled = 1;
    }
    if (cached) {
        t.cached = 1;
        t.w3[0] = a->gate, t.w3[1] = a->up, t.w3[2] = a->down;
        if (cu_ecache_table(c, &t, host)) { free(host); if (t.signs) cudaFree(t.signs); return NULL; }
    }
    return tab_finish(c, &t, host, E);
}

extern "C" const cu_expert_table *cu_delta_experts(cu_backend *c, const moet_moe_args *a) {
    if (!a->dgate) return NULL;
    for (size_t i = 0; i < c->n_etabs; i++)
        if (c->etabs[i].gate == a->dgate && c->etabs[i].n_experts == a->n_experts) return &c->etabs[i];
    if (c->capturing) {
        cu_fail(c, cudaErrorStreamCaptureUnsupported, "delta table first used while recording a graph", __FILE__, __LINE__);
        return NULL;
    }
    if (!etab_slot(c)) return NULL;
    const int32_t E = a->n_experts;
    const int cached = c->ecache.n_slots > 0;
    cu_mat *host = (cu_mat *)calloc((size_t)E * 3, sizeof(cu_mat));
    if (!host) { cu_fail(c, cudaErrorMemoryAllocation, "delta table", __FILE__, __LINE__); return NULL; }
    for (int32_t e = 0; e < E; e++) {
        const moet_weight *ws[3] = {&a->dgate[e], &a->dup[e], &a->ddown[e]};
        const moet_weight *bs[3] = {&a->gate[e], &a->up[e], &a->down[e]};
        if (ws[0]->rotated != ws[1]->rotated || (ws[0]->rotated && ws[0]->rot_seed != ws[1]->rot_seed)) {
            free(host);
            cu_fail(c, cudaErrorInvalidValue, "an expert's gate and up delta residuals rotated differently", __FILE__, __LINE__);
            return NULL;
        }
        for (int k = 0; k < 3; k++) {
            const moet_weight *w = ws[k];
            if (w->type != MOET_TYPE_NVFP4 || w->rows != bs[k]->rows || w->cols != bs[k]->cols || w->rows % 16 ||
                w->cols % 32 || w->row_bytes != (size_t)(w->cols / 16) * sizeof(moet_block_nvfp4)) {
                free(host);
                cu_fail(c, cudaErrorInvalidValue, "delta residuals: NVFP4 of the base's shape, rows % 16, cols % 32",
                        __FILE__, __LINE__);
                return NULL;
            }
            const uint8_t *d = cached ? NULL : cu_weight_mat(c, w);
            if (!d && !cached) { free(host); return NULL; }
            host[e * 3 + k] = (cu_mat){d, w->qscale, w->qbeta, w->rot_seed, w->rotated, NULL};
        }
    }
    const moet_weight *const w3[3] = {a->dgate, a->dup, a->ddown};
    if (!cached && tab_tile(c, w3, E, host, cu_nv_tile_repack)) { free(host); return NULL; }
    cu_expert_table t = {a->dgate, E, NULL, MOET_TYPE_NVFP4, 0, 0, 0, 0, 0, 0, 1, 1, 1, NULL, 0};
    if (tab_signs(c, host, E, a->hidden, a->ffn, &t.signs)) { free(host); return NULL; }
    if (cached) { /* the residuals share their base expert's slot index (expert_cache.cu) */
        t.cached = 2;
        t.base_gate = a->gate;
        t.w3[0] = a->dgate, t.w3[1] = a->dup, t.w3[2] = a->ddown;
        if (cu_ecache_table(c, &t, host)) { free(host); cudaFree(t.signs); return NULL; }
    }
    return tab_finish(c, &t, host, E);
}

/* Removing from open addressing: clear the slot, then re-insert the rest of its cluster. */
static void mirror_drop(cu_backend *c, const void *host);

static void cu_forget(moet_backend *be, const void *host) {
    cu_backend *c = cu_of(be);
    if (!host) return;
    /* an expert table is keyed on its layer's weight array (not a mirror): drop it first, so a new layer array at the
     * same address builds its own table instead of reading the old one's device pointers */
    for (size_t i = 0; i < c->n_etabs; i++)
        if (c->etabs[i].gate == host) {
            CU_CHECK(c, cudaStreamSynchronize(c->stream));
            if (c->etabs[i].cached) cu_ecache_forget(c, &c->etabs[i]);
            CU_CHECK(c, cudaFree(c->etabs[i].table));
            if (c->etabs[i].signs) CU_CHECK(c, cudaFree(c->etabs[i].signs));
            c->etabs[i] = c->etabs[--c->n_etabs];
            break;
        }
    mirror_drop(c, host);
    mirror_drop(c, (const uint8_t *)host + 1); /* a Q8_0 matrix's q8t copy (matmul.cu) */
}

static void mirror_drop(cu_backend *c, const void *host) {
    if (!c->cap_mirrors) return;
    size_t mask = c->cap_mirrors - 1, h = ptr_hash(host) & mask;
    while (c->mirrors[h].host && c->mirrors[h].host != host) h = (h + 1) & mask;
    if (!c->mirrors[h].host) return;
    CU_CHECK(c, cudaStreamSynchronize(c->stream));
    if (c->mirrors[h].owned) CU_CHECK(c, cudaFree(c->mirrors[h].dev));
    c->mirrors[h].host = NULL;
    c->n_mirrors--;
    for (size_t k = (h + 1) & mask; c->mirrors[k].host; k = (k + 1) & mask) {
        cu_mirror m = c->mirrors[k];
        c->mirrors[k].host = NULL;
        size_t j = ptr_hash(m.host) & mask;
        while (c->mirrors[j].host) j = (j + 1) & mask;
        c->mirrors[j] = m;
    }
}

/* ---- memory -------------------------------------------------------------------------------------------------- */

static int cu_mem_info(moet_backend *be, uint64_t *free_bytes, uint64_t *total_bytes) {
    cu_backend *c = cu_of(be);
    size_t f = 0, t = 0;
    if (CU_CHECK(c, cudaSetDevice(c->device)) || CU_CHECK(c, cudaMemGetInfo(&f, &t))) return -1;
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

static void *cu_alloc(moet_backend *be, size_t bytes) {
    cu_backend *c = cu_of(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) { cudaGetLastError(); return NULL; }
    /* on our stream: a legacy-stream memset would not be ordered before our kernels (non-blocking stream) */
    if (CU_CHECK(c, cudaMemsetAsync(p, 0, bytes, c->stream)) || CU_CHECK(c, cudaStreamSynchronize(c->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_release(moet_backend *be, void *p) {
    if (!p) return;
    cu_backend *c = cu_of(be);
    /* A released buffer that served as a weight (synthetic models) keeps its identity mirror entry: a later buffer
     * at the same address maps to itself again, which is still right. */
    CU_CHECK(c, cudaStreamSynchronize(c->stream));
    CU_CHECK(c, cudaFree(p));
}

static void cu_copy(moet_backend *be, void *dst, const void *src, size_t bytes) {
    cu_backend *c = cu_of(be);
    CU_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static void cu_upload(moet_backend *be, void *dst, const void *src, size_t bytes) {
    cu_backend *c = cu_of(be);
    CU_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
}

static void cu_download(moet_backend *be, void *dst, const void *src, size_t bytes) {
    cu_backend *c = cu_of(be);
    CU_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CU_CHECK(c, cudaStreamSynchronize(c->stream));
}

static int cu_status(moet_backend *be, char *err, size_t errlen) {
    cu_backend *c = cu_of(be);
    if (!c->err[0]) return 0;
    if (err && errlen) snprintf(err, errlen, "%s", c->err);
    return -7; /* MOET_EDEVICE */
}

static const char *cu_device_name(moet_backend *be) { return cu_of(be)->desc; }

/* ---- graphs -------------------------------------------------------------------------------------------------- */

static int cu_graph_run(moet_backend *be, uint64_t key, void (*step)(void *ctx), void *ctx) {
    cu_backend *c = cu_of(be);
    if (c->err[0]) return -1;
    cu_graph *g = NULL;
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key) g = &c->graphs[i];
    if (!g && c->n_graphs < CU_MAX_GRAPHS) {
        g = &c->graphs[c->n_graphs++];
        g->key = key;
        g->seen = 0;
        g->exec = NULL;
    }
    if (!g || g->seen == 0) { /* first sight (or table full): eager, which also fills the mirrors */
        if (g) g->seen = 1;
        step(ctx);
        return c->err[0] ? -1 : 0;
    }
    if (!g->exec) {
        cudaGraph_t graph;
        if (CU_CHECK(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal))) return -1;
        c->capturing = 1;
        step(ctx);
        c->capturing = 0;
        cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
        if (CU_CHECK(c, e) || c->err[0]) return -1;
        e = cudaGraphInstantiate(&g->exec, graph, 0);
        cudaGraphDestroy(graph);
        if (CU_CHECK(c, e)) { g->exec = NULL; return -1; }
    }
    cu_trace_step(c);
    if (CU_CHECK(c, cudaGraphLaunch(g->exec, c->stream))) return -1;
    return 0;
}

static void cu_graph_release(moet_backend *be, uint32_t owner) {
    cu_backend *c = cu_of(be);
    int k = 0;
    for (int i = 0; i < c->n_graphs; i++) {
        if ((uint32_t)(c->graphs[i].key >> 32) == owner) {
            if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
        } else {
            c->graphs[k++] = c->graphs[i];
        }
    }
    c->n_graphs = k;
}

/* ---- lifecycle ----------------------------------------------------------------------------------------------- */

static void cu_destroy(moet_backend *be) {
    cu_backend *c = cu_of(be);
    if (!c) return;
    cudaStreamSynchronize(c->stream);
    cu_trace_dump(c);
    cu_moe_fused_report(c);
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    for (size_t i = 0; i < c->cap_mirrors; i++)
        if (c->mirrors[i].host && c->mirrors[i].owned) cudaFree(c->mirrors[i].dev);
    for (size_t i = 0; i < c->n_etabs; i++) {
        cudaFree(c->etabs[i].table);
        cudaFree(c->etabs[i].signs);
        free(c->etabs[i].host_table);
        if (c->etabs[i].home) cudaFreeHost(c->etabs[i].home);
    }
    cu_ecache_free(c);
    free(c->mirrors);
    free(c->etabs);
    cudaFree(c->ticket);
    cudaFree(c->fsync);
    cudaFree(c->dn_tickets);
    cudaFree(c->attn_part);
    cudaFree(c->attn_split);
    for (int i = 0; i < c->n_attn_retired; i++) cudaFree(c->attn_retired[i]);
    cu_gemm_release(c);
    cudaStreamDestroy(c->stream);
    free(c);
}

static const moet_backend_ops k_cuda_ops = {
    /* .name = */ "cuda",
    /* .destroy = */ cu_destroy,
    /* .device_name = */ cu_device_name,
    /* .status = */ cu_status,
    /* .forget = */ cu_forget,
    /* .alloc = */ cu_alloc,
    /* .release = */ cu_release,
    /* .copy = */ cu_copy,
    /* .upload = */ cu_upload,
    /* .download = */ cu_download,
    /* .fill_random = */ cu_fill_random,
    /* .graph_run = */ cu_graph_run,
    /* .graph_release = */ cu_graph_release,
    /* .get_rows = */ cu_get_rows,
    /* .add = */ cu_add,
    /* .mul_mat = */ cu_mul_mat,
    /* .mul_mat_acc = */ cu_mul_mat_acc,
    /* .norm_mul_mat = */ cu_norm_mul_mat,
    /* .rms_norm = */ cu_rms_norm,
    /* .rope = */ cu_rope,
    /* .kv_store = */ cu_kv_store,
    /* .attn_prep = */ cu_attn_prep,
    /* .attention = */ cu_attention,
    /* .mla_prep = */ cu_mla_prep,
    /* .heads_narrow = */ cu_heads_narrow,
    /* .mla_attn = */ NULL, /* mla.cu's cu_mla_attn with MOET_MLA_LATENT=1 (k_cuda_ops_latent, below) */
    /* .attn_fused = */ cu_attn_fused,
    /* .attn_scratch_bytes = */ cu_attn_scratch_bytes,
    /* .mlp = */ cu_mlp,
    /* .moe = */ cu_moe,
    /* .moe_scratch_bytes = */ cu_moe_scratch_bytes,
    /* .attn_rows = */ cu_attn_rows,
    /* .topk = */ cu_topk,
    /* .topk_scratch_bytes = */ cu_topk_scratch_bytes,
    /* .expert_cache = */ cu_expert_cache,
    /* .expert_cache_resolve = */ cu_expert_cache_resolve,
    /* .expert_cache_stats = */ cu_expert_cache_stats,
    /* .mem_info = */ cu_mem_info,
};

/* The same table with mla.cu's op (MOET_MLA_LATENT=1, cu_backend_create): made once, at load. */
static moet_backend_ops cu_ops_with_mla(void) {
    moet_backend_ops o = k_cuda_ops;
    o.mla_attn = cu_mla_attn;
    return o;
}
static const moet_backend_ops k_cuda_ops_latent = cu_ops_with_mla();

extern "C" int moet_backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}

extern "C" int moet_backend_cuda_kernel_regs(const char *kernel) {
    if (!kernel || moet_backend_cuda_device_count() <= 0) return -1;
    if (!strcmp(kernel, "router")) return cu_moe_tc_regs(0);
    if (!strcmp(kernel, "down")) return cu_moe_tc_regs(1);
    if (!strcmp(kernel, "router_split")) return cu_moe_tc_regs(2);
    if (!strcmp(kernel, "mv16s")) return cu_mv16s_regs();
    return -1;
}

extern "C" long long moet_backend_cuda_launches(const char *kernel) {
    if (!kernel) return -1;
    if (!strcmp(kernel, "st_gate_up")) return cu_moe_st_launches(0);
    if (!strcmp(kernel, "st_down")) return cu_moe_st_launches(1);
    return -1;
}

extern "C" moet_backend *moet_backend_cuda_create(int device, char *err, size_t errlen) {
    int n = moet_backend_cuda_device_count();
    if (device < 0 || device >= n) {
        if (err && errlen)
            snprintf(err, errlen, n ? "cuda:%d: this machine has %d CUDA GPU(s)" : "cuda:%d: no CUDA GPU found", device, n);
        return NULL;
    }
    cu_backend *c = (cu_backend *)calloc(1, sizeof(*c));
    if (!c) { if (err && errlen) snprintf(err, errlen, "out of memory"); return NULL; }
    /* DeepSeek's latent cache (mla.cu) is opt-in until a GPU has run it (stop 28 wrote it with no device lent after
     * the first call): MOET_MLA_LATENT=1 gives this backend the mla_attn op, so sessions keep [k_pe', c] a token;
     * otherwise MLA runs as ordinary attention on full keys and values, as checked on an H100 at stop 28 */
    const char *ml = getenv("MOET_MLA_LATENT");
    c->base.ops = ml && ml[0] == '1' ? &k_cuda_ops_latent : &k_cuda_ops;
    c->device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&c->prop, device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc(&c->ticket, sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMemset(c->ticket, 0, sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMalloc(&c->fsync, 64 * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMemset(c->fsync, 0, 64 * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMalloc(&c->dn_tickets, CU_DN_TICKETS * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMemset(c->dn_tickets, 0, CU_DN_TICKETS * sizeof(int32_t));
    if (e != cudaSuccess) {
        if (err && errlen) snprintf(err, errlen, "cuda:%d: %s", device, cudaGetErrorString(e));
        free(c);
        return NULL;
    }
    {
        /* Programmatic dependent launch (sm_90+; MOET_PDL=0 turns it off): each decode kernel's CTAs launch while
         * the kernel before it drains and request their weights before they wait. Measured on the H200:
         * qwen3-30b-a3b tg128 303 -> 329 t/s. It was off until the cause of its wrong results was found: reads of
         * the previous kernel's outputs through the non-coherent path (common.cuh, cu_pdl_wait). */
        const char *pe = getenv("MOET_PDL");
        c->pdl = c->prop.major >= 9 && !(pe && pe[0] == '0');
    }
    cu_moe_fused_trace_init(c);
    cu_trace_init(c);
    snprintf(c->desc, sizeof c->desc, "%s (sm_%d%d, %d SMs, %.0f GiB)", c->prop.name, c->prop.major, c->prop.minor,
             c->prop.multiProcessorCount, (double)c->prop.totalGlobalMem / (1u << 30));
    return &c->base;
}
