/*
 * formats.h — scalar reference quantizers and dequantizers (the oracle every fast kernel is checked against).
 *
 * Each *_quantize_row writes n / block_size blocks (n a multiple of the block size); imp (may be NULL) weights the
 * error each scale search minimises: sum imp_j (x_j - q_j)^2, with imp_j the activation second moment of input
 * channel j (calibration), or 1.
 */
#ifndef MOET_QUANT_FORMATS_H
#define MOET_QUANT_FORMATS_H

#include <stdint.h>

#include "quant/blocks.h"

float moet_e4m3_to_f32(uint8_t v);
uint8_t moet_f32_to_e4m3(float x); /* round to nearest, saturating at 448 */
uint16_t moet_f32_to_f16(float x);
/* x rounded to the nearest f16 value (as an f32) */
float moet_f16_round(float x);

/* The sixteen E2M1 values, index = 4-bit code (bit 3 sign). */
extern const float moet_e2m1_values[16];
/* Nearest E2M1 code of x (ties to the even code, as rounding to nearest even does). */
uint8_t moet_e2m1_nearest(float x);

void moet_q8_0_quantize_row(const float *x, moet_block_q8_0 *b, int64_t n);
void moet_q8_0_dequantize_row(const moet_block_q8_0 *b, float *y, int64_t n);
void moet_mxfp4_quantize_row(const float *x, moet_block_mxfp4 *b, int64_t n);
void moet_mxfp4_dequantize_row(const moet_block_mxfp4 *b, float *y, int64_t n);
/* tensor_scale: moet_nvfp4_tensor_scale(amax of the whole matrix). */
float moet_nvfp4_tensor_scale(float amax);
void moet_nvfp4_quantize_row(const float *x, float tensor_scale, moet_block_nvfp4 *b, int64_t n);
void moet_nvfp4_dequantize_row(const moet_block_nvfp4 *b, float tensor_scale, float *y, int64_t n);

/* The 2-bit family (moet_block_q2). */
typedef enum { MOET_Q2_W2 = 0, MOET_Q2_INT2 = 1, MOET_Q2_SYM2 = 2 } moet_q2_kind;
typedef struct {
    moet_q2_kind kind;
    float base;   /* scale base: the largest group scale of the matrix (see blocks.h) */
    float beta;   /* W2 inner level */
} moet_q2_params;
void moet_q2_levels(const moet_q2_params *p, float lv[4]);
static inline float moet_q2_scale(const moet_q2_params *p, uint8_t sc) {
    return p->base * __builtin_exp2f(((float)sc - 255.0f) / 16.0f);
}
uint8_t moet_q2_scale_code(const moet_q2_params *p, float s); /* nearest code, clamped */
/* Quantizes one group of 32 with the group scale chosen by `search` (0: the format's naive absmax rule;
 * 1: the code minimising the imp-weighted error). Returns the weighted squared error. */
double moet_q2_quantize_group(const moet_q2_params *p, const float *x, const float *imp, int search,
                              moet_block_q2 *b);
void moet_q2_dequantize_row(const moet_q2_params *p, const moet_block_q2 *b, float *y, int64_t n);
/* out[r] = row r . x for nr rows of n weights (n a multiple of 32) read straight from their 2-bit blocks (q2dot.c):
 * the AVX2+FMA version where the CPU has it, else the scalar reference; _ref is always the scalar one. */
void moet_q2_dot_rows(const moet_q2_params *p, const moet_block_q2 *const *rows, int nr, const float *x, int64_t n,
                      float *out);
void moet_q2_dot_rows_ref(const moet_q2_params *p, const moet_block_q2 *const *rows, int nr, const float *x,
                          int64_t n, float *out);
int moet_q2_dot_simd_available(void);
/* out[r] = row r . x for nr NVFP4 rows of n weights (n a multiple of 16; ts the tensor scale) read straight from their
 * blocks (fp4dot.c): AVX2+FMA where the CPU has it (moet_q2_dot_simd_available), else the scalar reference. */
void moet_nvfp4_dot_rows(const moet_block_nvfp4 *const *rows, int nr, float ts, const float *x, int64_t n, float *out);
void moet_nvfp4_dot_rows_ref(const moet_block_nvfp4 *const *rows, int nr, float ts, const float *x, int64_t n,
                             float *out);
/* The same products for nt <= MOET_DOT_TOKENS tokens of one row (token t at x + t ldx): each out[t] bit for bit what
 * the _dot_rows function (_ref: its _ref) gives for that token alone, with each block decoded once for all nt. The
 * CPU backend takes these at every token count, so its products of a 2-bit or NVFP4 matrix do not depend on how many
 * tokens share it in a step (a window at once = token by token, a batch = each sequence alone). */
#define MOET_DOT_TOKENS 64
void moet_q2_dot_tokens(const moet_q2_params *p, const moet_block_q2 *row, const float *x, int64_t ldx, int nt,
                        int64_t n, float *out);
void moet_q2_dot_tokens_ref(const moet_q2_params *p, const moet_block_q2 *row, const float *x, int64_t ldx, int nt,
                            int64_t n, float *out);
void moet_nvfp4_dot_tokens(const moet_block_nvfp4 *row, float ts, const float *x, int64_t ldx, int nt, int64_t n,
                           float *out);
void moet_nvfp4_dot_tokens_ref(const moet_block_nvfp4 *row, float ts, const float *x, int64_t ldx, int nt, int64_t n,
                               float *out);
/* Nearest level code of v for scale s. */
uint8_t moet_q2_nearest(const float lv[4], float s, float v);

void moet_asym2_quantize_row(const float *x, float base, moet_block_asym2 *b, int64_t n);
void moet_asym2_dequantize_row(const moet_block_asym2 *b, float base, float *y, int64_t n);

#endif
