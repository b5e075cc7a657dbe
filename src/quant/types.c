/* types.c — type traits and scalar widening. */
#include "types.h"

#include "core/util.h"

static const moet_type_traits k_f32 = {"f32", 1, 4}, k_f16 = {"f16", 1, 2}, k_bf16 = {"bf16", 1, 2};

const moet_type_traits *moet_type_get(int32_t type) {
    switch (type) {
    case MOET_TYPE_F32: return &k_f32;
    case MOET_TYPE_F16: return &k_f16;
    case MOET_TYPE_BF16: return &k_bf16;
    default: return NULL;
    }
}

size_t moet_type_row_bytes(int32_t type, int64_t n) {
    const moet_type_traits *t = moet_type_get(type);
    if (!t || n < 0 || n % t->block_size) return 0;
    return (size_t)(n / t->block_size) * (size_t)t->type_size;
}

void moet_type_row_to_f32(int32_t type, const void *src, float *dst, int64_t n) {
    switch (type) {
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
