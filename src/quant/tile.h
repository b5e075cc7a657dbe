/*
 * tile.h — the index arithmetic of the tiled NVFP4 and Q8_0 device layouts (quant/blocks.h), shared by C and CUDA.
 *
 * Why a header of its own: the CUDA backend rewrites a delta residual into this layout (k_nv_tile) and its tensor-core
 * kernels read it back as mma fragments (moe_tc.cuh); the CPU build has no GPU to run them on. With the arithmetic
 * here, tests/test_quant.c checks on any machine that every fragment register a lane builds holds the e2m1 values
 * and the scale of the element the mma expects there, through the same functions the kernels call.
 */
#ifndef MOET_QUANT_TILE_H
#define MOET_QUANT_TILE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"

#ifdef __CUDACC__
#define MOET_TILE_HD __host__ __device__ __forceinline__
#else
#define MOET_TILE_HD static inline
#endif

/* The 4-bit code of column c (0..15) of an NVFP4 block: the first half in the low nibbles, the second in the high. */
MOET_TILE_HD uint32_t moet_nvfp4_code(const moet_block_nvfp4 *b, int c) {
    return c < 8 ? b->qs[c] & 15u : (uint32_t)(b->qs[c - 8] >> 4);
}

/* Code word s (0, 1: the k-steps of columns 32 bi + 16 s ..) of lane l (= 4 g + t) in tile ti, block bi, from the stored
 * rows (row_bytes apart): byte r is row 16 ti + g + 8 (r & 1), columns 2t + 8 (r >> 1) and the next, low nibble first. */
MOET_TILE_HD uint32_t moet_nv_tile_word(const uint8_t *src, size_t row_bytes, int64_t ti, int64_t bi, int lane, int s) {
    const int g = lane >> 2, t = lane & 3;
    uint32_t word = 0;
    for (int r = 0; r < 4; r++) {
        const moet_block_nvfp4 *b = (const moet_block_nvfp4 *)(src + (size_t)(16 * ti + g + 8 * (r & 1)) * row_bytes) + 2 * bi + s;
        const int c0 = 2 * t + 8 * (r >> 1);
        word |= (moet_nvfp4_code(b, c0) | moet_nvfp4_code(b, c0 + 1) << 4) << (8 * r);
    }
    return word;
}

/* Scale byte j (= 16 s + r) of tile ti, block bi: the E4M3 scale of row 16 ti + r, columns 32 bi + 16 s ... */
MOET_TILE_HD uint8_t moet_nv_tile_scale(const uint8_t *src, size_t row_bytes, int64_t ti, int64_t bi, int j) {
    return ((const moet_block_nvfp4 *)(src + (size_t)(16 * ti + (j & 15)) * row_bytes))[2 * bi + (j >> 4)].scale;
}

/* Where the scale of row r, k-step s of block bi (< 8) of a chunk lies in the two words a lane fetched (words lane and
 * lane + 32 of the chunk's scales): word `which` (0, 1) of lane src_lane, byte `byte`. */
MOET_TILE_HD void moet_nv_sc_pos(int bi, int s, int r, int *which, int *src_lane, int *byte) {
    const int i = 32 * bi + 16 * s + r;
    *which = bi >> 2;
    *src_lane = (i >> 2) & 31;
    *byte = i & 3;
}

/* __byte_perm(x, y, sel): byte n of the result is byte (sel >> 4n) & 7 of the pair (x low, y high). */
MOET_TILE_HD uint32_t moet_byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, sel);
#else
    const uint64_t xy = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) r |= (uint32_t)((xy >> (8 * ((sel >> (4 * n)) & 7))) & 0xff) << (8 * n);
    return r;
#endif
}

/* The f16x2 register of one tiled code byte (low nibble -> low half). An e2m1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6}
 * is an f16 whose low byte is 0: one permute picks the eight high bytes from a table (selectors 0 for bytes 0 and 2
 * pick its entry 0, 0x00), then the two sign bits go to bits 15 and 31. */
MOET_TILE_HD uint32_t moet_fp4x2_f16x2(uint32_t b) {
    const uint32_t sel = ((b & 7u) << 4) | ((b & 0x70u) << 8);
    return moet_byte_perm(0x3E3C3800u, 0x46444240u, sel) | ((b & 8u) << 12) | ((b & 0x80u) << 24);
}


/* ---- the 2-bit family's tiled layout (quant/blocks.h) ---------------------------------------------------------- */

/* The tiled code word of lane l (= 4 g + t) in tile ti, block b, from the stored rows (row_bytes apart, 9-byte blocks):
 * bit (h ? 31 - x : 15 - x), x = 4 m + r, is set when sign plane p = m >> 1 (0: u' from bit 1 of the code, 1: v' from
 * bit 0) of row 16 ti + g + 8 (r & 1), column 32 b + 16 (m & 1) + 2t + 8 (r >> 1) + h is negative (quant/blocks.h). */
MOET_TILE_HD uint32_t moet_q2_tile_word(const uint8_t *src, size_t row_bytes, int64_t ti, int64_t b, int lane) {
    const int g = lane >> 2, t = lane & 3;
    uint32_t w = 0;
    for (int mi = 0; mi < 4; mi++)
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 2; h++) {
                const int p = mi >> 1, s = mi & 1, x = 4 * mi + r;
                const int64_t row = ti * 16 + g + 8 * (r & 1);
                const int j = 16 * s + 2 * t + 8 * (r >> 1) + h;
                const uint32_t code = (src[(size_t)row * row_bytes + (size_t)b * 9 + 1 + (size_t)(j / 4)] >> (2 * (j % 4))) & 3u;
                const uint32_t bit = p == 0 ? (code >> 1) & 1u : code & 1u;
                if (!bit) w |= 1u << (h ? 31 - x : 15 - x);
            }
    return w;
}

/* ---- the integer tensor-core form of a tiled 2-bit block (decode kernels, backend/cuda/moe_tc.cu) -------------
 *
 * Why: the f16 form (blocks.h) spends a shift and a LOP3 on every f16x2 register, 32 instructions a 16 x 32 block,
 * which is what makes the decode kernels issue-bound. mma.m16n8k32 with u8 weights takes a sign bit wherever it lies
 * in its byte (bit j is the value 2^j), so one mask makes four weights: a block is 3 shifts, 8 LOP3 and 2 mma.
 *
 * A operand (u8, 0 or 2^j): the lane's tiled word w (blocks.h) masked. Byte n of w & 0x80808080 holds bit 7 + 8n:
 * x = 8 (n even) or 0 (n odd) at half n >> 1, i.e. row g, columns 2t, 2t+1 of half-block 0, planes (v', u', v', u')
 * for n = 0..3. So for half-block s (one mma, k = 32 slots):
 *     a0 = (w << 4s) & 0x80808080   row g      slots 4t + n      -> (plane 1 - (n & 1), column 16s + 2t + (n >> 1))
 *     a1 = (w << 4s) & 0x40404040   row g + 8  the same slots
 *     a2 = (w << 4s + 2) & 0x80..   row g      slots 16 + 4t + n -> (plane 1 - (n & 1), column 16s + 2t + 8 + (n >> 1))
 *     a3 = (w << 4s + 2) & 0x40..   row g + 8
 * Row g's weights are 128 b, row g + 8's 64 b, b = 1 where the sign is negative.
 * B operand (s8): the output column n = 4 P + Q is plane P's piece Q of the activations: x 2^-e = q0 + q1 2^-6 +
 * q2 2^-13 + q3 2^-20 (moet_i8_split: four exact int8 pieces, ~27 bits), zero on the other plane's slots. A lane of
 * B column g takes a stored pair word [q(c), 0, q(c + 1), 0] (moet_i8_pair) as is (P = 1) or shifted by 8 (P = 0).
 * C: the block's sum of the column's piece over its 32 columns, X, as -64 X (row g) and -32 X (row g + 8); since
 * u' = 1 - 2b, D = -64 sum(u' q) (row g) and -32 sum(u' q) (row g + 8): exact integers (|D| < 2^20), plus a bias that
 * makes D's bits the f32 of it (moet_i8_cstart / moet_i8_dval: no conversion instruction).
 * A lane's D columns are 2t and 2t + 1: plane t >> 1, pieces 2 (t & 1) and 2 (t & 1) + 1; moet_i8_coef gives the
 * factor each is multiplied by at the end (the plane's level coefficient, the piece's weight, the row's -1/64 or
 * -1/32), and the four lanes of a group are summed. */

/* The A operand of half-block s of a lane's tiled word. */
MOET_TILE_HD void moet_q2i8_afrag(uint32_t w, int s, uint32_t a[4]) {
    const uint32_t w0 = w << (4 * s), w2 = w0 << 2;
    a[0] = w0 & 0x80808080u;
    a[1] = w0 & 0x40404040u;
    a[2] = w2 & 0x80808080u;
    a[3] = w2 & 0x40404040u;
}

/* Round to nearest even and the integer, for |t| < 2^22, without a conversion instruction: t + 1.5 2^23 rounds t
 * to an integer in the f32 add (the GPU's conversions run at 16 a clock an SM, an eighth of its adds; staging a
 * chunk took 64 of them a lane). The sum's bits are 0x4B400000 + the integer. */
#define MOET_I8_MAGIC 12582912.0f
#define MOET_I8_MAGIC_BITS 0x4B400000
MOET_TILE_HD float moet_i8_biased(float t) { return t + MOET_I8_MAGIC; } /* never built with fast-math */
/* The bits of an f32 and back (a register move on the GPU) */
MOET_TILE_HD int32_t moet_f32_bits(float f) { int32_t i; memcpy(&i, &f, sizeof i); return i; }
MOET_TILE_HD float moet_f32_of_bits(int32_t i) { float f; memcpy(&f, &i, sizeof f); return f; }

/* The four int8 pieces of t (|t| < 128, finite): t = q0 + q1 2^-6 + q2 2^-13 + q3 2^-20 + err, |err| <= 2^-21. Every
 * step is exact in f32 (t - q0 and the scaled remainders have fewer significant bits than their operands); each
 * rounding is rintf's (moet_i8_biased). */
MOET_TILE_HD void moet_i8_split(float t, int32_t q[4]) {
    float b = moet_i8_biased(t);
    int32_t i = moet_f32_bits(b) - MOET_I8_MAGIC_BITS;
    i = i > 127 ? 127 : i < -127 ? -127 : i; /* t in [127.5, 128): the remainder takes the rest, < 1 */
    q[0] = i;
    float rem = (t - (moet_f32_of_bits(i + MOET_I8_MAGIC_BITS) - MOET_I8_MAGIC)) * 64.f; /* [-32, 64] */
    b = moet_i8_biased(rem);
    q[1] = moet_f32_bits(b) - MOET_I8_MAGIC_BITS;
    rem = (rem - (b - MOET_I8_MAGIC)) * 128.f; /* [-64, 64] */
    b = moet_i8_biased(rem);
    q[2] = moet_f32_bits(b) - MOET_I8_MAGIC_BITS;
    rem = (rem - (b - MOET_I8_MAGIC)) * 128.f;
    q[3] = moet_f32_bits(moet_i8_biased(rem)) - MOET_I8_MAGIC_BITS;
}

/* The C start of a D element from the block's stored sum (-32 X, moet_i8 staging) for row g (hi 0) or g + 8 (hi 1),
 * biased by MOET_I8_MAGIC_BITS so that D's bits are an f32 (moet_i8_dval): |D| < 2^20 stays inside the bias's
 * exponent. */
MOET_TILE_HD int32_t moet_i8_cstart(int32_t xs, int hi) { return (hi ? xs : 2 * xs) + MOET_I8_MAGIC_BITS; }
MOET_TILE_HD float moet_i8_dval(int32_t d) { return moet_f32_of_bits(d) - MOET_I8_MAGIC; }

/* The weight of piece Q relative to t. */
MOET_TILE_HD float moet_i8_piece_w(int Q) { return Q == 0 ? 1.0f : Q == 1 ? 0x1p-6f : Q == 2 ? 0x1p-13f : 0x1p-20f; }

/* The staging exponent for a chunk whose largest |x| is mx: mx 2^-e in [64, 128) (0 for zero or non-finite mx; clamped
 * to +-100 so 2^+-e stays a normal f32). */
MOET_TILE_HD int moet_i8_exp(float mx) {
    int e = 0;
    if (mx > 0.f && mx <= 3.0e38f) e = ilogbf(mx) - 6;
    return e < -100 ? -100 : e > 100 ? 100 : e;
}

/* A stored pair word: pieces a, b of columns c, c + 1 in bytes 0 and 2 (plane 1's slots). */
MOET_TILE_HD uint32_t moet_i8_pair(int32_t a, int32_t b) { return ((uint32_t)a & 0xffu) | (((uint32_t)b & 0xffu) << 16); }

/* Where the pair of columns 2p, 2p + 1 (p = 0..15) of a block goes among its 16 pair words of one piece: lane t's four
 * words are 4t .. 4t + 3 = (half-block 0: b0, b1; half-block 1: b0, b1), b0 = columns 16s + 2t, b1 = 16s + 2t + 8. */
MOET_TILE_HD int moet_i8_pair_idx(int p) { return 4 * (p & 3) + 2 * (p >> 3) + ((p >> 2) & 1); }

/* The B register of a B-column-g lane from its stored pair word. */
MOET_TILE_HD uint32_t moet_i8_bword(uint32_t pw, int g) { return (g >> 2) ? pw : pw << 8; }

/* The factors of a lane's D columns (2t, 2t + 1) for rows g (k[0], k[1]) and g + 8 (k[2], k[3]); A, B: the levels'
 * coefficients of u' and v' (blocks.h). */
MOET_TILE_HD void moet_i8_coef(int t, float A, float B, float k[4]) {
    const float cp = (t >> 1) ? B : A;
    const int q0 = 2 * (t & 1);
    k[0] = cp * moet_i8_piece_w(q0) * -0x1p-6f;
    k[1] = cp * moet_i8_piece_w(q0 + 1) * -0x1p-6f;
    k[2] = cp * moet_i8_piece_w(q0) * -0x1p-5f;
    k[3] = cp * moet_i8_piece_w(q0 + 1) * -0x1p-5f;
}

/* ---- int8 quants as f32 without a conversion instruction (the Q8_0 GEMV, backend/cuda/matmul.cu) ---------------
 *
 * Why: the GPU converts an integer to f32 at 16 a clock an SM (an eighth of its adds), so a GEMV that converts each
 * Q8_0 quant (one byte) can read at most 16 bytes a clock an SM: ~4.2 TB/s on all 132 SMs with that one pipe never
 * idle, the memory's own speed, so in practice well below it; the q8t GEMV measured 47-55% of copy bandwidth where
 * BF16's reaches 85-100% (stops 25 and 37, H100s). Instead: flip the sign bit of every byte once (b ^ 0x80 = b + 128,
 * 0..255), place byte k under the exponent of 2^23 with one byte permute (0x4B0000uu is the f32 2^23 + u, exactly)
 * and subtract 2^23 + 128 in one add: exactly (float)(int8_t) byte k, by full-rate instructions. The same value, so
 * the products are bit for bit what they were (tests/test_quant.c checks every byte at every position). Written at
 * stop 37 after the device time ran out: its speed is test_ops --perf's q8_0 GEMV table at the next GPU call. */

/* The word of four quants with each byte's sign bit flipped (once a word, for moet_i8_f32). */
MOET_TILE_HD uint32_t moet_i8x4_flip(uint32_t w) { return w ^ 0x80808080u; }

/* Quant k (0..3, low byte first) of a moet_i8x4_flip'd word as an f32, exactly (float)(int8_t)(w >> 8k). */
#define MOET_I8F_MAGIC 8388736.0f /* 2^23 + 128 */
MOET_TILE_HD float moet_i8_f32(uint32_t wf, int k) {
    return moet_f32_of_bits((int32_t)moet_byte_perm(wf, 0x4B000000u, 0x7650u | (uint32_t)k)) - MOET_I8F_MAGIC;
}

/* The Q8_0 device layout (quant/blocks.h, "q8t"): byte offsets, within a row, of quant word v (16 quants: columns
 * 16v ..) and of its block's f16 scale. */
MOET_TILE_HD size_t moet_q8t_qs_off(int64_t v) { return (size_t)(272 * (v >> 4) + 16 + 16 * (v & 15)); }
MOET_TILE_HD size_t moet_q8t_d_off(int64_t v) { return (size_t)(272 * (v >> 4) + 2 * ((v & 15) >> 1)); }

/* Rewrites one group of 8 ggml Q8_0 blocks (272 bytes at src) into the q8t order at dst (not overlapping src). */
MOET_TILE_HD void moet_q8t_group(const uint8_t *src, uint8_t *dst) {
    for (int k = 0; k < MOET_Q8T_GROUP; k++) {
        const uint8_t *b = src + 34 * k;
        dst[2 * k] = b[0];
        dst[2 * k + 1] = b[1];
        for (int j = 0; j < MOET_QK; j++) dst[16 + 32 * k + j] = b[2 + j];
    }
}

#endif
