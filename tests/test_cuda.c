/*
 * test_cuda.c — the CUDA backend end to end against the CPU reference, and graph replay against eager launches.
 *
 * usage: test_cuda MODEL   (exits 77, skipped, where there is no GPU)
 * Checks on pseudo-random token windows (fresh each run):
 *   - prefill logits: max |cuda - cpu| / max |cpu| <= 1e-4;
 *   - 32 greedy decode steps: the same ids on both, each step's logits within 1e-4;
 *   - a CUDA session replaying recorded decode steps (graphs = 1) and one launching every kernel (graphs = 0) give
 *     bit-identical logits at every step.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "moet.h"
#include "test_util.h"

static double rel_err(const float *a, const float *b, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d;
        if (fabs(b[i]) > mr) mr = fabs(b[i]);
    }
    return md / (mr > 0 ? mr : 1);
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    REQUIRE(argc == 2, "usage: test_cuda MODEL");
    char err[1024];
    moet_model_options mo = moet_model_default_options();
    mo.device = "cuda";
    moet_model *mc, *mh;
    if (moet_model_load(argv[1], &mo, &mc, err, sizeof err) != MOET_OK) {
        fprintf(stderr, "SKIP: no CUDA backend here (%s): this test runs on the device machine\n", err);
        return TEST_SKIP_CODE;
    }
    mo.device = "cpu";
    REQUIRE(moet_model_load(argv[1], &mo, &mh, err, sizeof err) == MOET_OK, "%s", err);
    moet_model_info info;
    moet_model_info_get(mc, &info);
    fprintf(stderr, "cuda: %s\n", info.device);
    const int V = info.vocab_size, P = 48, D = 32;
    moet_session_options so = moet_session_default_options();
    so.n_ctx = P + D + 1;
    so.n_logits = P;
    so.kv_type = MOET_KV_F32; /* CUDA against the fp32 CPU reference; CUDA's own default (f16) at the end */
    moet_session *sc, *sh, *se;
    REQUIRE(moet_session_create(mc, &so, &sc, err, sizeof err) == 0, "%s", err);
    REQUIRE(moet_session_create(mh, &so, &sh, err, sizeof err) == 0, "%s", err);
    moet_session_options soe = so;
    soe.graphs = 0;
    REQUIRE(moet_session_create(mc, &soe, &se, err, sizeof err) == 0, "%s", err);
    uint64_t rng = (uint64_t)time(NULL) | 1;
    fprintf(stderr, "seed %llu\n", (unsigned long long)rng);
    float *keep = malloc((size_t)P * V * sizeof(float));
    for (int w = 0; w < 3; w++) {
        int32_t ids[48];
        for (int i = 0; i < P; i++) { rng = rng * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int32_t)((rng >> 33) % (uint64_t)V); }
        moet_session_truncate(sc, 0, NULL, 0);
        moet_session_truncate(sh, 0, NULL, 0);
        moet_session_truncate(se, 0, NULL, 0);
        REQUIRE(moet_session_eval(sc, ids, P, MOET_LOGITS_ALL, err, sizeof err) == 0, "%s", err);
        memcpy(keep, moet_session_logits(sc, NULL), (size_t)P * V * sizeof(float));
        REQUIRE(moet_session_eval(sh, ids, P, MOET_LOGITS_ALL, err, sizeof err) == 0, "%s", err);
        double e = rel_err(keep, moet_session_logits(sh, NULL), (size_t)P * V);
        fprintf(stderr, "window %d: prefill max |cuda - cpu| / max |cpu| = %.3g\n", w, e);
        CHECK(e <= 1e-4, "window %d: prefill relative error %.3g", w, e);
        REQUIRE(moet_session_eval(se, ids, P, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        int32_t tc = argmax(keep + (size_t)(P - 1) * V, V), th = argmax(moet_session_logits(sh, NULL) + (size_t)(P - 1) * V, V);
        int same_ids = 1, bit_equal = 1;
        double worst = 0;
        for (int d = 0; d < D; d++) {
            if (tc != th) { same_ids = 0; break; }
            REQUIRE(moet_session_eval(sc, &tc, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            REQUIRE(moet_session_eval(sh, &th, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            REQUIRE(moet_session_eval(se, &tc, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            const float *lc = moet_session_logits(sc, NULL), *lh = moet_session_logits(sh, NULL),
                        *le = moet_session_logits(se, NULL);
            double ed = rel_err(lc, lh, (size_t)V);
            if (ed > worst) worst = ed;
            if (memcmp(lc, le, (size_t)V * sizeof(float))) bit_equal = 0;
            tc = argmax(lc, V);
            th = argmax(lh, V);
        }
        fprintf(stderr, "window %d: %d decode steps: greedy ids %s, worst step error %.3g, graph replay %s eager\n", w,
                D, same_ids ? "equal" : "DIFFER", worst, bit_equal ? "bit-identical to" : "DIFFERS from");
        CHECK(same_ids, "window %d: greedy ids differ between cuda and cpu", w);
        CHECK(worst <= 1e-4, "window %d: decode logits relative error %.3g", w, worst);
        CHECK(bit_equal, "window %d: graph replay is not bit-identical to eager launches", w);
    }
    { /* CUDA's default cache (auto: f16, docs/design.md decision 17): graph replay bit-identical to eager launches
       * there too (its numerics against the fp32 reference: test_logits' f16 block, test_batch, test_ops) */
        moet_session_options sd = moet_session_default_options();
        sd.n_ctx = P + D + 1;
        moet_session *gd, *ed;
        REQUIRE(moet_session_create(mc, &sd, &gd, err, sizeof err) == 0, "%s", err);
        sd.graphs = 0;
        REQUIRE(moet_session_create(mc, &sd, &ed, err, sizeof err) == 0, "%s", err);
        CHECK(moet_session_kv_type(gd) == MOET_KV_F16, "CUDA's auto KV cache: type %d, expected f16",
              moet_session_kv_type(gd));
        int32_t ids[48];
        for (int i = 0; i < P; i++) { rng = rng * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int32_t)((rng >> 33) % (uint64_t)V); }
        REQUIRE(moet_session_eval(gd, ids, P, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_eval(ed, ids, P, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        int bit_equal = !memcmp(moet_session_logits(gd, NULL), moet_session_logits(ed, NULL), (size_t)V * sizeof(float));
        int32_t t = argmax(moet_session_logits(gd, NULL), V);
        for (int d = 0; d < D; d++) {
            REQUIRE(moet_session_eval(gd, &t, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            REQUIRE(moet_session_eval(ed, &t, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            if (memcmp(moet_session_logits(gd, NULL), moet_session_logits(ed, NULL), (size_t)V * sizeof(float)))
                bit_equal = 0;
            t = argmax(moet_session_logits(gd, NULL), V);
        }
        fprintf(stderr, "default (f16) cache: %d decode steps, graph replay %s eager\n", D,
                bit_equal ? "bit-identical to" : "DIFFERS from");
        CHECK(bit_equal, "f16 cache: graph replay is not bit-identical to eager launches");
        moet_session_free(gd);
        moet_session_free(ed);
    }
    free(keep);
    moet_session_free(sc);
    moet_session_free(sh);
    moet_session_free(se);
    moet_model_free(mc);
    moet_model_free(mh);
    TEST_END();
}
