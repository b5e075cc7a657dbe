/*
 * expert_cache.h — which routed experts are resident, for backends that hold fewer than all of them (DESIGN.md §5;
 * the protocol in docs/design.md, "How the expert cache fits").
 *
 * Why one host-side bookkeeper: the decision of what to fetch and what to evict is the same whatever moves the bytes
 * (the CPU backend moves none: it carries the protocol so the bit-identity of a replayed step is tested in CI; a GPU
 * backend copies an expert into the slot this hands out). A step's MoE ops ask for every expert their routing picked
 * (moet_ecache_use); a non-resident one is a miss. Only the first layer of the step that missed is sure to need its
 * misses: later layers were routed on a residual stream the missing experts never shaped, so their misses (and their
 * hits) are guesses. After the step, moet_ecache_resolve makes the first missing layer's experts resident, evicting
 * the least recently used experts that no layer up to it used in this step; then it fetches the later layers'
 * misses too where that evicts only experts of earlier steps, stamped so that a needed fetch may still evict them
 * (moe-mini-a, tests/test_ecache.c: 120 slots, batched, steps run again 109 -> 32 for 275 -> 344 experts fetched;
 * 40 slots, 252 -> 184 for 646 -> 1577: a replay costs a whole step, a fetch one expert's bytes). The caller replays
 * the step; a step whose experts were all resident is the resident forward, bit for bit.
 * An expert is one slot: its gate, up and down matrices (and the delta's residuals with them).
 */
#ifndef MOET_BACKEND_EXPERT_CACHE_H
#define MOET_BACKEND_EXPERT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const void *key;        /* the layer's expert array (moet_moe_args.gate) */
    int32_t n;              /* experts */
    int64_t *slot;          /* [n] the slot holding expert e, or -1 */
    uint64_t *stamp;        /* [n] the step that last used it */
    uint8_t *miss;          /* [n] missing in this step */
    double *freq;           /* [n] uses, each weighted MOET_ECACHE_DECAY^-step (moet_ecache.gain): decayed frequency */
} moet_ecache_layer;

typedef struct {
    int64_t n_slots;        /* 0: every expert resident, nothing tracked */
    int64_t n_free;
    int64_t *free_slots;    /* stack of free slot ids */
    moet_ecache_layer *layers;
    size_t n_layers, cap_layers;
    uint64_t step;          /* the current step (advanced by a resolve that finds no miss) */
    moet_ecache_layer *miss_layer; /* the first layer of this step that missed, or NULL */
    int64_t fetched, evicted, replays; /* experts fetched and evicted, steps run again */
    int64_t guessed;        /* of the fetched: later layers' misses, fetched on a guess */
    int64_t prefetched;     /* of the fetched: moet_ecache_hint's */
    /* Direct mode (set after init): a backend that can compute a missing expert where it waits (a GPU reading its
     * pinned host image over the bus) completes every step; misses are fetched after it (moet_ecache_settle) for
     * the steps to come, and nothing is run again. */
    int direct;
    double gain;            /* MOET_ECACHE_DECAY^-(steps since the last rescale): the weight of a use now */
    int lru;                /* direct mode's victims by recency alone (MOET_ECACHE_LRU=1 at init: the A/B) */
    struct moet_ecache_victim *victims; /* [n_slots] moet_ecache_settle's victims, made once (no allocation a step) */
    struct moet_ecache_victim *cands;   /* [n_cands_cap] its candidates (every tracked expert: grown by layer_of) */
    size_t n_cands_cap;
    int admit;              /* direct mode with LFU victims: fetch a miss only over a less used victim
                               (MOET_ECACHE_ADMIT=0 at init: every miss, the A/B) */
    int64_t declined;       /* misses settle did not fetch because every victim left was used more */
    int64_t uses, misses;   /* moet_ecache_use calls (a layer's expert a pass), and those not resident */
} moet_ecache;

/* The decay of an expert's use frequency a step (direct mode's victims: the least frequently used of the experts the
 * step did not use, by uses decayed 1% a step; least recently used among equals). Measured on moe-mini-a and
 * moe-mini-c, dev.txt a token a step, 25/50/75% of the experts in slots: misses -11..-28% against plain LRU (0.9:
 * about half that gain, 0.995 the same as 0.99); in replay mode LFU measured worse (more replays at 50%), so it
 * keeps LRU, which its stamps' protections are built on. */
#define MOET_ECACHE_DECAY 0.99

/* The counts backends report (backend.h expert_cache_stats): fetched, evicted, steps run again, uses, misses. */
#define MOET_ECACHE_NCOUNTS 5
void moet_ecache_counts(const moet_ecache *c, int64_t out[MOET_ECACHE_NCOUNTS]);

/* n_slots > 0: at most that many experts resident (none at first); 0: all. 0, or MOET_ENOMEM / MOET_EINVAL. */
int moet_ecache_init(moet_ecache *c, int64_t n_slots);
void moet_ecache_free(moet_ecache *c);
/* The layer of expert array key (E experts), tracked from its first use; NULL when out of memory. */
moet_ecache_layer *moet_ecache_layer_of(moet_ecache *c, const void *key, int32_t n_experts);
/* Whether expert e of layer l is resident (1: its slot is marked used by this step) or not (0: a miss, recorded when
 * l is the step's first missing layer; in direct mode every miss is a use, recorded, and the step stands). */
int moet_ecache_use(moet_ecache *c, moet_ecache_layer *l, int32_t e);
/* A guess that expert e of layer l will be used soon (a prefetch): fetched now where a slot is free or an expert of an
 * earlier step can go, stamped so that a needed fetch may still evict it; 1 when it was fetched. */
int moet_ecache_hint(moet_ecache *c, moet_ecache_layer *l, int32_t e,
                     void (*fetch)(void *ctx, const void *key, int32_t e, int64_t slot), void *ctx);
/* After a step: 0 when it missed nothing (the next step begins); else makes the first missing layer's experts
 * resident and returns how many (the step must run again), calling fetch(ctx, key, e, slot) for each after the
 * evictions it needed; -1 when the slots cannot hold them beside the experts this step already used. */
int64_t moet_ecache_resolve(moet_ecache *c, void (*fetch)(void *ctx, const void *key, int32_t e, int64_t slot), void *ctx);
/* Direct mode, after a step: fetches the step's misses (every layer's: they were all real uses) where a slot is
 * free or an expert this step did not use can go; the others stay where they wait. Never asks for a replay; the
 * number fetched. */
int64_t moet_ecache_settle(moet_ecache *c, void (*fetch)(void *ctx, const void *key, int32_t e, int64_t slot), void *ctx);
/* The layer keyed on key goes away (its weights are freed): its slots go back to the free stack and its key is
 * cleared, so a later layer at the same address starts afresh; the number of slots freed. */
int64_t moet_ecache_layer_drop(moet_ecache *c, const void *key);

#ifdef __cplusplus
}
#endif
#endif
