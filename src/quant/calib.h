/*
 * calib.h — calibration statistics per routed expert: the second-moment matrices H = sum x x^T of the inputs of
 * gate/up (the normed hidden state of the tokens routed to the expert) and of down (the expert's SwiGLU
 * activation), and the token counts. Collected by running the engine on calibration text; consumed by the
 * quantizer's scale search (diag H) and error feedback (H).
 */
#ifndef MOET_QUANT_CALIB_H
#define MOET_QUANT_CALIB_H

#include <stdint.h>

#include "moet.h"

typedef struct {
    int32_t n_layers, n_experts, hidden, ffn;
    double **h_in;    /* [layer] -> [E][hidden][hidden], NULL for dense layers */
    double **h_down;  /* [layer] -> [E][ffn][ffn] */
    int64_t **count;  /* [layer] -> [E] tokens routed */
    int64_t tokens;   /* calibration tokens evaluated */
} moet_calib;

moet_calib *moet_calib_create(const moet_model *m);
void moet_calib_free(moet_calib *c);
/* The mean second-moment matrix E[x x^T] (full, symmetric, malloc'd) of expert e's gate/up inputs (which = 0) or down
 * inputs (which = 1) in layer l; NULL without statistics for it. */
double *moet_calib_hessian(const moet_calib *c, int l, int64_t e, int which);
/* The rotation seed of a routed-expert matrix (k: 0 gate, 1 up, 2 down): gate and up share their input, so their
 * rotation; down has its own. Packs store it; the quantizer and the in-memory roundtrip both take it from here. */
static inline uint64_t moet_expert_rot_seed(int l, int k) { return (uint64_t)l * 2 + (k == 2 ? 2 : 1); }
/* Runs the model over `text` in windows of ctx tokens (at most max_tokens) collecting statistics. */
int moet_calib_run(const moet_model *m, moet_calib *c, const char *text, size_t len, int32_t ctx, int64_t max_tokens,
                   char *err, size_t errlen);

#endif
