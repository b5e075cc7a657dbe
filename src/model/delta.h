/*
 * delta.h — delta packs: the FP4 residual of a W2 pack's routed experts, in a second GGUF v3 file
 * (`moet quantize --experts w2+nvfp4` writes OUT.gguf and OUT.delta.gguf; docs/format.md).
 *
 * Why a second file: the base pack alone is the model at 2.25 bpw; the delta (4.5 bpw more) is only read for the
 * picks that carry a token's routing weight (--delta pick, the default: docs/quality.md) or the steps the
 * confidence gate corrects, so it can live where the expert cache's slow tier lives, and a deployment that never
 * corrects does not ship it. The two files are tied by an id the writer draws (moet.pack_id in the pack,
 * moet.base_pack_id in the delta): a delta is never applied to another base.
 *
 * Loading maps the file and installs each residual where it lies as the layer's dres_* weights (NVFP4, its own
 * rotation): the "on" expert is exp_* + dres_*, which backends multiply as stored (backend.h, moet_moe_args.dgate),
 * so the "on" tier costs 4.5 bpw of mapped file, not an f32 copy of every expert.
 */
#ifndef MOET_MODEL_DELTA_H
#define MOET_MODEL_DELTA_H

#include <stdint.h>

#include "model/model.h"

#define MOET_DELTA_FORMAT_VERSION 1

typedef struct {
    const int64_t *task_layer; /* [n_tasks] layer of each (layer, expert) task, experts in order within a layer */
    int64_t n_tasks;
    const float *qparams;      /* [task*3+k][4] (qscale, qbeta, rot_seed, rotated) of each delta matrix (finish) */
    const char *pack_id;       /* the base pack's moet.pack_id */
} moet_delta_data;

/* The delta pack of base model m (its routed experts' shapes), written as a stream, crash-safely (temporary +
 * rename): begin lays it out and writes its header (tidx[task*3+k] = the tensor of matrix k's residual, for
 * moet_gguf_writer_put as each is quantized); finish writes the qparams (d->qparams, complete by then) and closes it. */
int moet_delta_begin(const moet_model *m, const char *path, const moet_delta_data *d, moet_gguf_writer **out,
                     size_t *tidx, char *err, size_t errlen);
int moet_delta_finish(moet_gguf_writer *w, const moet_delta_data *d, const size_t *tidx, int64_t n_experts, char *err,
                      size_t errlen);
/* Loads a delta pack over m (loaded from a pack): validates it against m and installs dres_* (the mapping moves to
 * m->delta_pack). A load-time step; n_threads is unused (nothing is computed). */
int moet_delta_load(moet_model *m, const char *path, int n_threads, char *err, size_t errlen);
/* The default delta path of a pack: "X.gguf" -> "X.delta.gguf" (else path + ".delta.gguf"); 0 if it fits in cap. */
int moet_delta_default_path(const char *pack_path, char *out, size_t cap);

#endif
