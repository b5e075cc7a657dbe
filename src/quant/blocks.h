/*
 * blocks.h — block layouts of every quantized weight format, shared by the C and (future) CUDA code.
 *
 * A row of n weights (n a multiple of the block size) is n / block_size consecutive blocks. Formats with a
 * per-matrix parameter (the W2 level beta, the NVFP4 tensor scale, the 2-bit formats' scale base) keep it outside
 * the blocks (pack metadata), so the blocks stay fixed-size.
 *
 * Layout changes get a new type ID (types.h); IDs are never reused.
 */
#ifndef MOET_QUANT_BLOCKS_H
#define MOET_QUANT_BLOCKS_H

#include <stdint.h>

#define MOET_QK 32        /* weights per block of the 2-bit, Q8_0 and MXFP4 formats */
#define MOET_QK_NVFP4 16  /* weights per NVFP4 block */

/* Q8_0, byte-identical to ggml's block_q8_0: x = d * qs[i], d an IEEE half. 8.5 bpw. */
typedef struct {
    uint16_t d;
    int8_t qs[MOET_QK];
} moet_block_q8_0;

/* MXFP4, byte-identical to ggml's block_mxfp4 (OCP MX): x = e2m1(q) * 2^(e - 127); element j in the low nibble of
 * qs[j] for j < 16, element j in the high nibble of qs[j - 16] otherwise. 4.25 bpw. */
typedef struct {
    uint8_t e;
    uint8_t qs[MOET_QK / 2];
} moet_block_mxfp4;

/* NVFP4: x = e2m1(q) * e4m3(scale) * tensor_scale (fp32 per matrix); nibbles as MXFP4 (low = first half). 4.5 bpw. */
typedef struct {
    uint8_t scale;
    uint8_t qs[MOET_QK_NVFP4 / 2];
} moet_block_nvfp4;

/* The 2-bit formats (W2 and the ablation baselines int2, sym2): a log-coded group scale and 32 2-bit codes, four
 * per byte, element j at bits 2*(j%4) of qs[j/4]. 2.25 bpw.
 *   group scale  s = base * 2^((sc - 255) / 16)          (base: per-matrix f32, the largest group scale)
 *   W2           code -> {-1, -beta, +beta, +1}[code] * s (beta per matrix; sign-symmetric by construction)
 *   int2         code -> {-2, -1, 0, +1}[code] * s        (two's complement: the asymmetric baseline)
 *   sym2         code -> {-1.5, -0.5, +0.5, +1.5}[code] * s
 * The log code gives 4.4% steps over a 2^16 range; the quantizer searches codes, so rounding the scale costs little. */
typedef struct {
    uint8_t sc;
    uint8_t qs[MOET_QK / 4];
} moet_block_q2;

/* asym2 (ablation): affine min-max per group, x = code * d + m, codes 0..3; d and m log-coded like the 2-bit scale
 * (m with a sign bit: bit 7 sign, bits 0-6 magnitude code in steps of 2^(1/8)). 2.5 bpw. */
typedef struct {
    uint8_t d;
    uint8_t m;
    uint8_t qs[MOET_QK / 4];
} moet_block_asym2;

#ifdef __cplusplus /* the CUDA files (nvcc compiles them as C++) */
#define MOET_STATIC_ASSERT static_assert
#else
#define MOET_STATIC_ASSERT _Static_assert
#endif
MOET_STATIC_ASSERT(sizeof(moet_block_q8_0) == 34, "q8_0 block is 34 bytes (ggml)");
MOET_STATIC_ASSERT(sizeof(moet_block_mxfp4) == 17, "mxfp4 block is 17 bytes (ggml)");
MOET_STATIC_ASSERT(sizeof(moet_block_nvfp4) == 9, "nvfp4 block is 9 bytes");
MOET_STATIC_ASSERT(sizeof(moet_block_q2) == 9, "2-bit block is 9 bytes: 2.25 bpw");
MOET_STATIC_ASSERT(sizeof(moet_block_asym2) == 10, "asym2 block is 10 bytes: 2.5 bpw");

#endif
