/* session_int.h — internal session hooks (calibration statistics collection). */
#ifndef MOET_RUNTIME_SESSION_INT_H
#define MOET_RUNTIME_SESSION_INT_H

#include "backend/backend.h"
#include "moet.h"
#include "quant/calib.h"

/* As moet_session_create, computing on `be` instead of the model's backend (NULL: the model's). be must outlive the
 * session and read weights from host memory (the CPU backend). */
int moet_session_create_on(const moet_model *m, moet_backend *be, const moet_session_options *opt, moet_session **out,
                           char *err, size_t errlen);

/* While set, every MoE layer's forward accumulates its experts' input statistics into c. */
void moet_session_set_calib(moet_session *s, moet_calib *c);

/* While set (buf: n_layers x n x 2 floats for evals of n tokens), every MoE layer writes its router statistics for
 * the chunk it runs (backend.h, moet_moe_args.route_stats; the CPU backend) to buf + layer x 2n; NULL stops. */
void moet_session_set_route_stats(moet_session *s, float *buf);

/* 0: base experts; 1: base + delta ("on"); the model must have delta weights for 1. */
void moet_session_use_delta(moet_session *s, int on);

/* Which picks the delta runs on (backend.h, moet_delta_pick): those whose routing weight is at least r times the
 * mean of the token's picks; r <= 0 (the default): every pick. Applies to use_delta steps and the gate's redos. */
int moet_session_set_delta_pick(moet_session *s, float r, char *err, size_t errlen);
/* While set (cnt: 2 counters), every MoE layer's forward adds the picks that ran with the delta to cnt[0] and all
 * its picks to cnt[1] (backend.h, moet_moe_args.delta_count; the CPU backend); NULL stops. */
void moet_session_set_delta_count(moet_session *s, int64_t *cnt);
float moet_session_delta_pick(const moet_session *s);

/* The confidence gate for one step: token runs on the base experts; if the top-1 probability of the resulting
 * distribution is below tau, the step is recomputed with base + delta, its KV entries replaced, and the corrected
 * logits are the session's. *corrected (may be NULL) is set to 1 when it was. tau = 0 never corrects (= off),
 * tau = 1 always does (= on, bit for bit: the corrected step is an ordinary delta step on the same cache). */
int moet_session_eval_gated(moet_session *s, int32_t token, float tau, int *corrected, char *err, size_t errlen);

/* The gate's confidence: the top-1 probability of a row of V logits (computed as moet_log_softmax does). */
float moet_gate_top1(const float *logits, int32_t V);
/* The same of row i of the last moet_batch_decode: from the row's candidates (the topk op's lz: the row stays on the
 * backend) when the batch kept them, else from the row. */
float moet_batch_top1(const moet_batch *b, int32_t i);
/* The same of the session's last eval's last row. */
float moet_session_top1(const moet_session *s);
/* The gate's correction of a step already taken: token (the session's last) again, on base + delta, replacing its
 * KV entries; the session's logits become the corrected ones. For callers that took the step elsewhere (a batch). */
int moet_session_redo_delta(moet_session *s, int32_t token, char *err, size_t errlen);

#endif
