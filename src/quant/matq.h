/*
 * matq.h — quantizing one weight matrix [rows × cols] (out × in, HF layout) to a format, with the machinery the
 * 2-bit base needs: incoherence processing (random-sign block Hadamard on the input dimension), importance-weighted
 * scale search, a fitted sign-symmetric level beta, and GPTQ/LDLQ-style error feedback across columns using the
 * calibration Hessian H = E[x x^T] of the matrix's inputs.
 *
 * The roundtrip entry point returns the dequantized matrix in the original basis: what a kernel computing
 * y = dequant(Q) · (R^T x) produces. It is the oracle for packs and GPU kernels, and what the quality table measures.
 */
#ifndef MOET_QUANT_MATQ_H
#define MOET_QUANT_MATQ_H

#include <stdint.h>

typedef enum {
    MOET_QF_BF16, MOET_QF_Q8_0, MOET_QF_MXFP4, MOET_QF_NVFP4, MOET_QF_INT2, MOET_QF_ASYM2, MOET_QF_SYM2, MOET_QF_W2,
    MOET_QF_W2_NVFP4,  /* W2 base + NVFP4 delta of the residual W - dequant(W2): 2.25 + 4.5 bpw */
    MOET_QF_W2_W2,     /* W2 base + a second W2 stage on the residual: 2.25 + 2.25 bpw (NVFP4's budget) */
    MOET_QF_COUNT
} moet_qformat;

const char *moet_qformat_name(moet_qformat f);
int moet_qformat_parse(const char *s); /* -1 if unknown */
double moet_qformat_bpw(moet_qformat f);

typedef struct {
    moet_qformat format;
    int rotate;        /* W2: random-sign block Hadamard on the input dimension */
    int gptq;          /* W2: error feedback with H (needs H) */
    int search;        /* W2: importance-weighted scale search */
    float beta;        /* W2: inner level; 0 = fit per matrix */
    float damp;        /* GPTQ dampening, fraction of mean diag(H) */
    uint64_t seed;     /* rotation signs */
} moet_matq_options;

moet_matq_options moet_matq_default_options(moet_qformat f);

typedef struct {
    double err_w;      /* sum (W - deq)^2 / sum W^2 */
    float beta;        /* chosen beta (W2) */
} moet_matq_stats;

/* H: cols × cols (row-major, symmetric, mean x x^T), or NULL (then imp = 1 and no error feedback).
 * out may equal W. Returns 0, or -1 on bad arguments / out of memory.
 * Delta formats: out receives the W2 base alone and out_delta (required) base + delta; st->err_w is the base's. */
int moet_matq_roundtrip(const float *W, int64_t rows, int64_t cols, const double *H, const moet_matq_options *o,
                        float *out, moet_matq_stats *st);
int moet_matq_roundtrip_delta(const float *W, int64_t rows, int64_t cols, const double *H, const moet_matq_options *o,
                              float *out, float *out_delta, moet_matq_stats *st);
static inline int moet_qformat_has_delta(int f) { return f == MOET_QF_W2_NVFP4 || f == MOET_QF_W2_W2; }

/* What a packed matrix needs beside its blocks. */
typedef struct {
    int32_t type;      /* MOET_TYPE_* of the blocks */
    float qscale, qbeta;
    uint32_t rot_seed;
    int32_t rotated;
} moet_matq_info;

int32_t moet_qformat_type(moet_qformat f);
/* As moet_matq_roundtrip, and also writes the packed rows (rows × moet_type_row_bytes(type, cols); in the rotated
 * basis when info->rotated) when blocks != NULL; out (required) receives the dequantized matrix. */
int moet_matq_quantize(const float *W, int64_t rows, int64_t cols, const double *H, const moet_matq_options *o,
                       float *out, void *blocks, moet_matq_info *info, moet_matq_stats *st);

/* Rotation used by W2: block size and the transform of one row in place (forward: w R; inverse: w R^T). */
int64_t moet_hadamard_block(int64_t cols);
void moet_rotate_row(double *w, int64_t cols, uint64_t seed, int inverse);
void moet_rotate_row_f32(float *w, int64_t cols, uint64_t seed, int inverse);

#endif
