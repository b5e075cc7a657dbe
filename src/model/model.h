/*
 * model.h — the inside of moet_model, and the binding helpers architecture files use.
 */
#ifndef MOET_MODEL_MODEL_H
#define MOET_MODEL_MODEL_H

#include "backend/backend.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/arch.h"
#include "model/hparams.h"
#include "moet.h"

struct moet_model {
    moet_hparams hp;
    const moet_arch *arch;
    moet_st_set st;
    uint8_t *st_used;          /* [st.n_tensors]: bound by the architecture */
    moet_gguf *pack;           /* when loaded from a pack: tensors come from here instead of st */
    moet_gguf *delta_pack;     /* a delta pack loaded beside it: the layers' dres_* point into its mapping */
    moet_tokenizer *tok;
    moet_backend *be;
    int64_t expert_slots;      /* the expert cache's slots (0: every expert resident) */
    moet_weight tok_embd, output;
    const float *out_norm;
    moet_layer *layers;
    float **f32_bufs;          /* owned f32 copies of small vectors (norms, biases) */
    size_t n_f32_bufs, cap_f32_bufs;
    int64_t n_params, weight_bytes;
    char *chat_template;       /* from tokenizer_config.json, may be NULL */
    void **be_bufs;            /* backend memory holding weights (synthetic models), released before the backend */
    size_t n_be_bufs;
};

/* A model of a real architecture's shape with random weights, built in backend memory (no file): for benchmarks.
 * With opt->expert_slots > 0 on a device backend, the routed experts (and residuals) are built in host memory
 * instead and the device holds that many in its expert cache: the cache's fetches and replays, measured.
 * shape: "qwen3-30b-a3b", "qwen3-235b-a22b", "glm-4.5-air" or "mini" (a tiny one for tests); expert_type a MOET_TYPE_*. delta (W2
 * experts only): random NVFP4 residuals beside them as well (the layers' dres_*, a delta pack's form). proj_type:
 * the attention projections and lm_head, MOET_TYPE_BF16 or MOET_TYPE_Q8_0 (a pack's --dense q8_0; the embedding
 * and the router stay BF16). */
int moet_model_synthetic(const char *shape, int32_t expert_type, int delta, int32_t proj_type,
                         const moet_model_options *opt, moet_model **out, char *err, size_t errlen);

/* Creates the backend a device string names ("cpu", "cuda", "cuda:N", NULL/"auto"). */
int moet_backend_open(const char *device, int n_threads, moet_backend **out, char *err, size_t errlen);

/* m->be for the options: the device's backend, with its expert cache set up (moet_model_cache_setup). */
int moet_model_backend_open(struct moet_model *m, const moet_model_options *o, char *err, size_t errlen);
/* The expert cache of o->expert_slots slots, or of as many as o->expert_slots_gib GiB hold (the model's experts must
 * be bound: a slot's size is one expert's); nothing when neither is set. */
int moet_model_cache_setup(struct moet_model *m, const moet_model_options *o, char *err, size_t errlen);

/* --expert-slots auto (MOET_EXPERT_SLOTS_AUTO) on backend be, before any weight is on the device: *slots = 0 (every
 * expert resident) when dense_bytes + n_experts experts of slot_bytes fit the device's free memory with the reserve
 * (reserve_gib, <= 0: 10% of the device, at least 2 GiB) to spare, else as many slots as the memory beside the dense
 * weights and the reserve holds; an error when that is fewer than min_slots (one token's experts at a layer). A host
 * backend (no mem_info): 0. */
int moet_expert_slots_auto(moet_backend *be, uint64_t dense_bytes, uint64_t slot_bytes, int64_t n_experts,
                           int64_t min_slots, double reserve_gib, int64_t *slots, char *err, size_t errlen);

/* Binds a 2-D tensor of exactly [rows, cols] (F32/F16/BF16). */
int moet_bind_matrix(struct moet_model *m, const char *name, int64_t rows, int64_t cols, moet_weight *w, char *err,
                     size_t errlen);
/* Binds rows [r0, r0+rows) of slice `index` of a 3-D tensor [n, total_rows, cols] (fused expert tensors). */
int moet_bind_matrix_slice(struct moet_model *m, const char *name, int64_t n, int64_t index, int64_t total_rows,
                           int64_t r0, int64_t rows, int64_t cols, moet_weight *w, char *err, size_t errlen);
/* Binds a 1-D tensor of n elements as an owned f32 copy. */
int moet_bind_vector(struct moet_model *m, const char *name, int64_t n, const float **out, char *err, size_t errlen);
/* True if the checkpoint has a tensor of this name. */
int moet_has_tensor(const struct moet_model *m, const char *name);
/* Room in m->f32_bufs (the model's owned f32 buffers) for `extra` more. 0, or MOET_ENOMEM. */
int moet_model_f32_reserve(struct moet_model *m, size_t extra);
/* Drops every MoE layer's dexp_gate/up/down (base + delta experts) and dres_* (a delta pack's residuals: they belong
 * to the old base); with alloc, gives each layer fresh zeroed dexp arrays for the caller to fill. 0, or MOET_ENOMEM. */
int moet_model_dexp_reset(struct moet_model *m, int alloc);

#endif
