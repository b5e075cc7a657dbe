/*
 * test_ecache_proto.c — the expert cache's protocol (backend/expert_cache.h) alone, on made-up layers: what it
 * decides, step by step, where test_ecache.c checks only that a model's output survives it.
 *   - replay mode: a miss makes the step run again with the first missing layer's experts fetched; a step whose
 *     experts cannot all be held returns -1, and its uses then protect nothing (the smaller steps that redo it fit);
 *   - direct mode: a step never runs again; its misses are fetched after it, evicting only experts it did not use,
 *     and the least frequently used of those first (an expert used often outlives one used once more recently,
 *     which LRU would keep);
 *   - frequencies stay finite and keep their order across the weights' rescale (tens of thousands of steps);
 *   - layer_drop gives a layer's slots back.
 */
#include <math.h>
#include <string.h>

#include "backend/expert_cache.h"
#include "moet.h"
#include "test_util.h"

static int g_fetches;
static void count_fetch(void *ctx, const void *key, int32_t e, int64_t slot) {
    (void)ctx;
    (void)key;
    (void)e;
    (void)slot;
    g_fetches++;
}

int main(void) {
    static const char k0 = 0, k1 = 0; /* layer keys: any distinct addresses */
    moet_ecache c;

    /* replay mode, 4 slots, two layers of 8 experts */
    REQUIRE(moet_ecache_init(&c, 4) == MOET_OK, "init");
    moet_ecache_layer *l0 = moet_ecache_layer_of(&c, &k0, 8), *l1 = moet_ecache_layer_of(&c, &k1, 8);
    REQUIRE(l0 && l1, "layers");
    l0 = &c.layers[0];
    CHECK(!moet_ecache_use(&c, l0, 3) && !moet_ecache_use(&c, l1, 5), "nothing resident at first");
    g_fetches = 0;
    int64_t f = moet_ecache_resolve(&c, count_fetch, NULL);
    CHECK(f == 2 && g_fetches == 2 && c.replays == 1, "the first missing layer's expert and the later guess: %lld",
          (long long)f);
    CHECK(moet_ecache_use(&c, &c.layers[0], 3) && moet_ecache_use(&c, &c.layers[1], 5), "resident after the fetch");
    CHECK(moet_ecache_resolve(&c, count_fetch, NULL) == 0, "a step that missed nothing is done");
    /* one step using 5 experts of layer 0: 4 slots cannot hold them */
    for (int32_t e = 0; e < 5; e++) moet_ecache_use(&c, &c.layers[0], e);
    int64_t r = 0;
    for (int i = 0; i < 8 && r >= 0; i++) {
        r = moet_ecache_resolve(&c, count_fetch, NULL);
        if (r > 0)
            for (int32_t e = 0; e < 5; e++) moet_ecache_use(&c, &c.layers[0], e);
    }
    CHECK(r == -1, "a step of 5 experts on 4 slots ends with -1 (%lld)", (long long)r);
    /* the smaller step that redoes it: 2 of those experts, which must fit whatever the failed step left */
    moet_ecache_use(&c, &c.layers[0], 0);
    moet_ecache_use(&c, &c.layers[0], 4);
    r = moet_ecache_resolve(&c, count_fetch, NULL);
    CHECK(r >= 0, "after a failed step, a smaller one fits (%lld)", (long long)r);
    CHECK(moet_ecache_layer_drop(&c, &k0) > 0 && c.layers[0].key == NULL, "layer_drop frees the layer's slots");
    moet_ecache_free(&c);

    /* direct mode, 3 slots, one layer of 8 experts */
    REQUIRE(moet_ecache_init(&c, 3) == MOET_OK, "init");
    c.direct = 1;
    REQUIRE(moet_ecache_layer_of(&c, &k0, 8), "layer");
    /* experts 0 and 1 every step for 10 steps, then 2 once (a slot is free), then 0 alone, then 0 and 3: 3 needs a
     * slot, and of the experts that step did not use, 1 (many uses, the latest 4 steps ago) and 2 (one use, 3 steps
     * ago), LRU would evict 1; the decayed frequency evicts 2 */
    const int32_t n_steps = 14;
    for (int32_t s = 0; s < n_steps; s++) {
        if (s < 10) { moet_ecache_use(&c, &c.layers[0], 0); moet_ecache_use(&c, &c.layers[0], 1); }
        else if (s == 10) moet_ecache_use(&c, &c.layers[0], 2);
        else moet_ecache_use(&c, &c.layers[0], 0);
        if (s == n_steps - 1) moet_ecache_use(&c, &c.layers[0], 3);
        moet_ecache_settle(&c, count_fetch, NULL);
    }
    moet_ecache_layer *d = &c.layers[0];
    CHECK(c.replays == 0, "direct mode: no replays (%lld)", (long long)c.replays);
    CHECK(d->slot[0] >= 0 && d->slot[3] >= 0, "the step's experts are resident after it (0: %lld, 3: %lld)",
          (long long)d->slot[0], (long long)d->slot[3]);
    CHECK(d->slot[1] >= 0 && d->slot[2] < 0, "the expert used once left, not the one used often but longer ago "
          "(1: %lld, 2: %lld)", (long long)d->slot[1], (long long)d->slot[2]);
    CHECK(c.uses > 0 && c.misses == 4, "uses %lld, misses %lld (0, 1, 2, 3 once each)", (long long)c.uses,
          (long long)c.misses);

    /* admission: 3 slots held by experts 0, 1, 2 (10 steps each); then 0 and 3 every step. Victims 1 and 2 were used
     * more than 3 at first, so 3 is read where it waits instead of displacing one (declined); once its own uses
     * outweigh the victims' decayed ones it is fetched. Without admission it is fetched at once. */
    for (int admit = 1; admit >= 0; admit--) {
        moet_ecache a;
        REQUIRE(moet_ecache_init(&a, 3) == MOET_OK, "init");
        a.direct = 1;
        a.admit = admit;
        REQUIRE(moet_ecache_layer_of(&a, &k0, 8), "layer");
        for (int32_t s = 0; s < 10; s++) {
            for (int32_t e = 0; e < 3; e++) moet_ecache_use(&a, &a.layers[0], e);
            moet_ecache_settle(&a, NULL, NULL);
        }
        int32_t first = -1;
        for (int32_t s = 0; s < 30 && first < 0; s++) {
            moet_ecache_use(&a, &a.layers[0], 0);
            moet_ecache_use(&a, &a.layers[0], 3);
            moet_ecache_settle(&a, NULL, NULL);
            if (a.layers[0].slot[3] >= 0) first = s;
        }
        if (admit)
            CHECK(first >= 3 && first < 20 && a.declined == first && a.evicted == 1,
                  "admission: expert 3 declined %lld times, fetched at its step %d (evicted %lld)",
                  (long long)a.declined, first, (long long)a.evicted);
        else
            CHECK(first == 0 && a.declined == 0, "no admission: expert 3 fetched at its first step (%d)", first);
        moet_ecache_free(&a);
    }

    /* 40000 steps of expert 0 (the weights pass 1e100 near step 22900 and are rescaled): still finite, still first */
    for (int s = 0; s < 40000; s++) {
        moet_ecache_use(&c, &c.layers[0], 0);
        if (s % 1000 == 0) moet_ecache_use(&c, &c.layers[0], 4);
        moet_ecache_settle(&c, NULL, NULL);
    }
    d = &c.layers[0];
    int finite = 1;
    for (int32_t e = 0; e < 8; e++) finite = finite && isfinite(d->freq[e]);
    CHECK(finite && c.gain >= 1 && c.gain < 1e100, "frequencies finite after the rescale (gain %g)", c.gain);
    CHECK(d->freq[0] > d->freq[4] && d->slot[0] >= 0, "the order survives the rescale (%g vs %g)", d->freq[0], d->freq[4]);
    moet_ecache_free(&c);
    TEST_END();
}
