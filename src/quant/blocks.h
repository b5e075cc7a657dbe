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

/* The 2-bit family's device layout ("tiled"; CUDA only, never in a file). The CUDA backend rewrites a W2 or sym2
 * expert matrix of R rows (R % 16 == 0) and C columns (C % 32 == 0) in place when it uploads it, into the order the
 * tensor-core kernels (backend/cuda/moe_tc.cu) consume, in the same R * C / 32 * 9 bytes:
 *   codes   uint32 words [R/16][C/32][32 lanes]: tile ti (rows 16ti ..), block b (columns 32b ..), lane l = 4g + t;
 *   scales  bytes after the codes, [R/16][C/32][16]: the block scale code sc of row 16ti + r, block b.
 * The levels split into two signs: level(code) = A u' + B v' with u' = +-1 from bit 1 of the code, v' = +-1 from
 * bit 0 (W2: A = (1 + beta) / 2, B = (1 - beta) / 2; sym2: A = 1, B = 1/2). Bit (h ? 31 - x : 15 - x) of lane l's
 * word, x = 4m + r, is set when the sign is negative, for: plane p = m >> 1 (0: u', 1: v'), half-block s = m & 1,
 * fragment register r, half h, i.e. row 16ti + g + 8 (r & 1), column 32b + 16s + 2t + 8 (r >> 1) + h: exactly the
 * A operand of mma.m16n8k16 (rows g / g + 8, columns 2t + h / 2t + 8 + h), so ((word << x) & 0x80008000) |
 * 0x3C003C00 is the f16x2 register r of mma m, +-1.0 each. The int2 baseline (not sign-symmetric: a constant term)
 * keeps the stored layout.
 * NVFP4 delta residuals have a tiled layout too, in the same R * C / 16 * 9 bytes (R % 16 == 0, C % 32 == 0, rows
 * exactly C/16 blocks):
 *   codes   uint32 pairs [R/16][C/32][32 lanes][2]: word s (0, 1) of lane l = 4g + t holds the k-step of columns
 *           32b + 16s ..: byte r (0..3) is row 16ti + g + 8 (r & 1), columns 2t + 8 (r >> 1) and the next one,
 *           first in the low nibble: the e2m1 codes of f16x2 register r of mma.m16n8k16's A operand;
 *   scales  bytes after the codes, [R/16][C/32][2][16]: the E4M3 scale of row 16ti + r, columns 32b + 16s ...
 * An e2m1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6} is an f16 whose low byte is 0, so a byte of codes is one byte
 * permute (the eight high bytes as a table) and the two sign bits away from its f16x2 register. */
#define MOET_TILE_ROWS 16

/* Q8_0 has a device layout too ("q8t"; CUDA only, never in a file), for dense matrices whose rows are whole groups
 * of 8 blocks (C % 256 == 0, every real model's widths). ggml's 34-byte blocks put every block's quants at an odd
 * 2-byte offset, so a 16-byte load never holds one block's quants alone; the CUDA backend rewrites such a matrix,
 * out of place (the stored one may still be read, e.g. a tied embedding), into groups of 8 blocks in the same
 * 8 * 34 = 272 bytes:
 *   bytes 0..15     the 8 blocks' f16 scales d, block k at 2k;
 *   bytes 16..271   the 8 blocks' 32 quants each, block k at 16 + 32k.
 * A row of C / 256 groups stays C / 32 * 34 bytes (a multiple of 16, so every group's quants are 16-byte aligned
 * wherever the rows start 16-byte aligned); quant word v (16 quants, columns 16v ..) of a row is at
 * 272 (v / 16) + 16 + 16 (v % 16) and its scale at 272 (v / 16) + 2 ((v % 16) / 2) (quant/tile.h). */
#define MOET_Q8T_GROUP 8

#ifdef __cplusplus /* the CUDA files (nvcc compiles them as C++) */
#define MOET_STATIC_ASSERT static_assert
#else
#define MOET_STATIC_ASSERT _Static_assert
#endif
MOET_STATIC_ASSERT(sizeof(moet_block_q8_0) == 34, "q8_0 block is 34 bytes (ggml)");
MOET_STATIC_ASSERT(sizeof(moet_block_mxfp4) == 17, "mxfp4 block is 17 bytes (ggml)");
MOET_STATIC_ASSERT(sizeof(moet_block_nvfp4) == 9, "nvfp4 block is 9 bytes");
MOET_STATIC_ASSERT(MOET_Q8T_GROUP * sizeof(moet_block_q8_0) == 272 && 272 % 16 == 0, "q8t group: 16 bytes of scales, 256 quants");
MOET_STATIC_ASSERT(sizeof(moet_block_q2) == 9, "2-bit block is 9 bytes: 2.25 bpw");
MOET_STATIC_ASSERT(sizeof(moet_block_asym2) == 10, "asym2 block is 10 bytes: 2.5 bpw");

#endif
