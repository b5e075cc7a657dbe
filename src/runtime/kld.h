/*
 * kld.h — compact next-token distributions for KL-divergence runs (`moet perplexity --save-logits/--kld-base`).
 *
 * Why compact: a full-vocabulary dump is V floats per position (150k-token vocabularies: 600 KB a position). We
 * keep, per position, the K most probable tokens' exact log-probabilities (ids sorted by probability) and the log
 * of the remaining mass. KL(P_base || Q) is then computed over K+1 outcomes (the K tokens and "everything else"):
 * by the data-processing inequality this never exceeds the full-vocabulary KL, and equals it when K = V. The
 * default K = min(V, 1024) makes it exact for vocabularies up to 1024 and, for peaked distributions, within
 * rounding of it beyond. docs/format.md describes the file.
 *
 * File: "MOETKLD1" | u32 version=1 | u32 vocab | u32 ctx | u32 topk | u64 n_positions | u64 tokens_fnv1a |
 *       n_positions × { f32 rest_logp | i32 ids[topk] | f32 logp[topk] }   (little-endian)
 */
#ifndef MOET_RUNTIME_KLD_H
#define MOET_RUNTIME_KLD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    uint32_t vocab, ctx, topk;
    uint64_t n_positions, tokens_hash;
} moet_kld_header;

/* log_softmax of one row (double accumulation). */
void moet_log_softmax(const float *logits, int32_t V, float *out);
/* Record of one position from its log-probs: writes ids/logp (topk each) and rest. scratch: V int32. */
void moet_kld_record(const float *logp, int32_t V, uint32_t topk, int32_t *scratch, int32_t *ids, float *lp,
                     float *rest);
/* KL(base || q) over the base's top-k + rest buckets, q given as full log-probs. mark: V zeroed bytes (left zeroed);
 * q's rest mass is summed over the tokens outside the base's top-k, never taken as 1 - sum (no cancellation). */
double moet_kld_eval(const int32_t *ids, const float *lp, float rest, uint32_t topk, const float *logq, int32_t V,
                     uint8_t *mark);

int moet_kld_write_header(FILE *f, const moet_kld_header *h);
int moet_kld_read_header(FILE *f, moet_kld_header *h); /* 0 ok, -1 bad/short */
uint64_t moet_fnv1a_ids(const int32_t *ids, size_t n);

#endif
