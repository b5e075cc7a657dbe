/*
 * requant.h — replaces a loaded model's routed experts by their quantize -> dequantize roundtrip (f32, owned by the
 * model), so every command measures a format's quality through the unchanged reference forward. A load-time step:
 * call it before the model is shared or any session exists.
 */
#ifndef MOET_QUANT_REQUANT_H
#define MOET_QUANT_REQUANT_H

#include "backend/backend.h"
#include "moet.h"
#include "quant/calib.h"
#include "quant/matq.h"

typedef struct {
    double rel_err;      /* sum |W - deq|^2 / sum |W|^2 over all routed experts */
    double mean_beta;    /* W2 */
    int64_t n_matrices;
    double seconds;
} moet_requant_stats;

/* The matrix widened to f32 (malloc'd, rows × cols), or NULL when out of memory. */
float *moet_weight_widen(const moet_weight *w);
/* Row r of w as f32 (every type, MOET_TYPE_F8_E4M3 with its block scales): the widening every host path uses. */
void moet_weight_row_f32(const moet_weight *w, int64_t r, float *dst);

int moet_model_requant_experts(moet_model *m, const moet_matq_options *o, const moet_calib *c, int n_threads,
                               moet_requant_stats *st, char *err, size_t errlen);

#endif
