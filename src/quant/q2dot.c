/*
 * q2dot.c — dot products straight from 2-bit blocks (W2, int2, sym2), for the CPU backend's decode-sized matmuls:
 * no widened copy of the row, the 4-level select and the block scale applied in registers.
 *
 * Two implementations of one function: the scalar reference (the oracle, in the order a reader expects) and an
 * AVX2+FMA one, picked at run time by CPU support. The AVX2 path keeps 8 lanes per row: codes go to lanes by a
 * variable shift, levels come from a permute of the 4-entry table, the scale multiplies once per block. Its sums
 * are ordered differently from the scalar one, so they agree to float rounding (tests/test_quant.c bounds it).
 */
#include "quant/formats.h"

#include <string.h>

#include "quant/dot_avx2.h"

void moet_q2_dot_rows_ref(const moet_q2_params *p, const moet_block_q2 *const *rows, int nr, const float *x,
                          int64_t n, float *out) {
    float lv[4];
    moet_q2_levels(p, lv);
    for (int r = 0; r < nr; r++) {
        float acc = 0.0f;
        for (int64_t g = 0; g < n / MOET_QK; g++) {
            const moet_block_q2 *b = rows[r] + g;
            float part = 0.0f;
            for (int j = 0; j < MOET_QK; j++) part += lv[(b->qs[j / 4] >> (2 * (j % 4))) & 3] * x[g * MOET_QK + j];
            acc += part * moet_q2_scale(p, b->sc);
        }
        out[r] = acc;
    }
}

/* The same products for nt tokens of one row, a block decoded once for all of them, each token's sums in the order
 * of moet_q2_dot_rows_ref for that token alone (the bit-identity tests/test_quant.c checks). */
void moet_q2_dot_tokens_ref(const moet_q2_params *p, const moet_block_q2 *row, const float *x, int64_t ldx, int nt,
                            int64_t n, float *out) {
    float lv[4];
    moet_q2_levels(p, lv);
    for (int t = 0; t < nt; t++) out[t] = 0.0f;
    for (int64_t g = 0; g < n / MOET_QK; g++) {
        const moet_block_q2 *b = row + g;
        float w[MOET_QK];
        for (int j = 0; j < MOET_QK; j++) w[j] = lv[(b->qs[j / 4] >> (2 * (j % 4))) & 3];
        const float sc = moet_q2_scale(p, b->sc);
        for (int t = 0; t < nt; t++) {
            const float *xg = x + (size_t)t * ldx + g * MOET_QK;
            float part = 0.0f;
            for (int j = 0; j < MOET_QK; j++) part += w[j] * xg[j];
            out[t] += part * sc;
        }
    }
}

#ifdef MOET_HAVE_AVX2_PATH
__attribute__((target("avx2,fma"))) static void dot_tokens_avx2(const moet_q2_params *p, const moet_block_q2 *row,
                                                                const float *x, int64_t ldx, int nt, int64_t n,
                                                                float *out) {
    float lv[4];
    moet_q2_levels(p, lv);
    const __m256 table = _mm256_setr_ps(lv[0], lv[1], lv[2], lv[3], lv[0], lv[1], lv[2], lv[3]);
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), three = _mm256_set1_epi32(3);
    __m256 acc[MOET_DOT_TOKENS];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < n / MOET_QK; g++) {
        const moet_block_q2 *b = row + g;
        __m256 w[4];
        for (int q = 0; q < 4; q++) {
            uint16_t c16;
            memcpy(&c16, b->qs + 2 * q, 2);
            w[q] = _mm256_permutevar8x32_ps(table, _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(c16), shifts), three));
        }
        const __m256 sc = _mm256_set1_ps(moet_q2_scale(p, b->sc));
        for (int t = 0; t < nt; t++) { /* dot_rows_avx2's operations for this token, in its order */
            const float *xg = x + (size_t)t * ldx + g * MOET_QK;
            __m256 part = _mm256_setzero_ps();
            for (int q = 0; q < 4; q++) part = _mm256_fmadd_ps(w[q], _mm256_loadu_ps(xg + 8 * q), part);
            acc[t] = _mm256_fmadd_ps(part, sc, acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        out[t] = moet_hsum8_avx2(acc[t]);
    }
}

__attribute__((target("avx2,fma"))) static void dot_rows_avx2(const moet_q2_params *p, const moet_block_q2 *const *rows,
                                                              int nr, const float *x, int64_t n, float *out) {
    float lv[4];
    moet_q2_levels(p, lv);
    const __m256 table = _mm256_setr_ps(lv[0], lv[1], lv[2], lv[3], lv[0], lv[1], lv[2], lv[3]);
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), three = _mm256_set1_epi32(3);
    for (int r = 0; r < nr; r++) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t g = 0; g < n / MOET_QK; g++) {
            const moet_block_q2 *b = rows[r] + g;
            const float *xg = x + g * MOET_QK;
            __m256 part = _mm256_setzero_ps();
            for (int q = 0; q < 4; q++) {  /* 8 weights from 2 bytes of codes */
                uint16_t c16;
                memcpy(&c16, b->qs + 2 * q, 2);
                const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(c16), shifts), three);
                part = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(table, idx), _mm256_loadu_ps(xg + 8 * q), part);
            }
            acc = _mm256_fmadd_ps(part, _mm256_set1_ps(moet_q2_scale(p, b->sc)), acc);
        }
        out[r] = moet_hsum8_avx2(acc);
    }
}
#endif

int moet_q2_dot_simd_available(void) {
#ifdef MOET_HAVE_AVX2_PATH
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

void moet_q2_dot_rows(const moet_q2_params *p, const moet_block_q2 *const *rows, int nr, const float *x, int64_t n,
                      float *out) {
#ifdef MOET_HAVE_AVX2_PATH
    if (moet_q2_dot_simd_available()) {
        dot_rows_avx2(p, rows, nr, x, n, out);
        return;
    }
#endif
    moet_q2_dot_rows_ref(p, rows, nr, x, n, out);
}

void moet_q2_dot_tokens(const moet_q2_params *p, const moet_block_q2 *row, const float *x, int64_t ldx, int nt,
                        int64_t n, float *out) {
#ifdef MOET_HAVE_AVX2_PATH
    if (moet_q2_dot_simd_available()) {
        dot_tokens_avx2(p, row, x, ldx, nt, n, out);
        return;
    }
#endif
    moet_q2_dot_tokens_ref(p, row, x, ldx, nt, n, out);
}
