/*
 * dot_avx2.h — what the AVX2 block dots (q2dot.c, fp4dot.c) share: the switch that compiles them and the end of every
 * such dot, the 8 lanes summed in one fixed order. One copy, because the one-token and the token-batched forms must
 * end alike for their results to be bit-identical (batch invariance, quant/formats.h).
 */
#ifndef MOET_QUANT_DOT_AVX2_H
#define MOET_QUANT_DOT_AVX2_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MOET_HAVE_AVX2_PATH 1

/* lanes 0-3 + lanes 4-7, then (0 + 2, 1 + 3), then their sum */
__attribute__((target("avx2,fma"))) static inline float moet_hsum8_avx2(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#endif

#endif
