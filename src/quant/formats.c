/* formats.c — see formats.h. Plain scalar C on purpose: this is the definition of each format. */
#include "quant/formats.h"

#include <math.h>
#include <string.h>

#include "core/util.h"

const float moet_e2m1_values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

uint8_t moet_e2m1_nearest(float x) {
    float a = fabsf(x);
    /* midpoints between 0 .5 1 1.5 2 3 4 6; at a tie the even code (mantissa 0) wins */
    uint8_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return (uint8_t)(c | (x < 0 && c ? 8 : 0));
}

float moet_e4m3_to_f32(uint8_t v) {
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float r;
    if (e == 15 && m == 7) r = NAN;
    else if (e == 0) r = ldexpf((float)m, -9);
    else r = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -r : r;
}

uint8_t moet_f32_to_e4m3(float x) {
    float a = fabsf(x);
    uint8_t best = 0;
    float bd = INFINITY;
    for (int c = 0; c < 127; c++) { /* 0x7f is NaN */
        float d = fabsf(moet_e4m3_to_f32((uint8_t)c) - a);
        if (d < bd) { bd = d; best = (uint8_t)c; }
    }
    return (uint8_t)(best | (x < 0 ? 0x80 : 0));
}

uint16_t moet_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    uint32_t sign = (v.u >> 16) & 0x8000, x = v.u & 0x7fffffff;
    if (x >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (x > 0x7f800000 ? 0x200 : 0));
    if (x >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* overflow to inf */
    if (x < 0x38800000) { /* subnormal or zero in half */
        if (x < 0x33000000) return (uint16_t)sign;
        uint32_t m = (x & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(x >> 23); /* value = m * 2^(E-150); half subnormal unit 2^-24 => h = m >> (126-E) */
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((x - 0x38000000) >> 13), rem = x & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float moet_f16_round(float x) { return moet_f16_to_f32(moet_f32_to_f16(x)); }

/* ---- Q8_0 ----------------------------------------------------------------------------------------------------- */

void moet_q8_0_quantize_row(const float *x, moet_block_q8_0 *b, int64_t n) {
    for (int64_t i = 0; i < n / MOET_QK; i++, x += MOET_QK) {
        float amax = 0;
        for (int j = 0; j < MOET_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        b[i].d = moet_f32_to_f16(amax / 127.0f);
        float d = moet_f16_to_f32(b[i].d), id = d > 0 ? 1.0f / d : 0.0f; /* round against the stored scale */
        for (int j = 0; j < MOET_QK; j++) {
            float q = roundf(x[j] * id);
            b[i].qs[j] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
    }
}

void moet_q8_0_dequantize_row(const moet_block_q8_0 *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n / MOET_QK; i++) {
        float d = moet_f16_to_f32(b[i].d);
        for (int j = 0; j < MOET_QK; j++) *y++ = d * (float)b[i].qs[j];
    }
}

/* ---- MXFP4 (OCP MX: shared exponent = floor(log2(amax)) - 2, the largest E2M1 exponent) ---------------------- */

void moet_mxfp4_quantize_row(const float *x, moet_block_mxfp4 *b, int64_t n) {
    for (int64_t i = 0; i < n / MOET_QK; i++, x += MOET_QK) {
        float amax = 0;
        for (int j = 0; j < MOET_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        int e = amax > 0 ? (int)floorf(log2f(amax)) - 2 + 127 : 0;
        e = e < 0 ? 0 : e > 254 ? 254 : e;
        b[i].e = (uint8_t)e;
        float inv = ldexpf(1.0f, 127 - e);
        for (int j = 0; j < MOET_QK / 2; j++)
            b[i].qs[j] = (uint8_t)(moet_e2m1_nearest(x[j] * inv) | moet_e2m1_nearest(x[j + 16] * inv) << 4);
    }
}

void moet_mxfp4_dequantize_row(const moet_block_mxfp4 *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n / MOET_QK; i++, y += MOET_QK) {
        float d = ldexpf(1.0f, (int)b[i].e - 127);
        for (int j = 0; j < MOET_QK / 2; j++) {
            y[j] = moet_e2m1_values[b[i].qs[j] & 15] * d;
            y[j + 16] = moet_e2m1_values[b[i].qs[j] >> 4] * d;
        }
    }
}

/* ---- NVFP4 (blocks of 16, E4M3 block scale, fp32 tensor scale = amax / (6 * 448)) ---------------------------- */

float moet_nvfp4_tensor_scale(float amax) { return amax > 0 ? amax / (6.0f * 448.0f) : 1.0f; }

void moet_nvfp4_quantize_row(const float *x, float ts, moet_block_nvfp4 *b, int64_t n) {
    for (int64_t i = 0; i < n / MOET_QK_NVFP4; i++, x += MOET_QK_NVFP4) {
        float amax = 0;
        for (int j = 0; j < MOET_QK_NVFP4; j++) amax = fmaxf(amax, fabsf(x[j]));
        uint8_t sc = moet_f32_to_e4m3(amax / 6.0f / ts);
        b[i].scale = sc;
        float d = moet_e4m3_to_f32(sc) * ts, inv = d > 0 ? 1.0f / d : 0.0f;
        for (int j = 0; j < MOET_QK_NVFP4 / 2; j++)
            b[i].qs[j] = (uint8_t)(moet_e2m1_nearest(x[j] * inv) | moet_e2m1_nearest(x[j + 8] * inv) << 4);
    }
}

void moet_nvfp4_dequantize_row(const moet_block_nvfp4 *b, float ts, float *y, int64_t n) {
    for (int64_t i = 0; i < n / MOET_QK_NVFP4; i++, y += MOET_QK_NVFP4) {
        float d = moet_e4m3_to_f32(b[i].scale) * ts;
        for (int j = 0; j < MOET_QK_NVFP4 / 2; j++) {
            y[j] = moet_e2m1_values[b[i].qs[j] & 15] * d;
            y[j + 8] = moet_e2m1_values[b[i].qs[j] >> 4] * d;
        }
    }
}

/* ---- the 2-bit family ----------------------------------------------------------------------------------------- */

void moet_q2_levels(const moet_q2_params *p, float lv[4]) {
    lv[0] = lv[1] = lv[2] = lv[3] = 0;
    switch (p->kind) {
    case MOET_Q2_W2: lv[0] = -1; lv[1] = -p->beta; lv[2] = p->beta; lv[3] = 1; break;
    case MOET_Q2_INT2: lv[0] = -2; lv[1] = -1; lv[2] = 0; lv[3] = 1; break;
    case MOET_Q2_SYM2: lv[0] = -1.5f; lv[1] = -0.5f; lv[2] = 0.5f; lv[3] = 1.5f; break;
    }
}

uint8_t moet_q2_scale_code(const moet_q2_params *p, float s) {
    if (!(s > 0) || !(p->base > 0)) return 0;
    float c = roundf(16.0f * log2f(s / p->base) + 255.0f);
    return (uint8_t)(c < 0 ? 0 : c > 255 ? 255 : c);
}

uint8_t moet_q2_nearest(const float lv[4], float s, float v) {
    uint8_t best = 0;
    float bd = INFINITY;
    for (uint8_t c = 0; c < 4; c++) {
        float d = fabsf(v - lv[c] * s);
        if (d < bd) { bd = d; best = c; }
    }
    return best;
}

static double q2_group_err(const float lv[4], float s, const float *x, const float *imp, uint8_t *codes) {
    double e = 0;
    for (int j = 0; j < MOET_QK; j++) {
        uint8_t c = moet_q2_nearest(lv, s, x[j]);
        if (codes) codes[j] = c;
        double d = (double)x[j] - (double)(lv[c] * s);
        e += (imp ? imp[j] : 1.0) * d * d;
    }
    return e;
}

double moet_q2_quantize_group(const moet_q2_params *p, const float *x, const float *imp, int search, moet_block_q2 *b) {
    float lv[4];
    moet_q2_levels(p, lv);
    float amax = 0;
    for (int j = 0; j < MOET_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    /* naive rule: the outermost level lands on the absmax */
    float outer = p->kind == MOET_Q2_INT2 ? 2.0f : p->kind == MOET_Q2_SYM2 ? 1.5f : 1.0f;
    uint8_t sc = moet_q2_scale_code(p, amax / outer);
    uint8_t codes[MOET_QK];
    double best = q2_group_err(lv, moet_q2_scale(p, sc), x, imp, codes);
    if (search && amax > 0) {
        int c0 = sc;
        for (int c = c0 - 16; c <= c0 + 4; c++) { /* 0.5x .. 1.19x of the absmax scale */
            if (c < 0 || c > 255 || c == c0) continue;
            uint8_t tmp[MOET_QK];
            double e = q2_group_err(lv, moet_q2_scale(p, (uint8_t)c), x, imp, tmp);
            if (e < best) { best = e; sc = (uint8_t)c; memcpy(codes, tmp, sizeof codes); }
        }
    }
    b->sc = sc;
    memset(b->qs, 0, sizeof b->qs);
    for (int j = 0; j < MOET_QK; j++) b->qs[j / 4] |= (uint8_t)(codes[j] << (2 * (j % 4)));
    return best;
}

void moet_q2_dequantize_row(const moet_q2_params *p, const moet_block_q2 *b, float *y, int64_t n) {
    float lv[4];
    moet_q2_levels(p, lv);
    for (int64_t i = 0; i < n / MOET_QK; i++) {
        float s = moet_q2_scale(p, b[i].sc);
        for (int j = 0; j < MOET_QK; j++) *y++ = lv[(b[i].qs[j / 4] >> (2 * (j % 4))) & 3] * s;
    }
}

/* ---- asym2 ---------------------------------------------------------------------------------------------------- */

static float asym_d(float base, uint8_t c) { return base * exp2f(((float)c - 255.0f) / 16.0f); }
static float asym_m(float base, uint8_t c) {
    float v = base * exp2f(((float)(c & 127) - 127.0f) / 8.0f);
    return (c & 128) ? -v : v;
}

void moet_asym2_quantize_row(const float *x, float base, moet_block_asym2 *b, int64_t n) {
    for (int64_t i = 0; i < n / MOET_QK; i++, x += MOET_QK) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < MOET_QK; j++) { mn = fminf(mn, x[j]); mx = fmaxf(mx, x[j]); }
        /* code the minimum first, then the step from the coded minimum */
        float am = fabsf(mn);
        float cm = am > 0 ? roundf(8.0f * log2f(am / base) + 127.0f) : 0;
        cm = cm < 0 ? 0 : cm > 127 ? 127 : cm;
        b[i].m = (uint8_t)((uint8_t)cm | (mn < 0 ? 128 : 0));
        float m = asym_m(base, b[i].m);
        float d = (mx - m) / 3.0f;
        float cd = d > 0 ? roundf(16.0f * log2f(d / base) + 255.0f) : 0;
        b[i].d = (uint8_t)(cd < 0 ? 0 : cd > 255 ? 255 : cd);
        d = asym_d(base, b[i].d);
        memset(b[i].qs, 0, sizeof b[i].qs);
        for (int j = 0; j < MOET_QK; j++) {
            float q = roundf((x[j] - m) / d);
            int c = q < 0 ? 0 : q > 3 ? 3 : (int)q;
            b[i].qs[j / 4] |= (uint8_t)(c << (2 * (j % 4)));
        }
    }
}

void moet_asym2_dequantize_row(const moet_block_asym2 *b, float base, float *y, int64_t n) {
    for (int64_t i = 0; i < n / MOET_QK; i++) {
        float d = asym_d(base, b[i].d), m = asym_m(base, b[i].m);
        for (int j = 0; j < MOET_QK; j++) *y++ = (float)((b[i].qs[j / 4] >> (2 * (j % 4))) & 3) * d + m;
    }
}
