/*
 * fp4dot.c — dot products straight from NVFP4 blocks, for the CPU backend's decode-sized matmuls: the FP4 delta's
 * residuals are multiplied where they lie (a delta pack stays mapped), so every delta step reads them; widening each
 * row to f32 first (the generic path) cost a delta-on perplexity run of moe-mini-c 1.32 s against 0.84 s off.
 *
 * As q2dot.c: the scalar reference (the oracle) and an AVX2+FMA version picked at run time. The AVX2 path widens a
 * block's 8 code bytes to 8 lanes, takes the low nibbles (elements 0..7) and the high ones (8..15), looks the
 * magnitudes up with one permute of the 8-entry table and sets the sign bits by xor; the block scale multiplies once.
 * Its sums are ordered differently from the reference's, so they agree to float rounding (tests/test_quant.c).
 */
#include "quant/formats.h"

#include <string.h>

#include "quant/dot_avx2.h"

void moet_nvfp4_dot_rows_ref(const moet_block_nvfp4 *const *rows, int nr, float ts, const float *x, int64_t n,
                             float *out) {
    for (int r = 0; r < nr; r++) {
        float acc = 0.0f;
        for (int64_t g = 0; g < n / MOET_QK_NVFP4; g++) {
            const moet_block_nvfp4 *b = rows[r] + g;
            const float *xg = x + g * MOET_QK_NVFP4;
            float part = 0.0f;
            for (int j = 0; j < MOET_QK_NVFP4 / 2; j++)
                part += moet_e2m1_values[b->qs[j] & 15] * xg[j] + moet_e2m1_values[b->qs[j] >> 4] * xg[j + 8];
            acc += part * (moet_e4m3_to_f32(b->scale) * ts);
        }
        out[r] = acc;
    }
}

/* nt tokens of one row, each token's sums in moet_nvfp4_dot_rows_ref's order for it alone (as q2dot.c's) */
void moet_nvfp4_dot_tokens_ref(const moet_block_nvfp4 *row, float ts, const float *x, int64_t ldx, int nt, int64_t n,
                               float *out) {
    for (int t = 0; t < nt; t++) out[t] = 0.0f;
    for (int64_t g = 0; g < n / MOET_QK_NVFP4; g++) {
        const moet_block_nvfp4 *b = row + g;
        float lo[MOET_QK_NVFP4 / 2], hi[MOET_QK_NVFP4 / 2];
        for (int j = 0; j < MOET_QK_NVFP4 / 2; j++) {
            lo[j] = moet_e2m1_values[b->qs[j] & 15];
            hi[j] = moet_e2m1_values[b->qs[j] >> 4];
        }
        const float sc = moet_e4m3_to_f32(b->scale) * ts;
        for (int t = 0; t < nt; t++) {
            const float *xg = x + (size_t)t * ldx + g * MOET_QK_NVFP4;
            float part = 0.0f;
            for (int j = 0; j < MOET_QK_NVFP4 / 2; j++) part += lo[j] * xg[j] + hi[j] * xg[j + 8];
            out[t] += part * sc;
        }
    }
}

#ifdef MOET_HAVE_AVX2_PATH
/* moet_e4m3_to_f32 by its bits (normal: exponent e - 7, 3 mantissa bits; e = 0: m 2^-9; 0x7f / 0xff NaN). */
static inline float e4m3_bits(uint8_t v) {
    const uint32_t e = (v >> 3) & 15u, m = v & 7u;
    if (e == 15 && m == 7) return moet_e4m3_to_f32(v);
    if (e == 0) return (v & 0x80 ? -1.0f : 1.0f) * (float)m * (1.0f / 512.0f);
    const uint32_t u = (uint32_t)(v & 0x80) << 24 | (e + 120) << 23 | m << 20;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A block's 16 values as two 8-lane vectors (elements 0..7 from the low nibbles, 8..15 from the high ones): the
 * magnitude from the 8-entry table by its code & 7, the sign bit of code & 8 moved to bit 31. */
__attribute__((target("avx2,fma"))) static inline void nv_decode_avx2(const moet_block_nvfp4 *b, __m256 *vlo,
                                                                      __m256 *vhi) {
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i seven = _mm256_set1_epi32(7), eight = _mm256_set1_epi32(8);
    uint64_t q;
    memcpy(&q, b->qs, 8);
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)q)), hi = _mm256_srli_epi32(lo, 4);
    *vlo = _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, _mm256_and_si256(lo, seven)),
                         _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(lo, eight), 28)));
    *vhi = _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, _mm256_and_si256(hi, seven)),
                         _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(hi, eight), 28)));
}

__attribute__((target("avx2,fma"))) static void dot_rows_avx2(const moet_block_nvfp4 *const *rows, int nr, float ts,
                                                              const float *x, int64_t n, float *out) {
    for (int r = 0; r < nr; r++) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t g = 0; g < n / MOET_QK_NVFP4; g++) {
            const moet_block_nvfp4 *b = rows[r] + g;
            const float *xg = x + g * MOET_QK_NVFP4;
            __m256 vlo, vhi;
            nv_decode_avx2(b, &vlo, &vhi);
            const __m256 part = _mm256_fmadd_ps(vhi, _mm256_loadu_ps(xg + 8), _mm256_mul_ps(vlo, _mm256_loadu_ps(xg)));
            acc = _mm256_fmadd_ps(part, _mm256_set1_ps(e4m3_bits(b->scale) * ts), acc);
        }
        out[r] = moet_hsum8_avx2(acc);
    }
}
#endif

#ifdef MOET_HAVE_AVX2_PATH
__attribute__((target("avx2,fma"))) static void dot_tokens_avx2(const moet_block_nvfp4 *row, float ts, const float *x,
                                                                int64_t ldx, int nt, int64_t n, float *out) {
    __m256 acc[MOET_DOT_TOKENS];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < n / MOET_QK_NVFP4; g++) {
        const moet_block_nvfp4 *b = row + g;
        __m256 vlo, vhi;
        nv_decode_avx2(b, &vlo, &vhi);
        const __m256 sc = _mm256_set1_ps(e4m3_bits(b->scale) * ts);
        for (int t = 0; t < nt; t++) { /* dot_rows_avx2's operations for this token, in its order */
            const float *xg = x + (size_t)t * ldx + g * MOET_QK_NVFP4;
            const __m256 part = _mm256_fmadd_ps(vhi, _mm256_loadu_ps(xg + 8), _mm256_mul_ps(vlo, _mm256_loadu_ps(xg)));
            acc[t] = _mm256_fmadd_ps(part, sc, acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        out[t] = moet_hsum8_avx2(acc[t]);
    }
}
#endif

void moet_nvfp4_dot_tokens(const moet_block_nvfp4 *row, float ts, const float *x, int64_t ldx, int nt, int64_t n,
                           float *out) {
#ifdef MOET_HAVE_AVX2_PATH
    if (moet_q2_dot_simd_available()) {
        dot_tokens_avx2(row, ts, x, ldx, nt, n, out);
        return;
    }
#endif
    moet_nvfp4_dot_tokens_ref(row, ts, x, ldx, nt, n, out);
}

void moet_nvfp4_dot_rows(const moet_block_nvfp4 *const *rows, int nr, float ts, const float *x, int64_t n, float *out) {
#ifdef MOET_HAVE_AVX2_PATH
    if (moet_q2_dot_simd_available()) { /* the same CPU check: AVX2 and FMA */
        dot_rows_avx2(rows, nr, ts, x, n, out);
        return;
    }
#endif
    moet_nvfp4_dot_rows_ref(rows, nr, ts, x, n, out);
}
