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

#include <stddef.h>
#include <stdint.h>

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
