/*
 * synth.h — the synthetic weights' generator, one definition for the CPU and the CUDA backend (fill_random), so
 * both make the same values by construction: splitmix64 per element (floats) or per 8 bytes (block formats), then
 * each block's scale byte pulled into a range that keeps values finite and sized like trained weights.
 */
#ifndef MOET_QUANT_SYNTH_H
#define MOET_QUANT_SYNTH_H

#include <stdint.h>

#include "quant/types.h"

#ifdef __CUDACC__
#define MOET_HD __host__ __device__ __forceinline__
#else
#define MOET_HD static inline
#endif

MOET_HD uint64_t moet_synth_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The random word of element (floats) or 8-byte word (block formats) i. */
MOET_HD uint64_t moet_synth_word(uint64_t seed, uint64_t i) { return moet_synth_mix64(seed ^ i * 0x2545f4914f6cdd1dull); }

/* Float weight i: a sum of four uniforms (close enough to a normal for weights), unit variance times scale. */
MOET_HD float moet_synth_float(uint64_t seed, uint64_t i, float scale) {
    uint64_t z = moet_synth_word(seed, i);
    double u = ((double)(z & 0xffff) + (double)((z >> 16) & 0xffff) + (double)((z >> 32) & 0xffff) +
                (double)(z >> 48)) / 65536.0 - 2.0;
    return (float)(u * 1.7320508075688772) * scale;
}

/* A block of random bytes made a valid, sized block: its scale byte(s) moved into a sane range. q8d: Q8_0's half d. */
MOET_HD void moet_synth_fix_block(int32_t type, uint8_t *blk, uint16_t q8d) {
    switch (type) {
    case MOET_TYPE_W2: case MOET_TYPE_INT2: case MOET_TYPE_SYM2: blk[0] = (uint8_t)(224 + (blk[0] & 31)); break;
    case MOET_TYPE_ASYM2: blk[0] = (uint8_t)(224 + (blk[0] & 31)); blk[1] = (uint8_t)(blk[1] & 0xbf); break;
    case MOET_TYPE_NVFP4: blk[0] = (uint8_t)(0x30 + (blk[0] & 15)); break;
    case MOET_TYPE_MXFP4: blk[0] = (uint8_t)(118 + (blk[0] & 3)); break;
    case MOET_TYPE_Q8_0: blk[0] = (uint8_t)(q8d & 0xff); blk[1] = (uint8_t)(q8d >> 8); break;
    default: break;
    }
}

#endif
