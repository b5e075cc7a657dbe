/* types.c — type traits and scalar widening. */
#include "types.h"

#include "core/util.h"
#include "quant/blocks.h"
#include "quant/formats.h"

static const moet_type_traits k_f32 = {"f32", 1, 4}, k_f16 = {"f16", 1, 2}, k_bf16 = {"bf16", 1, 2},
                              k_q8_0 = {"q8_0", MOET_QK, sizeof(moet_block_q8_0)},
                              k_mxfp4 = {"mxfp4", MOET_QK, sizeof(moet_block_mxfp4)},
                              k_w2 = {"w2", MOET_QK, sizeof(moet_block_q2)},
                              k_nvfp4 = {"nvfp4", MOET_QK_NVFP4, sizeof(moet_block_nvfp4)},
                              k_int2 = {"int2", MOET_QK, sizeof(moet_block_q2)},
                              k_sym2 = {"sym2", MOET_QK, sizeof(moet_block_q2)},
                              k_asym2 = {"asym2", MOET_QK, sizeof(moet_block_asym2)},
                              k_f8 = {"f8_e4m3_b128", 1, 1};

const moet_type_traits *moet_type_get(int32_t type) {
    switch (type) {
    case MOET_TYPE_F32: return &k_f32;
    case MOET_TYPE_F16: return &k_f16;
    case MOET_TYPE_BF16: return &k_bf16;
    case MOET_TYPE_Q8_0: return &k_q8_0;
    case MOET_TYPE_MXFP4: return &k_mxfp4;
    case MOET_TYPE_W2: return &k_w2;
    case MOET_TYPE_NVFP4: return &k_nvfp4;
    case MOET_TYPE_INT2: return &k_int2;
    case MOET_TYPE_SYM2: return &k_sym2;
    case MOET_TYPE_ASYM2: return &k_asym2;
    case MOET_TYPE_F8_E4M3: return &k_f8;
    default: return NULL;
    }
}

size_t moet_type_row_bytes(int32_t type, int64_t n) {
    const moet_type_traits *t = moet_type_get(type);
    if (!t || n < 0 || n % t->block_size) return 0;
    return (size_t)(n / t->block_size) * (size_t)t->type_size;
}

void moet_type_row_to_f32_p(int32_t type, const void *src, float *dst, int64_t n, float qscale, float qbeta) {
    moet_q2_params q2 = {.kind = MOET_Q2_W2, .base = qscale, .beta = qbeta};
    switch (type) {
    case MOET_TYPE_Q8_0: moet_q8_0_dequantize_row(src, dst, n); break;
    case MOET_TYPE_F8_E4M3: /* the values alone (scale 1): moet_weight_row_f32 applies the block scales */
        for (int64_t i = 0; i < n; i++) dst[i] = moet_e4m3_to_f32(((const uint8_t *)src)[i]);
        break;
    case MOET_TYPE_MXFP4: moet_mxfp4_dequantize_row(src, dst, n); break;
    case MOET_TYPE_NVFP4: moet_nvfp4_dequantize_row(src, qscale, dst, n); break;
    case MOET_TYPE_ASYM2: moet_asym2_dequantize_row(src, qscale, dst, n); break;
    case MOET_TYPE_INT2: q2.kind = MOET_Q2_INT2; moet_q2_dequantize_row(&q2, src, dst, n); break;
    case MOET_TYPE_SYM2: q2.kind = MOET_Q2_SYM2; moet_q2_dequantize_row(&q2, src, dst, n); break;
    case MOET_TYPE_W2: moet_q2_dequantize_row(&q2, src, dst, n); break;
    case MOET_TYPE_F32: {
        const float *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i];
        break;
    }
    case MOET_TYPE_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = moet_f16_to_f32(s[i]);
        break;
    }
    case MOET_TYPE_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = moet_bf16_to_f32(s[i]);
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) dst[i] = 0.0f / 0.0f;
    }
}
