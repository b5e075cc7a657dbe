/*
 * mla_src.h — where MLA's rope dims come from, shared by the CPU backend and the CUDA kernels (mla_prep, mla_attn).
 *
 * DeepSeek-V3's checkpoints rotate interleaved pairs (x0, x1), (x2, x3), ..; moet's rope ops rotate halves (i,
 * i + rope/2). Element i of the de-interleaved vector is element moet_mla_src(i) of the checkpoint's: (x0, x2, ..,
 * x1, x3, ..) when interleaved, else i. Applied to q and k alike, it changes no q . k.
 */
#ifndef MOET_BACKEND_MLA_SRC_H
#define MOET_BACKEND_MLA_SRC_H

#include <stdint.h>

#include "backend/kv_page.h" /* MOET_HD */

MOET_HD int32_t moet_mla_src(int32_t i, int32_t rope, int32_t interleave) {
    return !interleave ? i : i < rope / 2 ? 2 * i : 2 * (i - rope / 2) + 1;
}

#endif
