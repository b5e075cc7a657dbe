/*
 * test_kv.c — the paged KV cache (moet_kv, backend/kv_page.h) through the public API, on the model's default device:
 *   - a session whose blocks come from a shared pool, one token a block and interleaved with another session's
 *     (so its table is anything but the identity), gives the same logits bit for bit as a session with a pool of
 *     its own, over a prefill, token-by-token decode, a truncation and a re-decode;
 *   - the pool's accounting: blocks are taken as sequences grow and given back by truncate and free; an eval that
 *     needs more than is free fails with MOET_ENOMEM and changes nothing (the same eval succeeds once blocks are
 *     back); the pool outlives moet_kv_free while a session holds it;
 *   - the prefix cache: a session over a prefix another sealed shares its blocks (holds only its own new ones) and
 *     gets the logits of computing it all; a session truncated into a shared block and writing copies it first
 *     (the other's later logits are unchanged); blocks stay cached after their sessions go and are found again,
 *     and are evicted when the pool needs them;
 *   - bad options are errors.
 */
#include <math.h>
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
    int32_t V;
    moet_model *m = test_model_open(argc, argv, &V);
    char err[512];

    /* bad options */
    moet_kv *kv;
    moet_kv_options ko = moet_kv_default_options();
    ko.block_tokens = 24;
    CHECK(moet_kv_create(m, &ko, &kv, err, sizeof err) == MOET_EINVAL, "a block of 24 tokens was accepted");
    ko.block_tokens = 1 << 20;
    CHECK(moet_kv_create(m, &ko, &kv, err, sizeof err) == MOET_EINVAL, "a block of 2^20 tokens was accepted");
    ko.block_tokens = 32;
    ko.type = 7;
    CHECK(moet_kv_create(m, &ko, &kv, err, sizeof err) == MOET_EINVAL, "a KV type of 7 was accepted");
    ko.type = MOET_KV_AUTO;
    { /* auto: f32 on the CPU whatever CUDA's auto is told (runtime/kv.c), f16 on CUDA unless told f32 */
        moet_model_info mi;
        moet_model_info_get(m, &mi);
        const int cuda = !strcmp(mi.backend, "cuda");
        char *ea = getenv("MOET_KV_AUTO_CUDA") ? strdup(getenv("MOET_KV_AUTO_CUDA")) : NULL;
        unsetenv("MOET_KV_AUTO_CUDA");
        REQUIRE(moet_kv_create(m, &ko, &kv, err, sizeof err) == 0, "%s", err);
        CHECK(moet_kv_type(kv) == (cuda ? MOET_KV_F16 : MOET_KV_F32), "auto on %s: type %d", mi.backend,
              moet_kv_type(kv));
        moet_kv_free(kv);
        setenv("MOET_KV_AUTO_CUDA", "f32", 1);
        REQUIRE(moet_kv_create(m, &ko, &kv, err, sizeof err) == 0, "%s", err);
        CHECK(moet_kv_type(kv) == MOET_KV_F32, "auto with MOET_KV_AUTO_CUDA=f32 on %s: type %d", mi.backend,
              moet_kv_type(kv));
        moet_kv_free(kv);
        unsetenv("MOET_KV_AUTO_CUDA");
        if (ea) setenv("MOET_KV_AUTO_CUDA", ea, 1);
        free(ea);
    }

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
    moet_session_free(own);
    moet_session_free(paged); /* the pool's last reference: ASan sees it all freed */

    /* the prefix cache: blocks of 8 shared between sessions by the hash of their whole prefix; with f32 pools,
     * then f16 (a block copied on write is 2 bytes an element there) */
    for (int kt = 0; kt < 2; kt++) {
        moet_kv *pc;
        moet_kv_options pco = moet_kv_default_options();
        pco.n_tokens = 128;
        pco.block_tokens = 8;
        pco.prefix_cache = 1;
        pco.type = kt ? MOET_KV_F16 : MOET_KV_F32;
        so.kv_type = pco.type; /* R's own pool the same */
        REQUIRE(moet_kv_create(m, &pco, &pc, err, sizeof err) == 0, "%s", err);
        CHECK(moet_kv_type(pc) == pco.type, "pool type %d, asked %d", moet_kv_type(pc), pco.type);
        fprintf(stderr, "prefix cache, %s pool:\n", kt ? "f16" : "f32");
        moet_session_options sq = so;
        sq.kv = pc;
        sq.n_batch = 64;
        sq.n_ctx = 128;
        moet_session *A, *Bs, *R, *C;
        REQUIRE(moet_session_create(m, &sq, &A, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_create(m, &sq, &Bs, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_create(m, &so, &R, err, sizeof err) == 0, "%s", err); /* a pool of its own: computes all */
        CHECK(moet_session_kv_type(A) == pco.type && moet_session_kv_type(R) == pco.type, "session KV types %d, %d",
              moet_session_kv_type(A), moet_session_kv_type(R));
        int32_t t[48];
        for (int i = 0; i < 48; i++) t[i] = (int32_t)((i * 733 + 5) % V);
        REQUIRE(eval_last(A, t, 40, la, V) == 0, "A");        /* 5 full blocks, sealed */
        REQUIRE(eval_last(Bs, t, 43, lb, V) == 0, "B");       /* takes A's 5 blocks, computes 3 tokens */
        REQUIRE(eval_last(R, t, 43, lo, V) == 0, "R");
        double md = 0, mx = 0;
        for (int32_t v = 0; v < V; v++) { md = fmax(md, fabs((double)lb[v] - lo[v])); mx = fmax(mx, fabs((double)lo[v])); }
        const int held = 128 - moet_kv_free_tokens(pc);
        fprintf(stderr, "prefix cache: a 43-token eval over a sealed 40-token prefix holds %d new tokens of blocks; "
                "logits vs computing it all: max relative difference %.3g\n", held - 40, md / mx);
        CHECK(held == 48, "A and B hold %d tokens of blocks: B did not share A's 5 blocks", held);
        CHECK(md / mx <= 1e-5, "logits over a shared prefix differ by %.3g", md / mx);
        /* copy on write: B truncated into a shared block and writing other tokens must leave A's KV alone */
        REQUIRE(moet_session_truncate(Bs, 20, err, sizeof err) == 0, "%s", err);
        int32_t u[6] = {7, 8, 9, 10, 11, 12};
        REQUIRE(eval_last(Bs, u, 6, lb, V) == 0, "B rewrite");
        REQUIRE(moet_session_truncate(R, 40, err, sizeof err) == 0, "%s", err);
        for (int k = 0; k < 4; k++) { /* A and R decode the same tokens on the same 40-token prefix */
            REQUIRE(eval_last(A, &t[40 + k], 1, la, V) == 0, "A decode");
            REQUIRE(eval_last(R, &t[40 + k], 1, lo, V) == 0, "R decode");
            for (int32_t v = 0; v < V; v++) { md = fmax(md, fabs((double)la[v] - lo[v])); mx = fmax(mx, fabs((double)lo[v])); }
        }
        CHECK(md / mx <= 1e-5, "A's logits after B rewrote a shared block: %.3g off", md / mx);
        /* cached after their sessions went: a new session finds A's prefix (blocks 0-4) */
        moet_session_free(A);
        moet_session_free(Bs);
        CHECK(moet_kv_free_tokens(pc) == 128, "all blocks reclaimable once the sessions went: %d", moet_kv_free_tokens(pc));
        REQUIRE(moet_session_create(m, &sq, &C, err, sizeof err) == 0, "%s", err);
        REQUIRE(eval_last(C, t, 41, la, V) == 0, "C");
        REQUIRE(moet_session_truncate(R, 0, err, sizeof err) == 0, "%s", err);
        REQUIRE(eval_last(R, t, 41, lo, V) == 0, "R");
        md = 0; mx = 0;
        for (int32_t v = 0; v < V; v++) { md = fmax(md, fabs((double)la[v] - lo[v])); mx = fmax(mx, fabs((double)lo[v])); }
        CHECK(md / mx <= 1e-5, "logits over a cached prefix of freed sessions: %.3g off", md / mx);
        /* eviction: a pool filled by new tokens takes the cached blocks back */
        moet_session_free(C);
        moet_session *D;
        REQUIRE(moet_session_create(m, &sq, &D, err, sizeof err) == 0, "%s", err);
        int32_t w[64];
        for (int i = 0; i < 64; i++) w[i] = (int32_t)((i * 97 + 3) % V);
        REQUIRE(eval_last(D, w, 64, la, V) == 0, "D (evicting)");
        REQUIRE(eval_last(D, w, 63, la, V) == 0, "D (evicting more)");
        CHECK(moet_kv_free_tokens(pc) == 0, "free %d after D took the whole pool", moet_kv_free_tokens(pc));
        moet_session_free(D);
        moet_session_free(R);
        moet_kv_free(pc);
    }
    free(la);
    free(lb);
    free(lo);
    moet_model_free(m);
    TEST_END();
}
