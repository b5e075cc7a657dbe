/* expert_cache.c — see expert_cache.h. */
#include "backend/expert_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moet.h"

/* A resident expert that may make room, with its order key: pick_victim's choice is the least key. */
struct moet_ecache_victim {
    double f;
    uint64_t stamp;
    uint32_t layer;
    int32_t e;
};

int moet_ecache_init(moet_ecache *c, int64_t n_slots) {
    memset(c, 0, sizeof *c);
    if (n_slots < 0) return MOET_EINVAL;
    c->n_slots = n_slots;
    c->gain = 1;
    const char *lru = getenv("MOET_ECACHE_LRU"), *admit = getenv("MOET_ECACHE_ADMIT");
    c->lru = lru && lru[0] == '1';
    c->admit = !(admit && admit[0] == '0');
    if (!n_slots) return MOET_OK;
    if (!(c->free_slots = malloc((size_t)n_slots * sizeof(int64_t))) ||
        !(c->victims = malloc((size_t)n_slots * sizeof(*c->victims)))) {
        free(c->free_slots);
        c->free_slots = NULL;
        return MOET_ENOMEM;
    }
    for (int64_t i = 0; i < n_slots; i++) c->free_slots[i] = n_slots - 1 - i; /* slot 0 handed out first */
    c->n_free = n_slots;
    return MOET_OK;
}

void moet_ecache_free(moet_ecache *c) {
    for (size_t i = 0; i < c->n_layers; i++) {
        free(c->layers[i].slot);
        free(c->layers[i].stamp);
        free(c->layers[i].miss);
        free(c->layers[i].freq);
    }
    free(c->layers);
    free(c->free_slots);
    free(c->victims);
    free(c->cands);
    memset(c, 0, sizeof *c);
}

moet_ecache_layer *moet_ecache_layer_of(moet_ecache *c, const void *key, int32_t n_experts) {
    for (size_t i = 0; i < c->n_layers; i++)
        if (c->layers[i].key == key && c->layers[i].n == n_experts) return &c->layers[i];
    if (c->n_layers == c->cap_layers) {
        const size_t nc = c->cap_layers ? 2 * c->cap_layers : 16;
        moet_ecache_layer *nl = realloc(c->layers, nc * sizeof *nl);
        if (!nl) return NULL;
        /* the miss layer is a pointer into the array: keep it pointing at the same layer */
        if (c->miss_layer) c->miss_layer = nl + (c->miss_layer - c->layers);
        c->layers = nl;
        c->cap_layers = nc;
    }
    moet_ecache_layer l = {.key = key, .n = n_experts};
    l.slot = malloc((size_t)n_experts * sizeof(int64_t));
    l.stamp = calloc((size_t)n_experts, sizeof(uint64_t));
    l.miss = calloc((size_t)n_experts, 1);
    l.freq = calloc((size_t)n_experts, sizeof(double));
    if (!l.slot || !l.stamp || !l.miss || !l.freq) { free(l.slot); free(l.stamp); free(l.miss); free(l.freq); return NULL; }
    for (int32_t e = 0; e < n_experts; e++) l.slot[e] = -1;
    /* settle's candidates: at most every expert of every layer (made here, not in a step) */
    struct moet_ecache_victim *nc = realloc(c->cands, (c->n_cands_cap + (size_t)n_experts) * sizeof *nc);
    if (!nc) { free(l.slot); free(l.stamp); free(l.miss); free(l.freq); return NULL; }
    c->cands = nc;
    c->n_cands_cap += (size_t)n_experts;
    c->layers[c->n_layers] = l;
    return &c->layers[c->n_layers++];
}

void moet_ecache_counts(const moet_ecache *c, int64_t out[MOET_ECACHE_NCOUNTS]) {
    out[0] = c->fetched;
    out[1] = c->evicted;
    out[2] = c->replays;
    out[3] = c->uses;
    out[4] = c->misses;
}

/* The next step: uses weigh 1/DECAY more than the last step's (so every frequency decays alike without touching
 * them); rescaled before the weights leave double's range. */
static void next_step(moet_ecache *c) {
    c->step++;
    c->gain /= MOET_ECACHE_DECAY;
    if (c->gain < 1e100) return;
    for (size_t i = 0; i < c->n_layers; i++)
        for (int32_t e = 0; e < c->layers[i].n; e++) c->layers[i].freq[e] /= c->gain;
    c->gain = 1;
}

int moet_ecache_use(moet_ecache *c, moet_ecache_layer *l, int32_t e) {
    c->uses++;
    c->misses += l->slot[e] < 0;
    if (c->direct) { /* the step completes whatever is missing: every use is real */
        if (l->stamp[e] != c->step + 1 && !l->miss[e]) l->freq[e] += c->gain; /* once a step */
        if (l->slot[e] >= 0) {
            l->stamp[e] = c->step + 1;
            return 1;
        }
        l->miss[e] = 1;
        c->miss_layer = l;
        return 0;
    }
    if (l->slot[e] >= 0) {
        /* stamps are step + 1 (0: never used); a use after this pass's first miss, in a later layer, was routed on a
         * stream that lacked the missing experts: it counts as the previous step's, so it protects nothing now */
        const uint64_t st = c->miss_layer && c->miss_layer != l ? c->step : c->step + 1;
        if (l->stamp[e] < st) l->stamp[e] = st;
        return 1;
    }
    if (!c->miss_layer) c->miss_layer = l;
    l->miss[e] = 1; /* beyond the first missing layer: a guess (routed on a stream that lacked the missing experts) */
    return 0;
}

/* Of the resident experts stamped below `below`: the least recently used (direct mode: the least frequently, by
 * decayed uses, then the least recently); 0 when there is none. */
static int pick_victim(moet_ecache *c, uint64_t below, moet_ecache_layer **vl, int32_t *ve) {
    uint64_t best = UINT64_MAX;
    double bf = INFINITY;
    for (size_t i = 0; i < c->n_layers; i++) {
        moet_ecache_layer *l = &c->layers[i];
        for (int32_t e = 0; e < l->n; e++) {
            if (l->slot[e] < 0 || l->stamp[e] >= below) continue;
            const double f = c->direct && !c->lru ? l->freq[e] : 0;
            if (f < bf || (f == bf && l->stamp[e] < best)) {
                bf = f;
                best = l->stamp[e];
                *vl = l;
                *ve = e;
            }
        }
    }
    return best != UINT64_MAX;
}

/* Makes expert e of layer l resident with the given stamp, evicting if need be an expert stamped below `below`; 0,
 * or -1 when no slot is free and no expert may go. */
static int fetch_one(moet_ecache *c, moet_ecache_layer *l, int32_t e, uint64_t stamp, uint64_t below,
                     void (*fetch)(void *ctx, const void *key, int32_t e, int64_t slot), void *ctx) {
    if (!c->n_free) {
        moet_ecache_layer *vl = NULL;
        int32_t ve = 0;
        if (!pick_victim(c, below, &vl, &ve)) return -1;
        c->free_slots[c->n_free++] = vl->slot[ve];
        vl->slot[ve] = -1;
        c->evicted++;
    }
    l->slot[e] = c->free_slots[--c->n_free];
    l->stamp[e] = stamp;
    if (fetch) fetch(ctx, l->key, e, l->slot[e]);
    c->fetched++;
    return 0;
}

int moet_ecache_hint(moet_ecache *c, moet_ecache_layer *l, int32_t e,
                     void (*fetch)(void *ctx, const void *key, int32_t e, int64_t slot), void *ctx) {
    /* only where it evicts an expert no step since the one before the last used: a prefetch that displaced the
     * recent working set measured worse than none (moe-mini-a, 40 slots: 184 -> 191 steps run again) */
    if (l->slot[e] >= 0 || fetch_one(c, l, e, c->step, c->step, fetch, ctx)) return 0;
    c->prefetched++;
    return 1;
}

int64_t moet_ecache_resolve(moet_ecache *c, void (*fetch)(void *ctx, const void *key, int32_t e, int64_t slot), void *ctx) {
    moet_ecache_layer *first = c->miss_layer;
    if (!first) {
        next_step(c);
        return 0;
    }
    int64_t n = 0, rc = 0;
    /* the first missing layer's experts: needed, stamped as used by this step (no later fetch of it evicts them) */
    for (int32_t e = 0; e < first->n && !rc; e++)
        if (first->miss[e]) {
            if (fetch_one(c, first, e, c->step + 1, c->step + 1, fetch, ctx)) rc = -1; /* this step's experts fill the slots */
            else n++;
        }
    /* the later layers' misses, a guess: fetched where a slot is free or an expert of an earlier step can go, and
     * stamped as of the previous step, so a needed fetch of this step may still evict them */
    for (size_t i = 0; i < c->n_layers && !rc; i++) {
        moet_ecache_layer *l = &c->layers[i];
        if (l == first) continue;
        for (int32_t e = 0; e < l->n; e++)
            if (l->miss[e] && l->slot[e] < 0 && fetch_one(c, l, e, c->step, c->step + 1, fetch, ctx) == 0) { n++; c->guessed++; }
    }
    for (size_t i = 0; i < c->n_layers; i++) memset(c->layers[i].miss, 0, (size_t)c->layers[i].n);
    c->miss_layer = NULL;
    if (rc) {
        next_step(c); /* the failed step is given up: its uses protect nothing from the smaller steps that redo it */
        return -1;
    }
    c->replays++;
    return n;
}

static int victim_cmp(const void *pa, const void *pb) {
    const struct moet_ecache_victim *a = pa, *b = pb;
    if (a->f != b->f) return a->f < b->f ? -1 : 1;
    if (a->stamp != b->stamp) return a->stamp < b->stamp ? -1 : 1;
    if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
    return (a->e > b->e) - (a->e < b->e);
}

/* candidates: the most frequently used first (then layer, expert: a fixed order) */
static int cand_cmp(const void *pa, const void *pb) {
    const struct moet_ecache_victim *a = pa, *b = pb;
    if (a->f != b->f) return a->f > b->f ? -1 : 1;
    if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
    return (a->e > b->e) - (a->e < b->e);
}

int64_t moet_ecache_settle(moet_ecache *c, void (*fetch)(void *ctx, const void *key, int32_t e, int64_t slot), void *ctx) {
    int64_t n = 0;
    if (c->miss_layer) {
        /* the experts this step did not use, in pick_victim's order, sorted once: fetches stamp this step, so the
         * order of the rest never changes (a scan per eviction cost O(experts) each, ~1 ms a step at 235b) */
        size_t nv = 0, iv = 0, nc = 0;
        for (size_t i = 0; i < c->n_layers; i++) {
            const moet_ecache_layer *l = &c->layers[i];
            for (int32_t e = 0; e < l->n; e++) {
                if (l->slot[e] >= 0 && l->stamp[e] < c->step + 1 && nv < (size_t)c->n_slots)
                    c->victims[nv++] = (struct moet_ecache_victim){c->lru ? 0 : l->freq[e], l->stamp[e], (uint32_t)i, e};
                if (l->miss[e] && l->slot[e] < 0 && nc < c->n_cands_cap)
                    c->cands[nc++] = (struct moet_ecache_victim){l->freq[e], 0, (uint32_t)i, e};
            }
        }
        qsort(c->victims, nv, sizeof *c->victims, victim_cmp);
        /* Admission (LFU victims only): a missing expert displaces a resident one only when it has been used more
         * (decayed) than that one; candidates most used first against victims least used first, so the pairing
         * stops at the first that does not pay. Without it every miss was fetched where a victim existed: in direct
         * mode a miss costs one read of the expert over the bus in the step and a fetch one more, so fetching an
         * expert that will not be used again before it is evicted doubles its cost. */
        const int admit = c->admit && !c->lru;
        if (admit) qsort(c->cands, nc, sizeof *c->cands, cand_cmp);
        for (size_t k = 0; k < nc; k++) {
            moet_ecache_layer *l = &c->layers[c->cands[k].layer];
            const int32_t e = c->cands[k].e;
            if (!c->n_free) { /* make room: the next victim, or none left (the rest stay where they wait) */
                if (iv == nv) break;
                if (admit && !(c->cands[k].f > c->victims[iv].f)) { c->declined += (int64_t)(nc - k); break; }
                moet_ecache_layer *vl = &c->layers[c->victims[iv].layer];
                const int32_t ve = c->victims[iv++].e;
                c->free_slots[c->n_free++] = vl->slot[ve];
                vl->slot[ve] = -1;
                c->evicted++;
            }
            l->slot[e] = c->free_slots[--c->n_free];
            l->stamp[e] = c->step + 1; /* used by this step */
            if (fetch) fetch(ctx, l->key, e, l->slot[e]);
            c->fetched++;
            n++;
        }
        for (size_t i = 0; i < c->n_layers; i++) memset(c->layers[i].miss, 0, (size_t)c->layers[i].n);
    }
    c->miss_layer = NULL;
    next_step(c);
    return n;
}

int64_t moet_ecache_layer_drop(moet_ecache *c, const void *key) {
    int64_t n = 0;
    for (size_t i = 0; i < c->n_layers; i++) {
        moet_ecache_layer *l = &c->layers[i];
        if (!key || l->key != key) continue;
        for (int32_t e = 0; e < l->n; e++)
            if (l->slot[e] >= 0) {
                c->free_slots[c->n_free++] = l->slot[e];
                l->slot[e] = -1;
                n++;
            }
        memset(l->miss, 0, (size_t)l->n);
        if (c->miss_layer == l) c->miss_layer = NULL;
        l->key = NULL;
    }
    return n;
}
