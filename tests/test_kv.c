/*
 * test_kv.c — the paged KV cache (moet_kv, backend/kv_page.h) through the public API, on the model's default device:
 *   - a session whose blocks come from a shared pool, one token a block and interleaved with another session's
 *     (so its table is anything but the identity), gives the same logits bit for bit as a session with a pool of
 *     its own, over a prefill, token-by-token decode, a truncation and a re-decode;
 *   - the pool's accounting: blocks are taken as sequences grow and given back by truncate and free; an eval that
 *     needs more than is free fails with MOET_ENOMEM and changes nothing (the same eval succeeds once blocks are
 *     back); the pool outlives moet_kv_free while a session holds it;
 *   - bad options are errors.
 */
#include <stdlib.h>
#include <string.h>

#include "moet.h"
#include "test_util.h"

#define NP 24

static int eval_last(moet_session *s, const int32_t *t, int32_t n, float *out, int32_t V) {
    char err[256];
    if (moet_session_eval(s, t, n, MOET_LOGITS_LAST, err, sizeof err)) {
        fprintf(stderr, "eval: %s\n", err);
        return -1;
    }
    memcpy(out, moet_session_logits(s, NULL), sizeof(float) * (size_t)V);
    return 0;
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 2, "usage: test_kv MODEL_DIR [device]");
    char err[512];
    moet_model_options mo = moet_model_default_options();
    mo.device = argc > 2 ? argv[2] : NULL;
    moet_model *m;
    REQUIRE(moet_model_load(argv[1], &mo, &m, err, sizeof err) == 0, "%s", err);
    moet_model_info info;
    moet_model_info_get(m, &info);
    const int32_t V = info.vocab_size;

    /* bad options */
    moet_kv *kv;
    moet_kv_options ko = moet_kv_default_options();
    ko.block_tokens = 24;
    CHECK(moet_kv_create(m, &ko, &kv, err, sizeof err) == MOET_EINVAL, "a block of 24 tokens was accepted");
    ko.block_tokens = 1 << 20;
    CHECK(moet_kv_create(m, &ko, &kv, err, sizeof err) == MOET_EINVAL, "a block of 2^20 tokens was accepted");

    /* a pool of 64 one-token blocks shared by two sessions */
    ko.block_tokens = 1;
    ko.n_tokens = 64;
    REQUIRE(moet_kv_create(m, &ko, &kv, err, sizeof err) == 0, "%s", err);
    CHECK(moet_kv_free_tokens(kv) == 64 && moet_kv_block_tokens(kv) == 1, "pool of %d free tokens, blocks of %d",
          moet_kv_free_tokens(kv), moet_kv_block_tokens(kv));
    moet_session_options so = moet_session_default_options();
    so.n_ctx = 64;
    so.n_batch = 8; /* the prefill in chunks, each taking its blocks */
    moet_session *own, *paged, *other;
    REQUIRE(moet_session_create(m, &so, &own, err, sizeof err) == 0, "%s", err);
    moet_session_options sp = so;
    sp.kv = kv;
    REQUIRE(moet_session_create(m, &sp, &paged, err, sizeof err) == 0, "%s", err);
    REQUIRE(moet_session_create(m, &sp, &other, err, sizeof err) == 0, "%s", err);
    moet_kv_free(kv); /* the sessions keep it alive */

    int32_t prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)((i * 389 + 11) % V);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V),
          *lo = malloc(sizeof(float) * (size_t)V);
    int same = 1, steps = 0;
    /* a 12-token prefill (chunks of 8 and 4), then 4 tokens at a time, other taking blocks in between: paged's
     * blocks end up scattered over the pool */
    REQUIRE(eval_last(own, prompt, 12, la, V) == 0, "own prefill");
    REQUIRE(eval_last(paged, prompt, 12, lb, V) == 0, "paged prefill");
    same &= !memcmp(la, lb, sizeof(float) * (size_t)V);
    REQUIRE(eval_last(other, prompt + 5, 3, lo, V) == 0, "other prefill");
    for (int i = 12; i < NP; i += 4, steps++) {
        REQUIRE(eval_last(own, prompt + i, 4, la, V) == 0, "own eval");
        REQUIRE(eval_last(paged, prompt + i, 4, lb, V) == 0, "paged eval");
        REQUIRE(eval_last(other, prompt + NP - 1 - i, 1, lo, V) == 0, "other eval");
        same &= !memcmp(la, lb, sizeof(float) * (size_t)V);
    }
    for (int k = 0; k < 9; k++, steps++) { /* greedy decode */
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++) best = la[v] > la[best] ? v : best;
        REQUIRE(eval_last(own, &best, 1, la, V) == 0, "own decode");
        REQUIRE(eval_last(paged, &best, 1, lb, V) == 0, "paged decode");
        REQUIRE(eval_last(other, &best, 1, lo, V) == 0, "other decode");
        same &= !memcmp(la, lb, sizeof(float) * (size_t)V);
    }
    const int32_t pos = moet_session_pos(paged), po = moet_session_pos(other);
    CHECK(pos == NP + 9 && po == 3 + 3 + 9, "sessions at %d and %d", pos, po);
    CHECK(moet_kv_free_tokens(kv) == 64 - pos - po, "free %d after %d + %d tokens", moet_kv_free_tokens(kv), pos, po);
    /* truncate gives blocks back; other takes some of them; re-decoding from there matches the own-pool session */
    REQUIRE(moet_session_truncate(own, 10, err, sizeof err) == 0, "%s", err);
    REQUIRE(moet_session_truncate(paged, 10, err, sizeof err) == 0, "%s", err);
    CHECK(moet_kv_free_tokens(kv) == 64 - 10 - po, "free %d after truncating to 10", moet_kv_free_tokens(kv));
    REQUIRE(eval_last(other, prompt, 4, lo, V) == 0, "other eval");
    REQUIRE(eval_last(own, prompt + 3, 5, la, V) == 0, "own re-eval");
    REQUIRE(eval_last(paged, prompt + 3, 5, lb, V) == 0, "paged re-eval");
    same &= !memcmp(la, lb, sizeof(float) * (size_t)V);
    fprintf(stderr, "paged KV (one-token blocks, interleaved with another session) vs a pool of its own: %d evals, "
            "logits %s\n", steps + 2, same ? "bit-identical" : "DIFFER");
    CHECK(same, "a session on a shared paged pool computes other logits than one with its own");

    /* exhaustion: nothing changes, and the same eval works once blocks are free */
    const int32_t free0 = moet_kv_free_tokens(kv), p0 = moet_session_pos(paged);
    int32_t *many = malloc(sizeof(int32_t) * (size_t)(free0 + 1));
    for (int32_t i = 0; i <= free0; i++) many[i] = prompt[i % NP];
    int rc = moet_session_eval(paged, many, free0 + 1, MOET_LOGITS_LAST, err, sizeof err);
    fprintf(stderr, "eval of %d tokens with %d free: rc %d (%s)\n", free0 + 1, free0, rc, err);
    CHECK(rc == MOET_ENOMEM && strstr(err, "KV pool exhausted"), "an eval past the pool: rc %d (%s)", rc, err);
    CHECK(moet_session_pos(paged) == p0 && moet_kv_free_tokens(kv) == free0, "a failed eval changed the session");
    moet_session_free(other); /* gives its blocks back */
    CHECK(moet_kv_free_tokens(kv) >= free0 + 1, "free %d after the other session went", moet_kv_free_tokens(kv));
    if (p0 + free0 + 1 <= so.n_ctx) {
        rc = moet_session_eval(paged, many, free0 + 1, MOET_LOGITS_LAST, err, sizeof err);
        CHECK(rc == 0, "the eval once blocks were back: %s", err);
    }
    free(many);
    free(la);
    free(lb);
    free(lo);
    moet_session_free(own);
    moet_session_free(paged); /* the pool's last reference: ASan sees it all freed */
    moet_model_free(m);
    TEST_END();
}
