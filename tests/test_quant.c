/*
 * test_quant.c — every format's quantize -> dequantize error within the bound its grid implies, on fresh random
 * rows (Gaussian with outliers), plus the W2 machinery: the rotation is orthogonal and invertible, beta is fitted
 * inside its search range, W2's codebook is sign-symmetric, and calibrated error feedback lowers the
 * importance-weighted error against plain rounding.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "quant/formats.h"
#include "quant/matq.h"
#include "quant/tile.h"
#include "test_util.h"

static uint64_t g_rng;
static double urand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static float gauss(void) {
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* The Q8_0 device layout (quant/blocks.h "q8t", quant/tile.h): a row rewritten group by group, then read back the
 * way the CUDA GEMV reads it (quant word v and its scale by moet_q8t_*_off) must give every column's stored quant
 * and scale; every byte of the row written once. */
static void test_q8t(void) {
    enum { C = 1024, NB = C / 32, RB = NB * 34 };
    static uint8_t src[RB], dst[RB], seen[RB];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(urand() * 256);
    memset(dst, 0xA5, sizeof dst);
    for (int g = 0; g < C / 256; g++) moet_q8t_group(src + 272 * g, dst + 272 * g);
    memset(seen, 0, sizeof seen);
    int bad = 0;
    for (int64_t v = 0; v < C / 16; v++) {
        const size_t qo = moet_q8t_qs_off(v), dof = moet_q8t_d_off(v);
        bad += qo % 16 != 0 || qo + 16 > RB || dof + 2 > RB;
        for (int j = 0; j < 16; j++) {
            const int64_t col = 16 * v + j, b = col / 32;
            const moet_block_q8_0 *blk = (const moet_block_q8_0 *)(src + 34 * b);
            bad += (int8_t)dst[qo + j] != blk->qs[col % 32];
            bad += (uint16_t)(dst[dof] | dst[dof + 1] << 8) != blk->d;
            seen[qo + j]++;
        }
        if (!(v & 1)) { seen[dof]++; seen[dof + 1]++; }
    }
    for (size_t i = 0; i < sizeof seen; i++) bad += seen[i] != 1;
    CHECK(!bad, "q8t layout: %d mismatches", bad);
}

/* The q8t GEMV's conversion-free int8 -> f32 (quant/tile.h, moet_i8_f32): every byte value at every position of a
 * word gives exactly (float)(int8_t) of it, bit for bit (the GEMV's products stay what they were). */
static void test_i8_f32(void) {
    int bad = 0;
    for (int k = 0; k < 4; k++)
        for (int v = 0; v < 256; v++) {
            const uint32_t w = ((uint32_t)v << (8 * k)) | ((uint32_t)(urand() * 256) << (8 * ((k + 1) & 3)));
            const float want = (float)(int8_t)(w >> (8 * k)), got = moet_i8_f32(moet_i8x4_flip(w), k);
            bad += memcmp(&want, &got, sizeof want) != 0;
        }
    CHECK(!bad, "moet_i8_f32: %d of 1024 byte values differ from (float)(int8_t)", bad);
}

/* The tiled NVFP4 layout (quant/tile.h, blocks.h) as the CUDA tensor-core kernels consume it, checked here where no GPU
 * runs them: every byte of the layout written once; every f16x2 register a lane builds for mma.m16n8k16's A operand
 * (rows g / g + 8, columns 2t + h / 2t + 8 + h of each k-step) decodes to the e2m1 value of that element; every scale
 * a lane takes from its two fetched words (the warp's shuffle emulated) is that element's block scale. */
static void test_nv_tile(void) {
    enum { R = 32, C = 256, NB = C / 32, RB = C / 16 * 9 };
    static uint8_t src[R * RB], dst[R * RB], seen[R * RB];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(urand() * 256);
    memset(seen, 0, sizeof seen);
    for (int64_t ti = 0; ti < R / 16; ti++)
        for (int64_t bi = 0; bi < NB; bi++) {
            const int64_t tb = ti * NB + bi;
            for (int lane = 0; lane < 32; lane++)
                for (int s = 0; s < 2; s++) {
                    const uint32_t w = moet_nv_tile_word(src, RB, ti, bi, lane, s);
                    for (int k = 0; k < 4; k++) { dst[(tb * 32 + lane) * 8 + 4 * s + k] = (uint8_t)(w >> (8 * k)); seen[(tb * 32 + lane) * 8 + 4 * s + k]++; }
                }
            for (int j = 0; j < 32; j++) {
                dst[(size_t)R * NB * 16 + tb * 32 + j] = moet_nv_tile_scale(src, RB, ti, bi, j);
                seen[(size_t)R * NB * 16 + tb * 32 + j]++;
            }
        }
    int once = 1;
    for (size_t i = 0; i < sizeof seen; i++) once &= seen[i] == 1;
    CHECK(once, "nvfp4 tiled layout: not every byte written exactly once");
    int bad_v = 0, bad_s = 0;
    for (int64_t ti = 0; ti < R / 16; ti++)
        for (int64_t c0 = 0; c0 < NB; c0 += 8) { /* a chunk of 8 blocks, as the kernels fetch it */
            const uint32_t *sw = (const uint32_t *)(dst + (size_t)R * NB * 16 + (ti * NB + c0) * 32);
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, t = lane & 3;
                for (int bi = 0; bi < 8; bi++) {
                    const uint8_t *cw = dst + ((ti * NB + c0 + bi) * 32 + lane) * 8;
                    for (int s = 0; s < 2; s++)
                        for (int r = 0; r < 4; r++) {
                            const uint32_t f = moet_fp4x2_f16x2(cw[4 * s + r]);
                            const int row = (int)(16 * ti) + g + 8 * (r & 1);
                            for (int h = 0; h < 2; h++) {
                                const int col = (int)(32 * (c0 + bi)) + 16 * s + 2 * t + 8 * (r >> 1) + h;
                                const moet_block_nvfp4 *b = (const moet_block_nvfp4 *)(src + (size_t)row * RB) + col / 16;
                                const float want = moet_e2m1_values[moet_nvfp4_code(b, col % 16)];
                                const float got = moet_f16_to_f32((uint16_t)(f >> (16 * h)));
                                bad_v += got != want || signbit(got) != signbit(want);
                            }
                        }
                    for (int s = 0; s < 2; s++)
                        for (int half = 0; half < 2; half++) {
                            const int r = g + 8 * half;
                            int which, src_lane, byte;
                            moet_nv_sc_pos(bi, s, r, &which, &src_lane, &byte);
                            const uint32_t word = sw[src_lane + 32 * which]; /* word lane + 32 which, as fetched */
                            const uint8_t got = (uint8_t)(word >> (8 * byte));
                            bad_s += got != ((const moet_block_nvfp4 *)(src + (size_t)(16 * ti + r) * RB))[2 * (c0 + bi) + s].scale;
                        }
                }
            }
        }
    CHECK(!bad_v, "nvfp4 tiled fragments: %d values off", bad_v);
    CHECK(!bad_s, "nvfp4 tiled scales: %d scales off", bad_s);
}

/* The integer tensor-core form of a tiled W2 block (quant/tile.h), checked here where no GPU runs it: mma.m16n8k32
 * (u8 A, s8 B, s32 C/D) emulated element by element from the fragments every lane builds, laid out as the PTX ISA
 * gives them (A: lane 4g + t holds rows g / g + 8, k 4t .. 4t + 3 and 16 + 4t ..; B: k 4t .. and 16 + 4t .., column
 * g; C/D: rows g / g + 8, columns 2t, 2t + 1), and the lanes' results combined as the decode kernels combine them,
 * against the block's dot product in double. */
static void test_q2_i8(void) {
    enum { RB = 9 }; /* one 32-column block a row */
    uint8_t src[16 * RB];
    int worst_ok = 1;
    double worst = 0;
    for (int rep = 0; rep < 200; rep++) {
        for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(urand() * 256);
        const float beta = 0.1f + 0.5f * (float)urand(), A = 0.5f * (1 + beta), B = 0.5f * (1 - beta);
        float t[32];
        double mx = 0;
        for (int c = 0; c < 32; c++) {
            /* as staged: the largest |t| in [64, 128) (moet_i8_exp), the rest anything below */
            t[c] = (float)((urand() * 2 - 1) * (rep % 3 == 0 ? 127.99 : rep % 3 == 1 ? 64.0 : 1e-3));
            if (rep % 3 == 2 && c == 0) t[c] = (float)(64 + 63 * urand());
            if (rep % 7 == 0 && c == 5) t[c] = 127.75f; /* rounds past 127: the clamp */
            mx = fmax(mx, fabs(t[c]));
        }
        int32_t q[32][4], X[4] = {0, 0, 0, 0};
        uint32_t pw[4][16];
        for (int c = 0; c < 32; c++) {
            moet_i8_split(t[c], q[c]);
            for (int Q = 0; Q < 4; Q++) {
                CHECK(q[c][Q] >= -128 && q[c][Q] <= 127, "i8 piece %d of %g out of range: %d", Q, t[c], q[c][Q]);
                X[Q] += q[c][Q];
            }
        }
        for (int pp = 0; pp < 16; pp++)
            for (int Q = 0; Q < 4; Q++) pw[Q][moet_i8_pair_idx(pp)] = moet_i8_pair(q[2 * pp][Q], q[2 * pp + 1][Q]);
        int64_t D[16][8];
        /* C from the lanes, then the two half-blocks' products */
        for (int lane = 0; lane < 32; lane++) {
            const int g = lane >> 2, tt = lane & 3, q0 = 2 * (tt & 1);
            D[g][2 * tt] = moet_i8_cstart(-32 * X[q0], 0);
            D[g][2 * tt + 1] = moet_i8_cstart(-32 * X[q0 + 1], 0);
            D[g + 8][2 * tt] = moet_i8_cstart(-32 * X[q0], 1);
            D[g + 8][2 * tt + 1] = moet_i8_cstart(-32 * X[q0 + 1], 1);
        }
        for (int s = 0; s < 2; s++) {
            uint8_t Am[16][32];
            int8_t Bm[32][8];
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, tt = lane & 3;
                uint32_t a[4];
                moet_q2i8_afrag(moet_q2_tile_word(src, RB, 0, 0, lane), s, a);
                for (int i = 0; i < 16; i++) {
                    const int row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8, col = 4 * tt + (i & 3) + (i >= 8 ? 16 : 0);
                    Am[row][col] = (uint8_t)(a[i >> 2] >> (8 * (i & 3)));
                }
                const uint32_t b[2] = {moet_i8_bword(pw[g & 3][4 * tt + 2 * s], g), moet_i8_bword(pw[g & 3][4 * tt + 2 * s + 1], g)};
                for (int i = 0; i < 8; i++) Bm[4 * tt + (i & 3) + (i >= 4 ? 16 : 0)][g] = (int8_t)(uint8_t)(b[i >> 2] >> (8 * (i & 3)));
            }
            for (int r = 0; r < 16; r++)
                for (int n = 0; n < 8; n++)
                    for (int k = 0; k < 32; k++) D[r][n] += (int64_t)Am[r][k] * Bm[k][n];
        }
        for (int r = 0; r < 16; r++) {
            double got = 0, want = 0;
            for (int lane = 4 * (r & 7); lane < 4 * (r & 7) + 4; lane++) {
                const int tt = lane & 3, hi = r >= 8;
                float k[4];
                moet_i8_coef(tt, A, B, k);
                got += (double)k[2 * hi] * moet_i8_dval((int32_t)D[r][2 * tt]) +
                       (double)k[2 * hi + 1] * moet_i8_dval((int32_t)D[r][2 * tt + 1]);
                CHECK(llabs(D[r][2 * tt] - MOET_I8_MAGIC_BITS) < (1 << 20) && llabs(D[r][2 * tt + 1] - MOET_I8_MAGIC_BITS) < (1 << 20),
                      "i8 accumulator out of range");
            }
            for (int c = 0; c < 32; c++) {
                const uint32_t code = (src[r * RB + 1 + c / 4] >> (2 * (c % 4))) & 3u;
                const double lv = A * ((code >> 1) ? 1.0 : -1.0) + B * ((code & 1) ? 1.0 : -1.0);
                want += lv * t[c];
            }
            const double err = fabs(got - want) / (mx * 32);
            if (err > worst) worst = err;
            if (err > 0x1p-26) worst_ok = 0; /* the pieces keep ~2^-27 of the largest; a wrong fragment is ~1 */
        }
    }
    CHECK(worst_ok, "i8 form of a W2 block: worst error %g of |t|max x 32", worst);
    /* moet_i8_split's rounding without conversions equals rintf's, ties and the clamp included */
    int split_bad = 0;
    for (int i = 0; i < 200000; i++) {
        float t = (float)((urand() * 2 - 1) * 128);
        if (i % 4 == 1) t = (float)((int)(urand() * 255) - 127) + 0.5f;          /* ties */
        if (i % 4 == 2) t = ldexpf((float)(urand() * 2 - 1), -(int)(urand() * 30)); /* small */
        if (i == 3) t = 127.5f;
        if (i == 7) t = -127.75f;
        if (!(fabsf(t) < 128.f)) continue;
        int32_t q[4], w[4];
        moet_i8_split(t, q);
        float r = rintf(t);
        r = r > 127.f ? 127.f : r < -127.f ? -127.f : r;
        w[0] = (int32_t)r;
        float rem = (t - r) * 64.f;
        r = rintf(rem);
        w[1] = (int32_t)r;
        rem = (rem - r) * 128.f;
        r = rintf(rem);
        w[2] = (int32_t)r;
        rem = (rem - r) * 128.f;
        w[3] = (int32_t)rintf(rem);
        split_bad += memcmp(q, w, sizeof q) != 0;
    }
    CHECK(!split_bad, "moet_i8_split differs from the rintf pieces on %d values", split_bad);
    fprintf(stderr, "i8 form of a W2 block: worst error %.3g of |t|max x 32\n", worst);
}

#define N 256

int main(void) {
    g_rng = (uint64_t)time(NULL) * 2654435761u + 1;
    fprintf(stderr, "seed %llu\n", (unsigned long long)g_rng);
    float x[N], y[N];
    for (int rep = 0; rep < 50; rep++) {
        float sc = (float)exp2(urand() * 20 - 14); /* magnitudes from 2^-14 to 2^6 */
        for (int i = 0; i < N; i++) x[i] = gauss() * sc * (urand() < 0.02 ? 8.0f : 1.0f);
        /* Q8_0: |err| <= d/2 per element (d = amax/127 rounded to half) */
        moet_block_q8_0 q8[N / 32];
        moet_q8_0_quantize_row(x, q8, N);
        moet_q8_0_dequantize_row(q8, y, N);
        for (int b = 0; b < N / 32; b++) {
            float d = moet_f16_to_f32(q8[b].d);
            for (int j = 0; j < 32; j++) {
                int i = b * 32 + j;
                /* d is stored as a half: beyond d/2, values past 127 d saturate */
                float bound = fmaxf(0.5f * d, fabsf(x[i]) - 127.0f * d);
                CHECK(fabsf(x[i] - y[i]) <= bound * 1.0001f + 2e-6f * fabsf(x[i]) + 1e-30f, "q8_0 err %g > %g",
                      fabsf(x[i] - y[i]), bound);
            }
        }
        /* MXFP4: within the block scale 2^(e-127), |err| <= half the E2M1 gap at the value (<= 1 * scale below 6
         * scale; values above 6 * scale saturate, so the bound there is |x| - 6 * scale). */
        moet_block_mxfp4 mx[N / 32];
        moet_mxfp4_quantize_row(x, mx, N);
        moet_mxfp4_dequantize_row(mx, y, N);
        for (int b = 0; b < N / 32; b++) {
            float s = ldexpf(1.0f, (int)mx[b].e - 127);
            for (int j = 0; j < 32; j++) {
                int i = b * 32 + j;
                float a = fabsf(x[i]) / s, bound = a > 6 ? a - 6 : a >= 4 ? 1.0f : a >= 2 ? 0.5f : 0.25f;
                CHECK(fabsf(x[i] - y[i]) <= bound * s * 1.0001f + 2e-6f * fabsf(x[i]) + 1e-30f, "mxfp4 err %g > %g", fabsf(x[i] - y[i]), bound * s);
            }
        }
        /* NVFP4: same E2M1 bound with the decoded E4M3 scale times the tensor scale */
        float amax = 0;
        for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(x[i]));
        float ts = moet_nvfp4_tensor_scale(amax);
        moet_block_nvfp4 nv[N / 16];
        moet_nvfp4_quantize_row(x, ts, nv, N);
        moet_nvfp4_dequantize_row(nv, ts, y, N);
        for (int b = 0; b < N / 16; b++) {
            float s = moet_e4m3_to_f32(nv[b].scale) * ts;
            for (int j = 0; j < 16; j++) {
                int i = b * 16 + j;
                float a = s > 0 ? fabsf(x[i]) / s : 0, bound = a > 6 ? a - 6 : a >= 4 ? 1.0f : a >= 2 ? 0.5f : 0.25f;
                CHECK(fabsf(x[i] - y[i]) <= bound * s * 1.0001f + 2e-6f * fabsf(x[i]) + 1e-30f, "nvfp4 err %g > %g (x %g y %g s %g sc %d ts %g)",
                      fabsf(x[i] - y[i]), bound * s, x[i], y[i], s, nv[b].scale, ts);
            }
        }
        /* 2-bit family: with scale s and levels L, |err| <= max(half the largest gap, |x| - max|L| s) */
        for (int kind = 0; kind < 3; kind++) {
            moet_q2_params p = {.kind = (moet_q2_kind)kind, .base = amax, .beta = 0.2f + 0.3f * (float)urand()};
            float lv[4];
            moet_q2_levels(&p, lv);
            if (kind == MOET_Q2_W2)
                for (int c = 0; c < 4; c++) CHECK(lv[c] == -lv[3 - c], "W2 codebook is not sign-symmetric");
            moet_block_q2 q2[N / 32];
            for (int b = 0; b < N / 32; b++) moet_q2_quantize_group(&p, x + b * 32, NULL, 1, &q2[b]);
            moet_q2_dequantize_row(&p, q2, y, N);
            float gap = 0;
            for (int c = 0; c < 3; c++) gap = fmaxf(gap, lv[c + 1] - lv[c]);
            for (int b = 0; b < N / 32; b++) {
                float s = moet_q2_scale(&p, q2[b].sc);
                for (int j = 0; j < 32; j++) {
                    int i = b * 32 + j;
                    float lo = lv[0] * s, hi = lv[3] * s;
                    float bound = x[i] > hi ? x[i] - hi : x[i] < lo ? lo - x[i] : 0.5f * gap * s;
                    CHECK(fabsf(x[i] - y[i]) <= bound * 1.0001f + 2e-6f * fabsf(x[i]) + 1e-30f, "q2 kind %d err %g > %g", kind,
                          fabsf(x[i] - y[i]), bound);
                }
            }
        }
    }
    /* Rotation: orthogonal (norm kept) and inverted exactly (to rounding). */
    {
        double w[768], w0[768], n0 = 0, n1 = 0, md = 0;
        for (int i = 0; i < 768; i++) { w[i] = w0[i] = gauss(); n0 += w[i] * w[i]; }
        moet_rotate_row(w, 768, 7, 0);
        for (int i = 0; i < 768; i++) n1 += w[i] * w[i];
        moet_rotate_row(w, 768, 7, 1);
        for (int i = 0; i < 768; i++) md = fmax(md, fabs(w[i] - w0[i]));
        CHECK(fabs(n1 - n0) <= 1e-9 * n0 && md < 1e-12, "rotation: norm %g -> %g, inverse error %g", n0, n1, md);
        CHECK(moet_hadamard_block(768) == 256 && moet_hadamard_block(96) == 32, "hadamard block size");
    }
    /* Matrix level: correlated inputs (H with a strong low-rank part); GPTQ must beat rounding on the output error
     * E||(W - Q) x||^2 = tr((W-Q) H (W-Q)^T), and beta must land inside the searched range. */
    {
        const int R = 64, C = 128;
        float *W = malloc(sizeof(float) * R * C), *Q1 = malloc(sizeof(float) * R * C), *Q2 = malloc(sizeof(float) * R * C);
        double *H = calloc((size_t)C * C, sizeof(double));
        for (int i = 0; i < R * C; i++) W[i] = gauss() * 0.02f;
        for (int t = 0; t < 2000; t++) { /* x = 3 shared factors + noise, channel scales varying */
            double f[3] = {gauss(), gauss(), gauss()}, xv[128];
            for (int j = 0; j < C; j++) xv[j] = (f[j % 3] * 2 + gauss()) * (1 + (j % 7));
            for (int i = 0; i < C; i++) for (int j = 0; j < C; j++) H[i * C + j] += xv[i] * xv[j] / 2000.0;
        }
        moet_matq_options o = moet_matq_default_options(MOET_QF_W2);
        moet_matq_stats st;
        o.gptq = 0;
        REQUIRE(moet_matq_roundtrip(W, R, C, H, &o, Q1, &st) == 0, "w2 roundtrip");
        CHECK(st.beta >= 0.2f && st.beta <= 0.5f, "beta %g outside the fitted range", st.beta);
        o.gptq = 1;
        REQUIRE(moet_matq_roundtrip(W, R, C, H, &o, Q2, &st) == 0, "w2 gptq roundtrip");
        double e1 = 0, e2 = 0;
        for (int r = 0; r < R; r++)
            for (int i = 0; i < C; i++)
                for (int j = 0; j < C; j++) {
                    e1 += (W[r * C + i] - Q1[r * C + i]) * H[i * C + j] * (W[r * C + j] - Q1[r * C + j]);
                    e2 += (W[r * C + i] - Q2[r * C + i]) * H[i * C + j] * (W[r * C + j] - Q2[r * C + j]);
                }
        fprintf(stderr, "output error: rounding %.4g, error feedback %.4g (%.2fx)\n", e1, e2, e1 / e2);
        CHECK(e2 < 0.8 * e1, "GPTQ did not reduce the output error (%g vs %g)", e2, e1);
        free(W); free(Q1); free(Q2); free(H);
    }
    /* 2-bit dot products straight from blocks (q2dot.c): the SIMD path and the scalar reference both equal the
     * float64 dot of the dequantized row, to float rounding of the sums */
    {
        int simd = moet_q2_dot_simd_available();
        double worst_ref = 0, worst_simd = 0;
        for (int rep = 0; rep < 60; rep++) {
            moet_q2_params qp = {.kind = (moet_q2_kind)(rep % 3), .base = (float)exp2(urand() * 8 - 4),
                                 .beta = (float)(0.2 + 0.6 * urand())};
            moet_block_q2 blk[4][N / 32];
            const moet_block_q2 *rows[4] = {blk[0], blk[1], blk[2], blk[3]};
            for (int r = 0; r < 4; r++)
                for (int g = 0; g < N / 32; g++) {
                    blk[r][g].sc = (uint8_t)(urand() * 256);
                    for (int k = 0; k < 8; k++) blk[r][g].qs[k] = (uint8_t)(urand() * 256);
                }
            for (int i = 0; i < N; i++) x[i] = gauss();
            const int nr = 1 + rep % 4;
            float o_ref[4], o_simd[4];
            moet_q2_dot_rows_ref(&qp, rows, nr, x, N, o_ref);
            moet_q2_dot_rows(&qp, rows, nr, x, N, o_simd);
            for (int r = 0; r < nr; r++) {
                moet_q2_dequantize_row(&qp, blk[r], y, N);
                double d = 0, mag = 0;
                for (int i = 0; i < N; i++) { d += (double)y[i] * x[i]; mag += fabs((double)y[i] * x[i]); }
                worst_ref = fmax(worst_ref, fabs(o_ref[r] - d) / mag);
                worst_simd = fmax(worst_simd, fabs(o_simd[r] - d) / mag);
            }
        }
        fprintf(stderr, "2-bit block dot (%s path): worst |err| / sum|w x|: reference %.2g, fast %.2g\n",
                simd ? "AVX2+FMA" : "scalar", worst_ref, worst_simd);
        CHECK(worst_ref < 1e-6 && worst_simd < 1e-6, "2-bit dot products off: %.3g / %.3g", worst_ref, worst_simd);
    }
    test_nv_tile();
    test_q2_i8();
    test_q8t();
    test_i8_f32();
    /* NVFP4 straight-from-blocks dot (fp4dot.c): the SIMD and scalar versions against the dequantized row in double,
     * every scale code (subnormal E4M3 included) */
    {
        enum { NR = 4, NC = 512 };
        static moet_block_nvfp4 blk[NR][NC / 16];
        float xs[NC], wf[NC];
        for (int i = 0; i < NC; i++) xs[i] = gauss();
        double worst_ref = 0, worst_simd = 0;
        for (int rep = 0; rep < 20; rep++) {
            const moet_block_nvfp4 *rows[NR];
            for (int r = 0; r < NR; r++) {
                for (int g = 0; g < NC / 16; g++) {
                    for (int j = 0; j < 8; j++) blk[r][g].qs[j] = (uint8_t)(urand() * 256);
                    uint8_t sc;
                    do sc = (uint8_t)(urand() * 256); while ((sc & 0x7f) == 0x7f); /* not NaN */
                    blk[r][g].scale = sc;
                }
                rows[r] = blk[r];
            }
            const float ts = (float)exp2(urand() * 10 - 8);
            float o_ref[NR], o_simd[NR];
            moet_nvfp4_dot_rows_ref(rows, NR, ts, xs, NC, o_ref);
            moet_nvfp4_dot_rows(rows, NR, ts, xs, NC, o_simd);
            for (int r = 0; r < NR; r++) {
                moet_nvfp4_dequantize_row(blk[r], ts, wf, NC);
                double d = 0, m = 0;
                for (int i = 0; i < NC; i++) { d += (double)wf[i] * xs[i]; m += fabs((double)wf[i] * xs[i]); }
                worst_ref = fmax(worst_ref, fabs(o_ref[r] - d) / m);
                worst_simd = fmax(worst_simd, fabs(o_simd[r] - d) / m);
            }
        }
        fprintf(stderr, "NVFP4 block dot (%s path): worst |err| / sum|w x|: reference %.2g, fast %.2g\n",
                moet_q2_dot_simd_available() ? "AVX2+FMA" : "scalar", worst_ref, worst_simd);
        CHECK(worst_ref < 1e-6 && worst_simd < 1e-6, "NVFP4 dot products off: %.3g / %.3g", worst_ref, worst_simd);
    }
    /* The token-batched forms (the CPU backend's products at every token count): each token's result bit for bit
     * the one-token function's, fast and reference alike, for 1..MOET_DOT_TOKENS tokens at a stride (batch
     * invariance: a window at once = token by token) */
    {
        enum { NC = 256, NT = MOET_DOT_TOKENS, LD = NC + 32 };
        static float xt[NT * LD];
        static moet_block_q2 q2row[NC / 32];
        static moet_block_nvfp4 f4row[NC / 16];
        int differ = 0, checked = 0;
        for (int rep = 0; rep < 12; rep++) {
            moet_q2_params qp = {.kind = (moet_q2_kind)(rep % 3), .base = (float)exp2(urand() * 8 - 4),
                                 .beta = (float)(0.2 + 0.6 * urand())};
            for (int g = 0; g < NC / 32; g++) {
                q2row[g].sc = (uint8_t)(urand() * 256);
                for (int k = 0; k < 8; k++) q2row[g].qs[k] = (uint8_t)(urand() * 256);
            }
            for (int g = 0; g < NC / 16; g++) {
                for (int j = 0; j < 8; j++) f4row[g].qs[j] = (uint8_t)(urand() * 256);
                uint8_t sc;
                do sc = (uint8_t)(urand() * 256); while ((sc & 0x7f) == 0x7f);
                f4row[g].scale = sc;
            }
            const float ts = (float)exp2(urand() * 10 - 8);
            for (int i = 0; i < NT * LD; i++) xt[i] = gauss();
            const int nt = rep == 0 ? 1 : rep == 1 ? NT : 1 + (int)(urand() * NT);
            float tq[NT], tqr[NT], tf[NT], tfr[NT];
            moet_q2_dot_tokens(&qp, q2row, xt, LD, nt, NC, tq);
            moet_q2_dot_tokens_ref(&qp, q2row, xt, LD, nt, NC, tqr);
            moet_nvfp4_dot_tokens(f4row, ts, xt, LD, nt, NC, tf);
            moet_nvfp4_dot_tokens_ref(f4row, ts, xt, LD, nt, NC, tfr);
            for (int t = 0; t < nt; t++) {
                const moet_block_q2 *qr = q2row;
                const moet_block_nvfp4 *fr = f4row;
                float a, b, c, d;
                moet_q2_dot_rows(&qp, &qr, 1, xt + (size_t)t * LD, NC, &a);
                moet_q2_dot_rows_ref(&qp, &qr, 1, xt + (size_t)t * LD, NC, &b);
                moet_nvfp4_dot_rows(&fr, 1, ts, xt + (size_t)t * LD, NC, &c);
                moet_nvfp4_dot_rows_ref(&fr, 1, ts, xt + (size_t)t * LD, NC, &d);
                differ += memcmp(&a, &tq[t], 4) != 0;
                differ += memcmp(&b, &tqr[t], 4) != 0;
                differ += memcmp(&c, &tf[t], 4) != 0;
                differ += memcmp(&d, &tfr[t], 4) != 0;
                checked += 4;
            }
        }
        fprintf(stderr, "token-batched block dots: %d of %d results differ from the one-token functions'\n", differ, checked);
        CHECK(differ == 0, "token-batched dots not bit-identical to one token at a time: %d of %d", differ, checked);
    }
    TEST_END();
}
