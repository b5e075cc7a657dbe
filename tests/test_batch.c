/*
 * test_batch.c — batched decode (moet_batch_decode: one forward over the next token of several sessions) against
 * each session decoding alone: same logits (to float rounding; the CPU backend computes rows independently, so
 * bit-identical there) and same greedy continuations, for sessions at different positions with different prompts.
 * Runs on the model's default device (cuda on the device machine, cpu here). The batch's sessions share a paged KV
 * pool, the single ones have their own. Half the single sessions and the
 * batch keep sampling candidates (n_candidates; a batch always does where the backend has topk): each row's must be
 * the k largest of the row fetched afterwards (moet_session_logits / moet_batch_logits copy it on demand), and that
 * row must still equal the other path's. Three passes: f32 caches, f16 caches, and f16 with one session's f32 (rows
 * of two cache types: attn_rows takes one type, so that batch goes row by row).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moet.h"
#include "test_util.h"

#define NS 5
#define STEPS 12
#define NC 64

static const float *g_l;
static int cmp_logit(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_l[x] != g_l[y]) return g_l[x] > g_l[y] ? -1 : 1;
    return x - y;
}
/* 1 when (ids, vals) are the k largest of l (value descending, equal values by lower id), values bit-equal */
static int cands_ok(const float *l, int32_t V, const int32_t *ids, const float *vals, int32_t k) {
    static int32_t order[1 << 18];
    if (V > (int32_t)(sizeof order / sizeof order[0]) || !ids || !vals) return 0;
    for (int32_t i = 0; i < V; i++) order[i] = i;
    g_l = l;
    qsort(order, (size_t)V, sizeof order[0], cmp_logit);
    for (int32_t i = 0; i < k; i++)
        if (ids[i] != order[i] || memcmp(&vals[i], &l[order[i]], sizeof(float))) return 0;
    return 1;
}

/* One run of the comparison: pass 0 every cache f32, 1 every cache f16, 2 f16 but one session f32 (a batch whose rows
 * mix cache types goes row by row). */
static void run_pass(moet_model *m, int32_t V, int pass) {
    char err[512];
    moet_session_options so = moet_session_default_options();
    so.n_ctx = 256;
    so.kv_type = pass ? MOET_KV_F16 : MOET_KV_F32;
    moet_session *a[NS], *b[NS];
    int32_t next_a[NS], next_b[NS];
    moet_session_options sc = so, sb = so;
    sc.n_candidates = NC;
    /* the batch's sessions share one paged pool of 4-token blocks (their tables interleave as they grow); the
     * single sessions have pools of their own */
    moet_kv_options ko = moet_kv_default_options();
    ko.n_tokens = NS * 64;
    ko.block_tokens = 4;
    ko.type = so.kv_type;
    REQUIRE(moet_kv_create(m, &ko, &sb.kv, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < NS; i++) {
        /* pass 2: the last session in f32, alone and in the batch (a pool of its own): rows of two cache types */
        moet_session_options o1 = i & 1 ? sc : so, o2 = sb;
        if (pass == 2 && i == NS - 1) { o1.kv_type = o2.kv_type = MOET_KV_F32; o2.kv = NULL; }
        REQUIRE(moet_session_create(m, &o1, &a[i], err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_create(m, &o2, &b[i], err, sizeof err) == 0, "%s", err);
        int32_t prompt[64];
        const int n = 3 + 7 * i;  /* different lengths: the rows sit at different positions */
        for (int k = 0; k < n; k++) prompt[k] = (int32_t)((k * 131 + i * 977 + 17) % (V - 1));
        REQUIRE(moet_session_eval(a[i], prompt, n, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_eval(b[i], prompt, n, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        const float *l = moet_session_logits(a[i], NULL);
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++) best = l[v] > l[best] ? v : best;
        next_a[i] = next_b[i] = best;
    }
    moet_batch *bt;
    REQUIRE(moet_batch_create(m, NS, so.n_ctx, &bt, err, sizeof err) == 0, "%s", err);
    double worst = 0;
    int identical = 1, same_ids = 1, cand_rows = 0, cand_bad = 0;
    for (int step = 0; step < STEPS; step++) {
        /* a shrinking, reordered batch: rows join and leave, as in a server */
        int n = step < 4 ? NS : NS - (step % 3);
        moet_session *rows[NS];
        int32_t toks[NS];
        int map[NS];
        for (int r = 0; r < n; r++) {
            map[r] = (r + step) % NS;
            rows[r] = b[map[r]];
            toks[r] = next_b[map[r]];
        }
        REQUIRE(moet_batch_decode(bt, rows, toks, n, err, sizeof err) == 0, "%s", err);
        for (int r = 0; r < n; r++) {
            const int i = map[r];
            REQUIRE(moet_session_eval(a[i], &next_a[i], 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            const int32_t *ca = NULL, *cb = NULL;
            const float *va = NULL, *vb = NULL;
            const int32_t ka = moet_session_candidates(a[i], &ca, &va), kb = moet_batch_candidates(bt, r, &cb, &vb);
            const float *la = moet_session_logits(a[i], NULL), *lb = moet_batch_logits(bt, r);
            if (ka) { cand_rows++; cand_bad += ka != (NC < V ? NC : V) || !cands_ok(la, V, ca, va, ka); }
            if (kb) { cand_rows++; cand_bad += !cands_ok(lb, V, cb, vb, kb); }
            CHECK(ka == 0 || i & 1, "row %d: a session without candidates has some", r);
            double mx = 0, md = 0;
            int32_t ba = 0, bb = 0;
            for (int32_t v = 0; v < V; v++) {
                mx = fmax(mx, fabs(la[v]));
                md = fmax(md, fabs((double)la[v] - lb[v]));
                ba = la[v] > la[ba] ? v : ba;
                bb = lb[v] > lb[bb] ? v : bb;
            }
            worst = fmax(worst, md / mx);
            identical &= memcmp(la, lb, (size_t)V * sizeof(float)) == 0;
            same_ids &= ba == bb;
            CHECK(moet_session_pos(a[i]) == moet_session_pos(b[i]), "row %d: positions differ", r);
            next_a[i] = ba;
            next_b[i] = bb;
        }
    }
    fprintf(stderr, "%s: batched decode of up to %d sessions vs alone, %d steps: max relative logit difference %.3g (%s), "
            "greedy ids %s\n", pass == 0 ? "f32 caches" : pass == 1 ? "f16 caches" : "f16 caches and one f32", NS, STEPS,
            worst, identical ? "bit-identical" : "close", same_ids ? "equal" : "DIFFER");
    fprintf(stderr, "sampling candidates: %d rows checked, %d wrong\n", cand_rows, cand_bad);
    CHECK(cand_rows > 0 && cand_bad == 0, "candidates: %d of %d rows are not the rows' top %d", cand_bad, cand_rows, NC);
    /* f16 caches: the batch's k and v rows come from other kernels than a single session's (to float rounding: 6.7e-7
     * of the logits with f32 on an H100), and such a difference can cross an f16 rounding boundary: one element one
     * f16 ulp (4.9e-4) apart, 2.3e-5 of the logits there (stop 42). 1e-4: a fifth of f16's unit roundoff. */
    const double tol = pass ? 1e-4 : 1e-5;
    CHECK(worst <= tol, "batched logits differ from single-session decode by %.3g (tolerance %.1g)", worst, tol);
    CHECK(same_ids, "greedy continuations differ");
    /* misuse is an error, not a crash */
    moet_session *dup[2] = {b[0], b[0]};
    int32_t t2[2] = {1, 1};
    CHECK(moet_batch_decode(bt, dup, t2, 2, err, sizeof err) != 0, "the same session twice was accepted");
    int32_t bad = V;
    CHECK(moet_batch_decode(bt, b, &bad, 1, err, sizeof err) != 0, "a token past the vocabulary was accepted");
    moet_batch_free(bt);
    for (int i = 0; i < NS; i++) { moet_session_free(a[i]); moet_session_free(b[i]); }
    moet_kv_free(sb.kv);
}

int main(int argc, char **argv) {
    int32_t V;
    moet_model *m = test_model_open(argc, argv, &V);
    for (int pass = 0; pass < 3; pass++) run_pass(m, V, pass);
    moet_model_free(m);
    TEST_END();
}
