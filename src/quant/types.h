/*
 * types.h — the element/block types moet stores weights in, and their traits.
 *
 * IDs equal ggml's where the layout is byte-identical (so a pack's tensors list correctly in ggml tools); moet's own
 * types live at MOET_TYPE_OWN_BASE and up. An ID is never reused after a layout change: a changed layout gets a new
 * ID. This header is plain C shared by the C and CUDA code.
 */
#ifndef MOET_QUANT_TYPES_H
#define MOET_QUANT_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MOET_TYPE_F32 = 0,    /* ggml GGML_TYPE_F32 */
    MOET_TYPE_F16 = 1,    /* ggml GGML_TYPE_F16 */
    MOET_TYPE_Q8_0 = 8,   /* ggml GGML_TYPE_Q8_0, byte-identical */
    MOET_TYPE_BF16 = 30,  /* ggml GGML_TYPE_BF16 */
    MOET_TYPE_MXFP4 = 39, /* ggml GGML_TYPE_MXFP4, byte-identical */
    MOET_TYPE_OWN_BASE = 1024,
    MOET_TYPE_W2 = 1024,    /* moet_block_q2, levels {-1,-beta,beta,1} (qscale = base, qbeta = beta) */
    MOET_TYPE_NVFP4 = 1025, /* moet_block_nvfp4 (qscale = tensor scale) */
    MOET_TYPE_INT2 = 1026,  /* moet_block_q2, levels {-2,-1,0,1} (ablation) */
    MOET_TYPE_SYM2 = 1027,  /* moet_block_q2, levels {-1.5,-.5,.5,1.5} (ablation) */
    MOET_TYPE_ASYM2 = 1028, /* moet_block_asym2 (qscale = base) (ablation) */
    MOET_TYPE_F8_E4M3 = 1029, /* e4m3 bytes (OCP "fn": no inf) times an f32 scale per 128 x 128 block kept beside
                               * them (moet_weight.bscale): FP8 checkpoints (DeepSeek-V3, Kimi-K2, Qwen3-FP8) as they
                               * lie; host only, never in a pack (packs store them as BF16) */
} moet_type;

typedef struct {
    const char *name;
    int32_t block_size;  /* elements per block (1 for plain types) */
    int32_t type_size;   /* bytes per block */
} moet_type_traits;

/* NULL for an unknown id. */
const moet_type_traits *moet_type_get(int32_t type);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size or the type is unknown. */
size_t moet_type_row_bytes(int32_t type, int64_t n);
/* Widens one row of n elements to f32 (the scalar reference every fast kernel is checked against). qscale/qbeta:
 * the per-matrix parameters of the formats that have them (ignored by the others). */
void moet_type_row_to_f32_p(int32_t type, const void *src, float *dst, int64_t n, float qscale, float qbeta);
static inline void moet_type_row_to_f32(int32_t type, const void *src, float *dst, int64_t n) {
    moet_type_row_to_f32_p(type, src, dst, n, 1.0f, 0.0f);
}

#ifdef __cplusplus
}
#endif
#endif
