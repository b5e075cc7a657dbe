/*
 * model.c — loading a Hugging Face checkpoint directory into an immutable moet_model.
 *
 * Order: config.json (architecture lookup, hyperparameters) -> safetensors (validated, mmap'd) -> the
 * architecture's bind (every tensor's name, dtype and shape checked against the hyperparameters) -> tokenizer.
 * Any failure frees everything built so far: a failed load leaves no partial state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "format/hf_config.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/delta.h"
#include "model/pack.h"
#include "quant/types.h"

moet_model_options moet_model_default_options(void) {
    moet_model_options o = {.n_threads = 0, .verbose = 0, .device = NULL};
    return o;
}

const char *moet_model_supported_architectures(void) { return moet_arch_list(); }

/* ---- binding helpers ------------------------------------------------------------------------------------------ */

static const moet_st_tensor *find_tensor(struct moet_model *m, const char *name, char *err, size_t errlen) {
    const moet_st_tensor *t = moet_st_find(&m->st, name);
    if (!t) moet_err(err, errlen, MOET_EFORMAT, "tensor '%s' is missing from the checkpoint", name);
    else m->st_used[t - m->st.tensors] = 1;
    return t;
}

static int st_to_type(const moet_st_tensor *t) {
    switch (t->dtype) {
    case MOET_ST_F32: return MOET_TYPE_F32;
    case MOET_ST_F16: return MOET_TYPE_F16;
    case MOET_ST_BF16: return MOET_TYPE_BF16;
    case MOET_ST_F8_E4M3: return MOET_TYPE_F8_E4M3; /* with its block scales: bind_f8 */
    default: return -1;
    }
}

/* An FP8 matrix's block scales: <name>_scale_inv, f32 [ceil(total_rows / 128), ceil(cols / 128)] (DeepSeek-V3's and
 * Qwen3-FP8's weight_scale_inv: the factor each 128 x 128 block is multiplied by); rows from r0 (a multiple of 128). */
static int bind_f8(struct moet_model *m, const char *name, int64_t total_rows, int64_t r0, int64_t cols, moet_weight *w,
                   char *err, size_t errlen) {
    char sn[512];
    snprintf(sn, sizeof sn, "%s_scale_inv", name);
    const moet_st_tensor *s = moet_st_find(&m->st, sn);
    const int64_t sr = (total_rows + 127) / 128, sc = (cols + 127) / 128;
    if (!s) return moet_err(err, errlen, MOET_EFORMAT, "FP8 tensor '%s' has no block scales '%s'", name, sn);
    if (s->dtype != MOET_ST_F32 || s->ndim != 2 || s->shape[0] != sr || s->shape[1] != sc || (uintptr_t)s->data % 4)
        return moet_err(err, errlen, MOET_EUNSUP, "%s: '%s' is not f32 [%lld, %lld] (128 x 128 blocks are supported)",
                        m->st.paths[s->file], sn, (long long)sr, (long long)sc);
    if (r0 % 128) return moet_err(err, errlen, MOET_EUNSUP, "FP8 tensor '%s': rows from %lld (not a block edge)", name,
                                  (long long)r0);
    m->st_used[s - m->st.tensors] = 1;
    w->bscale = (const float *)s->data + (r0 / 128) * sc;
    w->bscale_ld = sc;
    return MOET_OK;
}

/* A tensor's elements are read in place from the mapping, so each must sit at a multiple of its size: a file whose
 * header is not padded to 8 bytes (Hugging Face's writers pad it) would have every float misaligned. */
static int check_aligned(const moet_model *m, const moet_st_tensor *t, const char *name, int type, char *err,
                         size_t errlen) {
    const size_t es = type == MOET_TYPE_F32 ? 4 : 2;
    if ((uintptr_t)t->data % es == 0) return MOET_OK;
    return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s' is not aligned to its %zu-byte elements (is the "
                    "safetensors header padded to 8 bytes?)", m->st.paths[t->file], name, es);
}

int moet_has_tensor(const struct moet_model *m, const char *name) {
    return m->pack ? moet_gguf_find_tensor(m->pack, name) != NULL : moet_st_find(&m->st, name) != NULL;
}

/* Pack tensors: GGUF dims are innermost first, so [rows, cols] is ne = {cols, rows}. */
static int bind_pack(struct moet_model *m, const char *name, int64_t n, int64_t index, int64_t total_rows, int64_t r0,
                     int64_t rows, int64_t cols, moet_weight *w, int vector, char *err, size_t errlen) {
    const moet_gguf_tensor *t = moet_gguf_find_tensor(m->pack, name);
    if (!t) return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s' is missing", m->pack->path, name);
    int ok = vector ? (t->n_dims == 1 && t->ne[0] == cols)
                    : n == 0 ? (t->n_dims == 2 && t->ne[0] == cols && t->ne[1] == total_rows)
                             : (t->n_dims == 3 && t->ne[0] == cols && t->ne[1] == total_rows && t->ne[2] == n);
    if (!ok)
        return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s' has ne [%lld, %lld, %lld], the hyperparameters "
                        "imply [%lld, %lld]", m->pack->path, name, (long long)t->ne[0], (long long)t->ne[1],
                        (long long)t->ne[2], (long long)cols, (long long)total_rows);
    memset(w, 0, sizeof(*w));
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = moet_type_row_bytes(t->type, cols);
    w->qscale = 1.0f;
    w->data = t->data + ((size_t)index * (size_t)total_rows + (size_t)r0) * w->row_bytes;
    return MOET_OK;
}

static int shape_error(struct moet_model *m, const moet_st_tensor *t, const char *want, char *err, size_t errlen) {
    char sb[160];
    return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s' has shape %s, config.json implies %s",
                    m->st.paths[t->file], t->name, moet_st_shape_str(t, sb, sizeof sb), want);
}

int moet_bind_matrix(struct moet_model *m, const char *name, int64_t rows, int64_t cols, moet_weight *w, char *err,
                     size_t errlen) {
    return moet_bind_matrix_slice(m, name, 0, 0, rows, 0, rows, cols, w, err, errlen);
}

int moet_bind_matrix_slice(struct moet_model *m, const char *name, int64_t n, int64_t index, int64_t total_rows,
                           int64_t r0, int64_t rows, int64_t cols, moet_weight *w, char *err, size_t errlen) {
    if (m->pack) return bind_pack(m, name, n, index, total_rows, r0, rows, cols, w, 0, err, errlen);
    memset(w, 0, sizeof(*w));
    w->qscale = 1.0f;
    const moet_st_tensor *t = find_tensor(m, name, err, errlen);
    if (!t) return MOET_EFORMAT;
    char want[160];
    if (n == 0) {
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)total_rows, (long long)cols);
        if (t->ndim != 2 || t->shape[0] != total_rows || t->shape[1] != cols) return shape_error(m, t, want, err, errlen);
    } else {
        snprintf(want, sizeof want, "[%lld, %lld, %lld]", (long long)n, (long long)total_rows, (long long)cols);
        if (t->ndim != 3 || t->shape[0] != n || t->shape[1] != total_rows || t->shape[2] != cols)
            return shape_error(m, t, want, err, errlen);
    }
    int type = st_to_type(t);
    if (type < 0)
        return moet_err(err, errlen, MOET_EUNSUP, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16, F8_E4M3 "
                        "with block scales)", m->st.paths[t->file], name, moet_st_dtype_name(t->dtype));
    int rc = type == MOET_TYPE_F8_E4M3 ? (n ? moet_err(err, errlen, MOET_EUNSUP, "FP8 tensor '%s': 3-D expert tensors "
                                                       "are not supported", name)
                                             : bind_f8(m, name, total_rows, r0, cols, w, err, errlen))
                                       : check_aligned(m, t, name, type, err, errlen);
    if (rc) return rc;
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = moet_type_row_bytes(type, cols);
    w->data = t->data + ((size_t)index * (size_t)total_rows + (size_t)r0) * w->row_bytes;
    return MOET_OK;
}

int moet_bind_vector(struct moet_model *m, const char *name, int64_t n, const float **out, char *err, size_t errlen) {
    int type;
    const void *src;
    if (m->pack) {
        moet_weight w = {0};
        int rc = bind_pack(m, name, 0, 0, 1, 0, 1, n, &w, 1, err, errlen);
        if (rc) return rc;
        if (w.type != MOET_TYPE_F32 && w.type != MOET_TYPE_F16 && w.type != MOET_TYPE_BF16)
            return moet_err(err, errlen, MOET_EFORMAT, "%s: vector '%s' is not f32/f16/bf16", m->pack->path, name);
        type = w.type;
        src = w.data;
    } else {
        const moet_st_tensor *t = find_tensor(m, name, err, errlen);
        if (!t) return MOET_EFORMAT;
        if (t->ndim != 1 || t->shape[0] != n) {
            char want[64];
            snprintf(want, sizeof want, "[%lld]", (long long)n);
            return shape_error(m, t, want, err, errlen);
        }
        type = st_to_type(t);
        if (type < 0)
            return moet_err(err, errlen, MOET_EUNSUP, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16)",
                            m->st.paths[t->file], name, moet_st_dtype_name(t->dtype));
        int rc = check_aligned(m, t, name, type, err, errlen);
        if (rc) return rc;
        src = t->data;
    }
    if (m->n_f32_bufs == m->cap_f32_bufs) {
        size_t nc = m->cap_f32_bufs ? m->cap_f32_bufs * 2 : 64;
        float **nb = realloc(m->f32_bufs, nc * sizeof(*nb));
        if (!nb) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        m->f32_bufs = nb;
        m->cap_f32_bufs = nc;
    }
    float *v = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!v) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    moet_type_row_to_f32(type, src, v, n);
    m->f32_bufs[m->n_f32_bufs++] = v;
    *out = v;
    return MOET_OK;
}

/* ---- backend ---------------------------------------------------------------------------------------------------- */

int moet_backend_open(const char *device, int n_threads, moet_backend **out, char *err, size_t errlen) {
    *out = NULL;
    int want_cuda = 0, index = 0;
    if (!device || !strcmp(device, "auto")) {
        want_cuda = moet_backend_cuda_device_count() > 0;
    } else if (!strcmp(device, "cpu")) {
        want_cuda = 0;
    } else if (!strncmp(device, "cuda", 4) && (device[4] == 0 || device[4] == ':')) {
        want_cuda = 1;
        if (device[4] == ':') {
            char *end;
            long v = strtol(device + 5, &end, 10);
            if (end == device + 5 || *end || v < 0 || v > 255)
                return moet_err(err, errlen, MOET_EINVAL, "--device '%s': expected cuda:N with N a GPU index", device);
            index = (int)v;
        }
    } else {
        return moet_err(err, errlen, MOET_EINVAL, "--device '%s': expected cpu, cuda, cuda:N or auto", device);
    }
    if (want_cuda) {
        char sub[256];
        *out = moet_backend_cuda_create(index, sub, sizeof sub);
        if (!*out) return moet_err(err, errlen, MOET_EDEVICE, "%s", sub);
        return MOET_OK;
    }
    *out = moet_backend_cpu_create(n_threads);
    return *out ? MOET_OK : moet_err(err, errlen, MOET_ENOMEM, "cannot create the CPU backend");
}

/* One routed expert's bytes as a slot holds it: its three matrices and, with a delta, their residuals (the first MoE
 * layer's expert 0; the CUDA backend pads each matrix to 256 bytes, counted here too). 0 without routed experts. */
static uint64_t expert_slot_bytes(const moet_model *m) {
    for (int l = 0; l < m->hp.n_layers; l++) {
        const moet_layer *L = &m->layers[l];
        if (!L->is_moe || !L->exp_gate) continue;
        const moet_weight *ws[6] = {&L->exp_gate[0], &L->exp_up[0], &L->exp_down[0], NULL, NULL, NULL};
        if (L->dres_gate) ws[3] = &L->dres_gate[0], ws[4] = &L->dres_up[0], ws[5] = &L->dres_down[0];
        uint64_t b = 0;
        for (int k = 0; k < 6; k++)
            if (ws[k]) b += ((uint64_t)ws[k]->rows * ws[k]->row_bytes + 255) / 256 * 256;
        return b;
    }
    return 0;
}

int moet_expert_slots_auto(moet_backend *be, uint64_t dense_bytes, uint64_t slot_bytes, int64_t n_experts,
                           int64_t min_slots, double reserve_gib, int64_t *slots, char *err, size_t errlen) {
    *slots = 0;
    if (!be->ops->mem_info || !slot_bytes || n_experts <= 0) return MOET_OK;
    uint64_t fr = 0, tot = 0;
    if (be->ops->mem_info(be, &fr, &tot))
        return moet_err(err, errlen, MOET_EDEVICE, "--expert-slots auto: cannot read the device's free memory");
    const double gib = (double)(1ull << 30);
    uint64_t reserve = tot / 10 > (2ull << 30) ? tot / 10 : (2ull << 30);
    if (reserve_gib > 0) reserve = (uint64_t)(reserve_gib * gib);
    const uint64_t experts = slot_bytes * (uint64_t)n_experts;
    if (dense_bytes + experts + reserve <= fr) {
        MOET_LOGI("expert cache: auto: the model (%.2f GiB) fits %.2f GiB free with %.2f GiB to spare: every expert "
                  "resident", (dense_bytes + experts) / gib, fr / gib, reserve / gib);
        return MOET_OK;
    }
    const int64_t n = dense_bytes + reserve < fr ? (int64_t)((fr - dense_bytes - reserve) / slot_bytes) : 0;
    if (n < min_slots || n < 1)
        return moet_err(err, errlen, MOET_ENOMEM, "--expert-slots auto: %.2f GiB free holds the dense weights (%.2f GiB) "
                        "and the reserve (%.2f GiB) but %lld experts of %.2f MiB, fewer than one token's %lld",
                        fr / gib, dense_bytes / gib, reserve / gib, (long long)n, slot_bytes / (double)(1 << 20),
                        (long long)min_slots);
    MOET_LOGI("expert cache: auto: %lld of %lld experts in device slots (%.2f GiB free: dense weights %.2f GiB, "
              "reserve %.2f GiB)", (long long)n, (long long)n_experts, fr / gib, dense_bytes / gib, reserve / gib);
    *slots = n;
    return MOET_OK;
}

/* The routed experts' matrices' bytes as bound (not padded; their residuals, from a delta pack, are not in
 * m->weight_bytes and not counted here) and their count over all MoE layers. */
static void expert_totals(const moet_model *m, uint64_t *bytes, int64_t *count) {
    *bytes = 0;
    *count = 0;
    for (int l = 0; l < m->hp.n_layers; l++) {
        const moet_layer *L = &m->layers[l];
        if (!L->is_moe || !L->exp_gate) continue;
        for (int32_t e = 0; e < m->hp.n_experts; e++) {
            const moet_weight *ws[3] = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]};
            for (int k = 0; k < 3; k++) *bytes += (uint64_t)ws[k]->rows * ws[k]->row_bytes;
        }
        *count += m->hp.n_experts;
    }
}

int moet_model_cache_setup(moet_model *m, const moet_model_options *o, char *err, size_t errlen) {
    int64_t n = o->expert_slots;
    if (n == MOET_EXPERT_SLOTS_AUTO) {
        uint64_t xb;
        int64_t xn;
        expert_totals(m, &xb, &xn);
        const uint64_t wb = m->weight_bytes > 0 ? (uint64_t)m->weight_bytes : 0;
        const int rc = moet_expert_slots_auto(m->be, wb > xb ? wb - xb : 0, expert_slot_bytes(m), xn,
                                              m->hp.n_experts_used, o->expert_reserve_gib, &n, err, errlen);
        if (rc) return rc;
    } else if (n < 0) {
        return moet_err(err, errlen, MOET_EINVAL, "expert slots %lld: a count >= 0, or MOET_EXPERT_SLOTS_AUTO", (long long)n);
    } else if (o->expert_slots_gib > 0) { /* a budget: as many slots as it holds */
        const uint64_t per = expert_slot_bytes(m);
        if (!per) return moet_err(err, errlen, MOET_EINVAL, "--expert-slots %gG: the model has no routed experts", o->expert_slots_gib);
        n = (int64_t)(o->expert_slots_gib * (double)(1ull << 30) / (double)per);
        if (n < 1) return moet_err(err, errlen, MOET_EINVAL, "--expert-slots %gG holds no expert of %.2f MiB", o->expert_slots_gib,
                                   (double)per / (1 << 20));
        MOET_LOGI("expert cache: %gG holds %lld slots of %.2f MiB", o->expert_slots_gib, (long long)n, (double)per / (1 << 20));
    }
    m->expert_slots = n;
    if (!n) return MOET_OK;
    if (!m->be->ops->expert_cache)
        return moet_err(err, errlen, MOET_EUNSUP, "the %s backend has no expert cache (expert slots %lld)",
                        m->be->ops->name, (long long)n);
    const int rc = m->be->ops->expert_cache(m->be, n, o->expert_pinned ? MOET_EXPERT_HOME_PINNED : MOET_EXPERT_HOME_MAPPED);
    return rc ? moet_err(err, errlen, rc, "expert cache of %lld slots", (long long)n) : MOET_OK;
}

int moet_model_backend_open(moet_model *m, const moet_model_options *o, char *err, size_t errlen) {
    const int rc = moet_backend_open(o->device, o->n_threads, &m->be, err, errlen);
    if (rc) return rc;
    return moet_model_cache_setup(m, o, err, errlen);
}

/* ---- load ------------------------------------------------------------------------------------------------------ */

/* A checkpoint's quantization_config: none; fp8 in 128 x 128 blocks of e4m3 (DeepSeek-V3, Kimi-K2, Qwen3-FP8: its
 * tensors bind as MOET_TYPE_F8_E4M3 with their weight_scale_inv); or mxfp4 (gpt-oss: its experts' _blocks and
 * _scales, gpt_oss.c). Anything else is refused by name. */
static int check_quant_config(const json_t *cfg, char *err, size_t errlen) {
    const json_t *q = json_object_get(cfg, "quantization_config");
    if (!q || json_is_null(q)) return MOET_OK;
    if (!json_is_object(q)) return moet_err(err, errlen, MOET_EFORMAT, "key 'quantization_config' must be an object");
    const char *meth = NULL, *fmt = NULL;
    int rc;
    if ((rc = moet_cfg_str(q, "quant_method", &meth, err, errlen)) || (rc = moet_cfg_str(q, "fmt", &fmt, err, errlen)))
        return rc;
    if (meth && !strcmp(meth, "mxfp4")) return MOET_OK;
    if (!meth || strcmp(meth, "fp8") != 0)
        return moet_err(err, errlen, MOET_EUNSUP, "quantization_config: quant_method '%s' is not supported (supported: "
                        "fp8 in 128 x 128 blocks, mxfp4)", meth ? meth : "(none)");
    if (fmt && strcmp(fmt, "e4m3") != 0)
        return moet_err(err, errlen, MOET_EUNSUP, "quantization_config: fp8 fmt '%s' is not supported (supported: e4m3)",
                        fmt);
    const json_t *bs = json_object_get(q, "weight_block_size");
    if (!json_is_array(bs) || json_array_size(bs) != 2 || json_integer_value(json_array_get(bs, 0)) != 128 ||
        json_integer_value(json_array_get(bs, 1)) != 128)
        return moet_err(err, errlen, MOET_EUNSUP, "quantization_config: fp8 weight_block_size must be [128, 128]");
    return MOET_OK;
}

static int read_json(const char *path, json_t **out, char *err, size_t errlen) {
    char *txt;
    size_t len;
    int rc = moet_file_read_all(path, 64u << 20, &txt, &len, err, errlen);
    if (rc) return rc;
    json_error_t je;
    *out = json_loadb(txt, len, JSON_REJECT_DUPLICATES, &je);
    free(txt);
    if (!*out) return moet_err(err, errlen, MOET_EFORMAT, "%s: invalid JSON (line %d col %d): %s", path, je.line,
                               je.column, je.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return moet_err(err, errlen, MOET_EFORMAT, "%s: not a JSON object", path);
    }
    return MOET_OK;
}

static int read_eos(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen) {
    const json_t *v = json_object_get(cfg, "eos_token_id");
    if (!v || json_is_null(v)) return MOET_OK;
    hp->n_eos = 0;
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0 || json_integer_value(v) >= hp->vocab)
            return moet_err(err, errlen, MOET_EFORMAT, "eos_token_id out of range");
        hp->eos_ids[hp->n_eos++] = (int32_t)json_integer_value(v);
        return MOET_OK;
    }
    if (!json_is_array(v)) return moet_err(err, errlen, MOET_EFORMAT, "eos_token_id must be an integer or a list");
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= hp->vocab)
            return moet_err(err, errlen, MOET_EFORMAT, "eos_token_id[%zu] out of range", i);
        if (hp->n_eos < MOET_MAX_EOS) hp->eos_ids[hp->n_eos++] = (int32_t)json_integer_value(x);
    }
    return MOET_OK;
}

void moet_model_free(moet_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_be_bufs; i++) m->be->ops->release(m->be, m->be_bufs[i]);
    free(m->be_bufs);
    if (m->be) m->be->ops->destroy(m->be);
    if (m->layers)
        for (int i = 0; i < m->hp.n_layers; i++) {
            free(m->layers[i].exp_gate);
            free(m->layers[i].dexp_gate);
            free(m->layers[i].dres_gate);
        }
    free(m->layers);
    for (size_t i = 0; i < m->n_f32_bufs; i++) free(m->f32_bufs[i]);
    free(m->f32_bufs);
    free(m->hp.layer_moe);
    free(m->hp.layer_sliding);
    free(m->st_used);
    moet_st_free(&m->st);
    if (m->pack) { moet_gguf_close(m->pack); free(m->pack); }
    if (m->delta_pack) { moet_gguf_close(m->delta_pack); free(m->delta_pack); }
    moet_tokenizer_free(m->tok);
    free(m->chat_template);
    free(m);
}

int moet_model_f32_reserve(moet_model *m, size_t extra) {
    if (m->n_f32_bufs + extra <= m->cap_f32_bufs) return MOET_OK;
    float **nb = realloc(m->f32_bufs, (m->n_f32_bufs + extra) * sizeof(float *));
    if (!nb) return MOET_ENOMEM;
    m->f32_bufs = nb;
    m->cap_f32_bufs = m->n_f32_bufs + extra;
    return MOET_OK;
}

int moet_model_dexp_reset(moet_model *m, int alloc) {
    const int64_t E = m->hp.n_experts;
    for (int l = 0; l < m->hp.n_layers; l++) {
        moet_layer *L = &m->layers[l];
        free(L->dexp_gate);
        free(L->dres_gate);
        L->dexp_gate = L->dexp_up = L->dexp_down = NULL;
        L->dres_gate = L->dres_up = L->dres_down = NULL;
        if (!alloc || !m->hp.layer_moe[l]) continue;
        if (!(L->dexp_gate = calloc((size_t)E * 3, sizeof(moet_weight)))) return MOET_ENOMEM;
        L->dexp_up = L->dexp_gate + E;
        L->dexp_down = L->dexp_up + E;
    }
    return MOET_OK;
}

int moet_model_load(const char *path, const moet_model_options *opt, moet_model **out, char *err, size_t errlen) {
    *out = NULL;
    moet_model_options o = opt ? *opt : moet_model_default_options();
    moet_model *m = calloc(1, sizeof(*m));
    if (!m) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    moet_st_init(&m->st);
    char p[4096], sub[512];
    json_t *cfg = NULL;
    int rc;
    double t0 = moet_time_s();
    if (moet_file_exists(path)) { /* a file: a moet pack */
        if ((rc = moet_pack_load(m, path, err, errlen))) goto fail;
        char dp[4096];
        const char *dpath = o.delta_path;
        if (!dpath && !moet_delta_default_path(path, dp, sizeof dp) && moet_file_exists(dp)) dpath = dp;
        if (dpath && dpath[0] && (rc = moet_delta_load(m, dpath, o.n_threads, err, errlen))) goto fail;
        goto backend;
    }

    if (!moet_path_join(p, sizeof p, path, "config.json")) { rc = moet_err(err, errlen, MOET_EINVAL, "path too long"); goto fail; }
    if ((rc = read_json(p, &cfg, err, errlen))) goto fail;
    const json_t *archs = json_object_get(cfg, "architectures");
    const char *aname = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    if (!aname) { rc = moet_err(err, errlen, MOET_EFORMAT, "%s: missing 'architectures'", p); goto fail; }
    m->arch = moet_arch_find(aname);
    if (!m->arch) {
        rc = moet_err(err, errlen, MOET_EUNSUP, "%s: unsupported architecture '%s' (supported: %s)", p, aname,
                      moet_arch_list());
        goto fail;
    }
    snprintf(m->hp.architecture, sizeof m->hp.architecture, "%s", aname);
    m->hp.bos_id = -1;
    if ((rc = m->arch->parse_config(cfg, &m->hp, sub, sizeof sub)) || (rc = check_quant_config(cfg, sub, sizeof sub))) {
        moet_err(err, errlen, rc, "%s: %s", p, sub);
        goto fail;
    }
    {
        int32_t bos;
        if ((rc = moet_cfg_int(cfg, "bos_token_id", false, -1, -1, m->hp.vocab - 1, &bos, sub, sizeof sub)) ||
            (rc = read_eos(cfg, &m->hp, sub, sizeof sub))) {
            moet_err(err, errlen, rc, "%s: %s", p, sub);
            goto fail;
        }
        m->hp.bos_id = bos;
    }
    json_decref(cfg);
    cfg = NULL;
    if (moet_path_join(p, sizeof p, path, "generation_config.json") && moet_file_exists(p)) {
        if ((rc = read_json(p, &cfg, err, errlen))) goto fail;
        if ((rc = read_eos(cfg, &m->hp, sub, sizeof sub))) { moet_err(err, errlen, rc, "%s: %s", p, sub); goto fail; }
        json_decref(cfg);
        cfg = NULL;
    }

    if ((rc = moet_st_open_dir(&m->st, path, err, errlen))) goto fail;
    m->st_used = calloc(m->st.n_tensors + 1, 1);
    if (!m->st_used) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto fail; }
    if ((rc = m->arch->bind(m, err, errlen))) goto fail;
    size_t unused = 0;
    for (size_t i = 0; i < m->st.n_tensors; i++) {
        const moet_st_tensor *t = &m->st.tensors[i];
        uint64_t cnt = t->nbytes / moet_st_dtype_size(t->dtype);
        m->n_params += (int64_t)cnt;
        m->weight_bytes += (int64_t)t->nbytes;
        if (!m->st_used[i]) {
            if (unused++ < 5) MOET_LOGW("%s: tensor '%s' is not used by %s", m->st.paths[t->file], t->name, m->hp.architecture);
        }
    }
    if (unused > 5) MOET_LOGW("... %zu unused tensors in all", unused);

    if (!moet_path_join(p, sizeof p, path, "tokenizer.json")) { rc = moet_err(err, errlen, MOET_EINVAL, "path too long"); goto fail; }
    if ((rc = moet_tokenizer_load(p, &m->tok, err, errlen))) goto fail;
    if (moet_tokenizer_vocab_size(m->tok) > m->hp.vocab) {
        rc = moet_err(err, errlen, MOET_EFORMAT, "%s: %d tokens but the model's vocab_size is %d", p,
                      moet_tokenizer_vocab_size(m->tok), m->hp.vocab);
        goto fail;
    }
    if (moet_path_join(p, sizeof p, path, "tokenizer_config.json") && moet_file_exists(p)) {
        if ((rc = read_json(p, &cfg, err, errlen))) goto fail;
        /* a string, or (older checkpoints) a list of {"name", "template"}: the one named "default" */
        json_t *ct = json_object_get(cfg, "chat_template");
        const char *tmpl = json_string_value(ct);
        for (size_t k = 0; !tmpl && json_is_array(ct) && k < json_array_size(ct); k++) {
            const char *nm = json_string_value(json_object_get(json_array_get(ct, k), "name"));
            if (nm && !strcmp(nm, "default")) tmpl = json_string_value(json_object_get(json_array_get(ct, k), "template"));
        }
        if (tmpl && !(m->chat_template = strdup(tmpl))) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto fail; }
        json_decref(cfg);
        cfg = NULL;
    }
    /* transformers >= 4.43 saves the template as its own file */
    if (!m->chat_template && moet_path_join(p, sizeof p, path, "chat_template.jinja") && moet_file_exists(p)) {
        size_t tl;
        if ((rc = moet_file_read_all(p, 1u << 22, &m->chat_template, &tl, err, errlen))) goto fail;
    }
backend:
    if ((rc = moet_model_backend_open(m, &o, err, errlen))) goto fail;
    if (o.verbose)
        MOET_LOGI("loaded %s (%s): %d layers, %d experts (top %d), %.1fM params, %.1f MiB, %.2f s", path, m->hp.architecture,
                  m->hp.n_layers, m->hp.n_experts, m->hp.n_experts_used, (double)m->n_params / 1e6,
                  (double)m->weight_bytes / (1 << 20), moet_time_s() - t0);
    *out = m;
    return MOET_OK;
fail:
    json_decref(cfg);
    moet_model_free(m);
    return rc;
}

void moet_model_info_get(const moet_model *m, moet_model_info *info) {
    const moet_hparams *hp = &m->hp;
    info->architecture = hp->architecture;
    info->vocab_size = hp->vocab;
    info->hidden_size = hp->hidden;
    info->n_layers = hp->n_layers;
    info->n_heads = hp->n_heads;
    info->n_kv_heads = hp->n_kv_heads;
    info->head_dim = hp->head_dim;
    info->n_experts = hp->n_experts;
    info->n_experts_used = hp->n_experts_used;
    info->expert_ffn = hp->expert_ffn;
    info->dense_ffn = hp->dense_ffn;
    info->max_positions = hp->max_pos;
    info->n_params = m->n_params;
    info->weight_bytes = m->weight_bytes;
    info->backend = m->be ? m->be->ops->name : "none";
    info->device = m->be ? m->be->ops->device_name(m->be) : "none";
    info->expert_slots = m->expert_slots;
    info->router = hp->router_scoring == MOET_ROUTER_SIGMOID ? "sigmoid"
                   : hp->router_scoring == MOET_ROUTER_TOPK_SOFTMAX ? "top-k softmax" : "softmax";
    info->norm_topk = hp->norm_topk;
    info->n_group = hp->n_group;
    info->topk_group = hp->topk_group;
    info->route_scale = hp->route_scale;
    info->shared_ffn = hp->shared_ffn;
    info->rope_dim = hp->rope_dim;
    info->rope_scaling = hp->rope_type == MOET_ROPE_YARN ? "yarn" : "none";
    info->rope_factor = hp->rope_type == MOET_ROPE_YARN ? hp->rope_factor : 0.0f;
    info->q_lora_rank = hp->q_lora_rank;
    info->kv_lora_rank = hp->kv_lora_rank;
    info->v_head_dim = hp->kv_lora_rank > 0 ? hp->v_head_dim : hp->head_dim;
    info->sliding_window = hp->sliding_window;
    info->n_sliding = 0;
    for (int l = 0; hp->layer_sliding && l < hp->n_layers; l++) info->n_sliding += hp->layer_sliding[l];
    info->swiglu_limit = hp->swiglu_limit;
    info->has_delta = 0;
    info->delta_residual = 0;
    for (int l = 0; l < m->hp.n_layers && !info->delta_residual; l++) info->delta_residual = m->layers && m->layers[l].dres_gate;
    for (int l = 0; l < m->hp.n_layers && !info->has_delta; l++) info->has_delta = m->layers && (m->layers[l].dexp_gate || m->layers[l].dres_gate);
}

static void ecache_counts(const moet_model *m, int64_t st[5]) {
    memset(st, 0, 5 * sizeof(int64_t));
    if (m->be && m->be->ops->expert_cache_stats) m->be->ops->expert_cache_stats(m->be, st);
}

void moet_model_expert_cache_stats(const moet_model *m, int64_t *fetched, int64_t *evicted, int64_t *replays) {
    int64_t st[5];
    ecache_counts(m, st);
    if (fetched) *fetched = st[0];
    if (evicted) *evicted = st[1];
    if (replays) *replays = st[2];
}

void moet_model_expert_cache_uses(const moet_model *m, int64_t *uses, int64_t *misses) {
    int64_t st[5];
    ecache_counts(m, st);
    if (uses) *uses = st[3];
    if (misses) *misses = st[4];
}

const moet_tokenizer *moet_model_tokenizer(const moet_model *m) { return m->tok; }

const char *moet_model_chat_template(const moet_model *m) { return m->chat_template; }

int moet_model_eos_ids(const moet_model *m, int32_t *ids, int cap) {
    int n = m->hp.n_eos < cap ? m->hp.n_eos : cap;
    memcpy(ids, m->hp.eos_ids, (size_t)n * sizeof(int32_t));
    return n;
}
