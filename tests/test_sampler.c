/*
 * test_sampler.c — sampler semantics on hand-made distributions, each checked against what the option means:
 * greedy = argmax; a seed fixes the stream; top-k/top-p/min-p never pick outside their sets; temperature moves the
 * empirical frequencies the way softmax(l / T) says; penalties change the argmax as HF's definitions say.
 */
#include <math.h>
#include <string.h>

#include "moet.h"
#include "test_util.h"

#define V 8

static moet_sampler *mk(moet_sampler_options o) {
    moet_sampler *s;
    char err[256];
    REQUIRE(moet_sampler_create(&o, V, &s, err, sizeof err) == 0, "%s", err);
    return s;
}

/* ---- candidates: moet_sampler_sample_candidates against moet_sampler_sample on the full row ----------------------
 * Two samplers with one seed, one fed full rows, the other the row's K largest (sorted as the backends' topk gives
 * them: value descending, ties by lower id) and the full row only where it answers -1: the two token streams must
 * be identical (a wrong decision, or a draw where it should have declined, shifts the random stream), and the
 * candidates must decide where the options allow (and never where they do not). Every other row is quantised to
 * quarters, so ties, also at the boundary, are common there. */
#define CV 3000
#define CK 64
static uint64_t g_rs = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    g_rs ^= g_rs << 13; g_rs ^= g_rs >> 7; g_rs ^= g_rs << 17;
    return (double)(g_rs >> 11) * (1.0 / 9007199254740992.0);
}
static const float *g_row;
static int cmp_row(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_row[x] != g_row[y]) return g_row[x] > g_row[y] ? -1 : 1;
    return x - y;
}
static int check_candidates(moet_sampler_options o, int32_t k, int expect_decide, const char *what) {
    char err[256];
    moet_sampler *a, *b;
    REQUIRE(moet_sampler_create(&o, CV, &a, err, sizeof err) == 0 && moet_sampler_create(&o, CV, &b, err, sizeof err) == 0,
            "%s", err);
    static float row[CV], vals[CV];
    static int32_t order[CV], hist[256];
    int decided = 0, same = 1;
    const int steps = 400;
    for (int st = 0; st < steps; st++) {
        const double spread = st % 3 == 0 ? 0.5 : 4.0; /* flat rows too, where the boundary is reached */
        for (int i = 0; i < CV; i++) { /* odd steps: quarters (ties everywhere); even: continuous, as real logits */
            const double u = (urand() * 2 - 1) * spread;
            row[i] = (float)(st & 1 ? rint(u * 4) / 4 : u);
        }
        for (int i = 0; i < 40; i++) hist[i] = (int32_t)(urand() * CV);
        for (int i = 0; i < 8; i++) hist[40 + i] = order[i]; /* earlier leaders in the window: penalties bite */
        for (int i = 0; i < CV; i++) order[i] = i;
        g_row = row;
        qsort(order, CV, sizeof order[0], cmp_row);
        for (int i = 0; i < k; i++) vals[i] = row[order[i]];
        const int32_t x = moet_sampler_sample(a, row, hist, 48);
        int32_t y = moet_sampler_sample_candidates(b, order, vals, k, hist, 48);
        if (y >= 0) decided++;
        else y = moet_sampler_sample(b, row, hist, 48);
        same &= x == y;
    }
    fprintf(stderr, "candidates %-34s k %4d: decided %3d of %d, streams %s\n", what, k, decided, steps,
            same ? "equal" : "DIFFER");
    CHECK(same, "candidates (%s): the token stream differs from full-row sampling", what);
    if (expect_decide) CHECK(decided > steps / 4, "candidates (%s) decided only %d of %d", what, decided, steps);
    else CHECK(decided == 0, "candidates (%s) decided %d times where they cannot know", what, decided);
    moet_sampler_free(a);
    moet_sampler_free(b);
    return 0;
}

/* Large-vocabulary paths of the full-row sampler (no whole-vocabulary sort): a nucleus longer than the first sorted
 * prefix (flat rows: top-p 0.95 of 3000 ids), checked against a brute-force nucleus; min-p as a threshold; plain
 * temperature's frequencies against the softmax. */
static void check_large(void) {
    char err[256];
    static float row[CV];
    static int32_t order[CV];
    static double p[CV];
    for (int i = 0; i < CV; i++) row[i] = (float)((urand() * 2 - 1) * 0.2);
    row[17] = 3.0f; /* one clear leader */
    g_row = row;
    for (int i = 0; i < CV; i++) order[i] = i;
    qsort(order, CV, sizeof order[0], cmp_row);
    double mx = row[order[0]], z = 0;
    for (int i = 0; i < CV; i++) z += exp((double)row[i] - mx);
    for (int i = 0; i < CV; i++) p[i] = exp((double)row[i] - mx) / z;
    static int rank[CV], in_nucleus[CV];
    double c = 0;
    int nuc = 0;
    for (int i = 0; i < CV; i++) {
        rank[order[i]] = i;
        if (c < 0.95 - 1e-4) { in_nucleus[order[i]] = 1; nuc = i + 1; }
        c += p[order[i]];
    }
    moet_sampler_options o = moet_sampler_default_options();
    o.temperature = 1.0f; o.top_p = 0.95f; o.seed = 11;
    moet_sampler *s;
    REQUIRE(moet_sampler_create(&o, CV, &s, err, sizeof err) == 0, "%s", err);
    int outside = 0, deep = 0;
    for (int i = 0; i < 2000; i++) {
        const int32_t t = moet_sampler_sample(s, row, NULL, 0);
        outside += t < 0 || t >= CV || (!in_nucleus[t] && rank[t] > nuc + 2); /* +2: float vs double at the edge */
        deep += t >= 0 && t < CV && rank[t] >= 1024;
    }
    moet_sampler_free(s);
    fprintf(stderr, "top-p 0.95 over %d ids: nucleus %d ids, %d of 2000 draws past the first 1024 ranks, %d outside\n", CV,
            nuc, deep, outside);
    CHECK(outside == 0, "top-p drew %d tokens outside the nucleus", outside);
    CHECK(deep > 0, "top-p never drew past the first sorted prefix (the nucleus growth is untested)");
    /* min-p 0.05 with top-p off: only ids with p >= 0.05 p_max (the leader and part of the flat rest) */
    o = moet_sampler_default_options();
    o.temperature = 1.0f; o.min_p = 0.05f; o.seed = 12;
    REQUIRE(moet_sampler_create(&o, CV, &s, err, sizeof err) == 0, "%s", err);
    int bad = 0;
    for (int i = 0; i < 500; i++) {
        const int32_t t = moet_sampler_sample(s, row, NULL, 0);
        bad += t < 0 || t >= CV || p[t] < 0.05 * p[order[0]] * (1 - 1e-5);
    }
    moet_sampler_free(s);
    CHECK(bad == 0, "min-p drew %d tokens below its threshold", bad);
    /* plain temperature: the leader's frequency against its softmax probability */
    o = moet_sampler_default_options();
    o.temperature = 1.0f; o.seed = 13;
    REQUIRE(moet_sampler_create(&o, CV, &s, err, sizeof err) == 0, "%s", err);
    int lead = 0;
    const int N = 20000;
    for (int i = 0; i < N; i++) lead += moet_sampler_sample(s, row, NULL, 0) == 17;
    moet_sampler_free(s);
    const double f = (double)lead / N, sd = sqrt(p[17] * (1 - p[17]) / N);
    fprintf(stderr, "temperature 1 over %d ids: leader drawn %.4f, softmax %.4f\n", CV, f, p[17]);
    CHECK(fabs(f - p[17]) < 5 * sd, "temperature sampling: leader frequency %.4f, softmax says %.4f", f, p[17]);
}

int main(void) {
    const float logits[V] = {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f, -3.0f, 0.5f};
    moet_sampler_options o = moet_sampler_default_options();
    moet_sampler *s = mk(o);
    CHECK(moet_sampler_sample(s, logits, NULL, 0) == 1, "greedy is not the argmax");
    moet_sampler_free(s);

    /* Seeds: same seed, same stream; different seeds differ somewhere. */
    o.temperature = 1.0f;
    o.seed = 42;
    moet_sampler *a = mk(o), *b = mk(o);
    o.seed = 43;
    moet_sampler *c = mk(o);
    int same = 1, differ = 0;
    for (int i = 0; i < 200; i++) {
        int32_t x = moet_sampler_sample(a, logits, NULL, 0), y = moet_sampler_sample(b, logits, NULL, 0),
                z = moet_sampler_sample(c, logits, NULL, 0);
        same &= x == y;
        differ |= x != z;
    }
    CHECK(same, "same seed gave different streams");
    CHECK(differ, "different seeds gave the same 200 draws");
    moet_sampler_free(a); moet_sampler_free(b); moet_sampler_free(c);

    /* Temperature 1: frequencies follow softmax within 4 sigma over 20000 draws. */
    o.seed = 7;
    s = mk(o);
    int cnt[V] = {0};
    const int N = 20000;
    for (int i = 0; i < N; i++) cnt[moet_sampler_sample(s, logits, NULL, 0)]++;
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(logits[i]);
    for (int i = 0; i < V; i++) {
        double p = exp(logits[i]) / z, sd = sqrt(N * p * (1 - p));
        CHECK(fabs(cnt[i] - N * p) <= 4 * sd + 2, "token %d drawn %d times, expected %.0f", i, cnt[i], N * p);
    }
    moet_sampler_free(s);

    /* top-k = 2: only ids 1 and 5. */
    o.top_k = 2;
    s = mk(o);
    for (int i = 0; i < 2000; i++) {
        int32_t x = moet_sampler_sample(s, logits, NULL, 0);
        CHECK(x == 1 || x == 5, "top-k 2 drew %d", x);
    }
    moet_sampler_free(s);
    /* top-p: the smallest prefix reaching p. p(1)=.37 p(5)=.33 p(2)=.22: top_p 0.6 keeps {1, 5}. */
    o.top_k = 0;
    o.top_p = 0.6f;
    s = mk(o);
    int seen5 = 0;
    for (int i = 0; i < 2000; i++) {
        int32_t x = moet_sampler_sample(s, logits, NULL, 0);
        CHECK(x == 1 || x == 5, "top-p 0.6 drew %d", x);
        seen5 |= x == 5;
    }
    CHECK(seen5, "top-p 0.6 never drew the second token");
    moet_sampler_free(s);
    /* min-p 0.5: keeps tokens with p >= 0.5 * p_max: ids 1, 5, 2 (e^-0.5 = 0.61). */
    o.top_p = 1.0f;
    o.min_p = 0.5f;
    s = mk(o);
    for (int i = 0; i < 2000; i++) {
        int32_t x = moet_sampler_sample(s, logits, NULL, 0);
        CHECK(x == 1 || x == 5 || x == 2, "min-p 0.5 drew %d", x);
    }
    moet_sampler_free(s);

    /* Repetition penalty (HF): positive logits divided. 3.0/1.5 = 2.0 < 2.9: argmax moves from 1 to 5. */
    o = moet_sampler_default_options();
    o.repetition_penalty = 1.5f;
    s = mk(o);
    int32_t hist[3] = {1, 1, 4};
    CHECK(moet_sampler_sample(s, logits, hist, 3) == 5, "repetition penalty did not move the argmax");
    CHECK(moet_sampler_sample(s, logits, NULL, 0) == 1, "penalty state leaked into the next call");
    moet_sampler_free(s);
    /* Frequency penalty: 3.0 - 2 * 0.1 = 2.8 < 2.9. Presence 0.05 alone: 2.95 > 2.9 keeps 1. */
    o = moet_sampler_default_options();
    o.frequency_penalty = 0.1f;
    s = mk(o);
    CHECK(moet_sampler_sample(s, logits, hist, 3) == 5, "frequency penalty");
    moet_sampler_free(s);
    o.frequency_penalty = 0;
    o.presence_penalty = 0.05f;
    s = mk(o);
    CHECK(moet_sampler_sample(s, logits, hist, 3) == 1, "presence penalty");
    moet_sampler_free(s);

    /* Bad options are an error. */
    moet_sampler *bad;
    char err[256];
    o = moet_sampler_default_options();
    o.top_p = 0;
    CHECK(moet_sampler_create(&o, V, &bad, err, sizeof err) != 0, "top_p 0 accepted");
    o = moet_sampler_default_options();
    o.temperature = -1;
    CHECK(moet_sampler_create(&o, V, &bad, err, sizeof err) != 0, "negative temperature accepted");
    {
        moet_sampler_options d = moet_sampler_default_options();
        check_candidates(d, CK, 1, "greedy");
        d.repetition_penalty = 1.3f; d.presence_penalty = 0.5f; d.frequency_penalty = 0.25f; d.penalty_last_n = -1;
        check_candidates(d, CK, 1, "greedy, penalties");
        d = moet_sampler_default_options();
        d.temperature = 0.8f; d.top_k = 20; d.seed = 7;
        check_candidates(d, CK, 1, "T 0.8 top_k 20");
        d.top_p = 0.9f; d.min_p = 0.05f; d.repetition_penalty = 1.2f;
        check_candidates(d, CK, 1, "top_k 20 top_p min_p penalty");
        d.top_k = CK - 8; /* room for penalised candidates to fall below the bound */
        check_candidates(d, CK, 1, "top_k = k - 8, penalty");
        d.top_k = CK; /* the k-th candidate is the bound itself: never strictly above it */
        check_candidates(d, CK, 0, "top_k = k");
        d.top_k = 0; /* nucleus over the whole vocabulary: not decidable from 64 */
        check_candidates(d, CK, 0, "top_k off");
        check_candidates(d, CV, 1, "top_k off, k = vocab");
        d = moet_sampler_default_options();
        d.presence_penalty = -1.0f; /* can lift a token from outside the candidates */
        check_candidates(d, CK, 0, "greedy, negative presence");
        check_candidates(d, CV, 1, "greedy, negative presence, k = vocab");
    }
    check_large();
    TEST_END();
}
