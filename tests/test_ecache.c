/*
 * test_ecache.c — the expert cache (backend/expert_cache.h) through the public API:
 *   - a model that holds at most 40 of its 256 routed experts (moe-mini-a: 8 layers x 32, top 4) gives the same logits
 *     bit for bit as the model holding all of them, over a prompt evaluated a token a step and greedy decode steps:
 *     each step that routed to a missing expert was run again once it was fetched, and a step that completes is the
 *     resident forward; the counts show that experts were fetched, evicted and steps replayed (stop 21: 1636
 *     fetched, 1596 evicted, 179 steps run again over 34 steps);
 *   - a prompt evaluated in one step on those 40 slots: the session retries it in smaller steps, same argmax;
 *   - slots too few for one token's experts (16 < 8 layers x 4) fail the eval with MOET_ENOMEM and a message;
 *   - with pinned homes (direct mode: a missing expert computed where it waits, fetched after the step) the same
 *     logits with no step run again, and 16 slots suffice;
 *   - a batched decode step on the cached model equals the same step on the resident one;
 *   - with a delta pack (a W2 pack whose X.delta.gguf lies beside it), the delta turned on after the prompt: the
 *     residuals arrive in the slots of experts already resident, and decode with them stays bit-identical.
 * usage: test_ecache MODEL [DEVICE [pinned|mapped]]   (DEVICE cpu by default; cuda exits 77, skipped, where there is no GPU: the CPU
 * backend carries the protocol with nothing to move, the CUDA backend moves the experts into device slots)
 */
#include <stdlib.h>
#include <string.h>

#include "moet.h"
#include "runtime/session_int.h"
#include "test_util.h"

static const char *g_dev = "cpu";
static int g_pinned; /* the experts outside the slots in pinned host RAM (a device backend) */

static moet_model *open_dev(const char *path, int64_t slots) {
    moet_model_options mo = moet_model_default_options();
    mo.device = g_dev;
    mo.n_threads = 2;
    mo.expert_slots = slots;
    mo.expert_pinned = g_pinned;
    moet_model *m;
    char err[512];
    const int rc = moet_model_load(path, &mo, &m, err, sizeof err);
    if (rc != 0 && strncmp(g_dev, "cuda", 4) == 0 && !slots) {
        fprintf(stderr, "SKIP: no CUDA backend here (%s): this test runs on the device machine\n", err);
        exit(TEST_SKIP_CODE);
    }
    REQUIRE(rc == 0, "%s", err);
    return m;
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 2, "usage: %s MODEL [DEVICE]", argv[0]);
    if (argc >= 3) g_dev = argv[2];
    if (argc >= 4) g_pinned = !strcmp(argv[3], "pinned");
    moet_model *full = open_dev(argv[1], 0), *cached = open_dev(argv[1], 40), *tiny = open_dev(argv[1], 16);
    moet_model_info info;
    moet_model_info_get(full, &info);
    const int32_t V = info.vocab_size;
    fprintf(stderr, "%s on %s%s, experts outside the slots %s\n", argv[1], info.device,
            info.has_delta ? ", with its delta" : "", g_pinned ? "pinned" : "mapped");
    char err[512];
    moet_session_options so = moet_session_default_options();
    so.n_ctx = 64;
    so.n_batch = 1; /* a token a step: one step's experts (8 x 4) fit the 40 slots */
    moet_session *a, *b, *c;
    REQUIRE(moet_session_create(full, &so, &a, err, sizeof err) == 0, "%s", err);
    REQUIRE(moet_session_create(cached, &so, &b, err, sizeof err) == 0, "%s", err);
    REQUIRE(moet_session_create(tiny, &so, &c, err, sizeof err) == 0, "%s", err);

    const int32_t prompt[10] = {16, 201, 464, 77, 1033, 5, 908, 42, 311, 2047};
    int rc_a = moet_session_eval(a, prompt, 10, MOET_LOGITS_LAST, err, sizeof err);
    REQUIRE(rc_a == 0, "%s", err);
    int rc_b = moet_session_eval(b, prompt, 10, MOET_LOGITS_LAST, err, sizeof err);
    REQUIRE(rc_b == 0, "%s", err);
    int same = !memcmp(moet_session_logits(a, NULL), moet_session_logits(b, NULL), sizeof(float) * (size_t)V);
    for (int step = 0; step < 24 && same; step++) {
        const float *la = moet_session_logits(a, NULL);
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++) best = la[i] > la[best] ? i : best;
        REQUIRE(moet_session_eval(a, &best, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_eval(b, &best, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        same = !memcmp(moet_session_logits(a, NULL), moet_session_logits(b, NULL), sizeof(float) * (size_t)V);
    }
    int64_t fetched, evicted, replays;
    moet_model_expert_cache_stats(cached, &fetched, &evicted, &replays);
    fprintf(stderr, "40 of 256 experts resident, 34 steps: %lld fetched, %lld evicted, %lld steps run again; logits %s\n",
            (long long)fetched, (long long)evicted, (long long)replays, same ? "bit-identical" : "DIFFER");
    CHECK(same, "the cached model's logits differ from the resident model's");
    /* pinned homes: direct mode, a missing expert is computed where it waits and no step runs again */
    CHECK(fetched >= 40 && evicted > 0 && (g_pinned ? replays == 0 : replays > 0),
          "fetched %lld, evicted %lld, replays %lld", (long long)fetched, (long long)evicted, (long long)replays);
    int64_t f0;
    moet_model_expert_cache_stats(full, &f0, NULL, NULL);
    CHECK(f0 == 0, "the resident model counted %lld fetches", (long long)f0);

    /* a prompt in one step routes to more experts than 40 slots hold: the session retries it in smaller steps
     * (the same tokens; the logits of a chunked prefill are close to, not bit-equal with, one step's) */
    {
        moet_session_options sw = so;
        sw.n_batch = 16;
        moet_session *p1, *p2;
        REQUIRE(moet_session_create(full, &sw, &p1, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_create(cached, &sw, &p2, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_eval(p1, prompt, 10, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        const int prc = moet_session_eval(p2, prompt, 10, MOET_LOGITS_LAST, err, sizeof err);
        CHECK(prc == 0, "a 10-token prompt on 40 slots: %s", err);
        if (prc == 0) {
            const float *l1 = moet_session_logits(p1, NULL), *l2 = moet_session_logits(p2, NULL);
            double md = 0, mx = 0;
            int32_t b1 = 0, b2 = 0;
            for (int32_t i = 0; i < V; i++) {
                const double d = l1[i] > l2[i] ? l1[i] - l2[i] : l2[i] - l1[i];
                md = d > md ? d : md;
                mx = (l1[i] > 0 ? l1[i] : -l1[i]) > mx ? (l1[i] > 0 ? l1[i] : -l1[i]) : mx;
                b1 = l1[i] > l1[b1] ? i : b1;
                b2 = l2[i] > l2[b2] ? i : b2;
            }
            fprintf(stderr, "a 10-token prompt on 40 slots: max |diff| / max |logit| %.2e, argmax %d / %d\n",
                    md / (mx > 0 ? mx : 1), b1, b2);
            CHECK(md <= 1e-4 * mx && b1 == b2, "the prompt in smaller steps differs: %.3e of %.3e", md, mx);
        }
        moet_session_free(p1);
        moet_session_free(p2);
    }

    /* one token routes to 8 x 4 experts: 16 slots cannot hold them */
    const int rc = moet_session_eval(c, prompt, 1, MOET_LOGITS_LAST, err, sizeof err);
    if (g_pinned) /* direct mode: the experts beyond the slots are read where they wait */
        CHECK(rc == 0, "16 slots, direct mode: rc %d (%s)", rc, err);
    else
        CHECK(rc == MOET_ENOMEM && strstr(err, "expert cache"), "16 slots: rc %d (%s)", rc, err);

    /* a batched step of 3 sequences (up to 96 experts a step: the cached model needs more slots) */
    moet_model *wide = open_dev(argv[1], 120);
    moet_batch *ba, *bb;
    REQUIRE(moet_batch_create(full, 3, 64, &ba, err, sizeof err) == 0, "%s", err);
    REQUIRE(moet_batch_create(wide, 3, 64, &bb, err, sizeof err) == 0, "%s", err);
    moet_session *sa[3], *sb[3];
    for (int i = 0; i < 3; i++) {
        REQUIRE(moet_session_create(full, &so, &sa[i], err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_create(wide, &so, &sb[i], err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_eval(sa[i], prompt + 3 * i, 3, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_eval(sb[i], prompt + 3 * i, 3, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
    }
    int bsame = 1;
    for (int step = 0; step < 6 && bsame; step++) {
        const int32_t tok[3] = {100 + step, 200 + step, 300 + step};
        REQUIRE(moet_batch_decode(ba, sa, tok, 3, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_batch_decode(bb, sb, tok, 3, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < 3; i++)
            bsame = bsame && !memcmp(moet_batch_logits(ba, i), moet_batch_logits(bb, i), sizeof(float) * (size_t)V);
    }
    moet_model_expert_cache_stats(wide, &fetched, &evicted, &replays);
    fprintf(stderr, "batched, 120 slots: %lld fetched, %lld evicted, %lld steps run again; logits %s\n", (long long)fetched,
            (long long)evicted, (long long)replays, bsame ? "bit-identical" : "DIFFER");
    CHECK(bsame, "batched decode on the cached model differs");
    CHECK(g_pinned ? replays == 0 : replays > 0, "the batched run: %lld replays", (long long)replays);

    /* the delta turned on after the prompt: on the cached model its residuals come to experts already resident */
    if (info.has_delta) {
        moet_session *da, *db;
        REQUIRE(moet_session_create(full, &so, &da, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_create(cached, &so, &db, err, sizeof err) == 0, "%s", err);
        moet_session_use_delta(da, 0);
        moet_session_use_delta(db, 0);
        REQUIRE(moet_session_eval(da, prompt, 10, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_eval(db, prompt, 10, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        moet_session_use_delta(da, 1);
        moet_session_use_delta(db, 1);
        int dsame = 1, dchanged = 0;
        for (int step = 0; step < 10 && dsame; step++) {
            const float *la = moet_session_logits(da, NULL);
            int32_t best = 0;
            for (int32_t i = 1; i < V; i++) best = la[i] > la[best] ? i : best;
            REQUIRE(moet_session_eval(da, &best, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            REQUIRE(moet_session_eval(db, &best, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            dsame = !memcmp(moet_session_logits(da, NULL), moet_session_logits(db, NULL), sizeof(float) * (size_t)V);
            /* the same token without the delta, for a check that the delta took part */
            if (step == 0) {
                moet_session *z;
                REQUIRE(moet_session_create(full, &so, &z, err, sizeof err) == 0, "%s", err);
                moet_session_use_delta(z, 0);
                REQUIRE(moet_session_eval(z, prompt, 10, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
                REQUIRE(moet_session_eval(z, &best, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
                dchanged = memcmp(moet_session_logits(z, NULL), moet_session_logits(da, NULL), sizeof(float) * (size_t)V) != 0;
                moet_session_free(z);
            }
        }
        moet_model_expert_cache_stats(cached, &fetched, &evicted, &replays);
        fprintf(stderr, "delta on after the prompt, 40 slots: %lld fetched, %lld evicted, %lld steps run again "
                "(all runs of this model); logits %s\n", (long long)fetched, (long long)evicted, (long long)replays,
                dsame ? "bit-identical" : "DIFFER");
        CHECK(dsame, "decode with the delta on the cached model differs");
        CHECK(dchanged, "the delta did not change the logits: it did not take part");
        moet_session_free(da);
        moet_session_free(db);
    }

    for (int i = 0; i < 3; i++) { moet_session_free(sa[i]); moet_session_free(sb[i]); }
    moet_batch_free(ba);
    moet_batch_free(bb);
    moet_session_free(a);
    moet_session_free(b);
    moet_session_free(c);
    moet_model_free(full);
    moet_model_free(cached);
    moet_model_free(tiny);
    moet_model_free(wide);
    TEST_END();
}
