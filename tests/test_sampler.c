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
    TEST_END();
}
