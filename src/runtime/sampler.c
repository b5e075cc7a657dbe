/*
 * sampler.c — next-token selection: penalties, temperature, top-k, top-p, min-p, then a seeded draw.
 *
 * Order (the one llama.cpp and HF's warpers agree on where they overlap): repetition/presence/frequency penalties on
 * raw logits -> temperature -> top-k -> top-p (nucleus) -> min-p (relative to the top probability) -> sample.
 * temperature <= 0 is greedy (argmax after penalties; ties go to the lowest id, as torch.argmax does).
 * Nothing sorts the whole vocabulary: top-k keeps a bounded heap, top-p sorts a prefix grown until it holds the
 * nucleus, min-p and plain temperature need no order.
 * The RNG is xoshiro256** seeded through splitmix64, so a seed fixes the whole stream. All buffers are sized by
 * the vocabulary at creation: sampling never allocates.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "moet.h"

struct moet_sampler {
    moet_sampler_options o;
    int32_t V;
    uint64_t rng[4];
    float *logit;       /* working copy [V] */
    int32_t *count;     /* occurrences in the penalty window [V] */
    int32_t *idx;       /* candidate ids [V] */
    float *prob;        /* candidate probabilities [V] */
    uint8_t *mark;      /* [V], zero between calls: which ids are candidates (moet_sampler_sample_candidates) */
};

moet_sampler_options moet_sampler_default_options(void) {
    moet_sampler_options o = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                              .repetition_penalty = 1.0f, .presence_penalty = 0.0f, .frequency_penalty = 0.0f,
                              .penalty_last_n = 64, .seed = 0};
    return o;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return r;
}

int moet_sampler_create(const moet_sampler_options *opt, int32_t vocab_size, moet_sampler **out, char *err,
                        size_t errlen) {
    *out = NULL;
    moet_sampler_options o = opt ? *opt : moet_sampler_default_options();
    if (vocab_size <= 0) return moet_err(err, errlen, MOET_EINVAL, "vocab size %d", vocab_size);
    if (!(o.temperature >= 0) || !(o.top_p > 0 && o.top_p <= 1) || !(o.min_p >= 0 && o.min_p <= 1) || o.top_k < 0 ||
        !(o.repetition_penalty > 0))
        return moet_err(err, errlen, MOET_EINVAL,
                        "sampler options out of range (temperature >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, top_k >= 0, "
                        "repetition_penalty > 0)");
    moet_sampler *s = calloc(1, sizeof(*s));
    if (!s) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    s->o = o;
    s->V = vocab_size;
    s->logit = malloc((size_t)vocab_size * sizeof(float));
    s->count = calloc((size_t)vocab_size, sizeof(int32_t));
    s->idx = malloc((size_t)vocab_size * sizeof(int32_t));
    s->prob = malloc((size_t)vocab_size * sizeof(float));
    s->mark = calloc((size_t)vocab_size, 1);
    if (!s->logit || !s->count || !s->idx || !s->prob || !s->mark) {
        moet_sampler_free(s);
        return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    }
    uint64_t x = o.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return MOET_OK;
}

void moet_sampler_free(moet_sampler *s) {
    if (!s) return;
    free(s->logit);
    free(s->count);
    free(s->idx);
    free(s->prob);
    free(s->mark);
    free(s);
}

static int cmp_desc(const void *a, const void *b, void *key) {
    const float *k = key;
    float x = k[*(const int32_t *)a], y = k[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* Repetition / presence / frequency penalties on l (indexed by id) for the tokens of the window; only != NULL: just
 * the ids marked there (the others' entries are not read). The counts are left zeroed. */
static void apply_penalties(moet_sampler *s, float *l, const int32_t *history, size_t n_history, const uint8_t *only) {
    const moet_sampler_options *o = &s->o;
    const int32_t V = s->V;
    size_t from = (o->penalty_last_n < 0 || (size_t)o->penalty_last_n >= n_history) ? 0
                                                                                    : n_history - (size_t)o->penalty_last_n;
    for (size_t i = from; i < n_history; i++)
        if (history[i] >= 0 && history[i] < V) s->count[history[i]]++;
    for (size_t i = from; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= V || s->count[t] == 0) continue;
        if (!only || only[t]) {
            if (o->repetition_penalty != 1.0f) l[t] = l[t] > 0 ? l[t] / o->repetition_penalty : l[t] * o->repetition_penalty;
            l[t] -= o->presence_penalty + o->frequency_penalty * (float)s->count[t];
        }
        s->count[t] = 0; /* apply once per distinct token, and leave the array zeroed */
    }
}

static double uniform01(moet_sampler *s) { return (double)(next_u64(s->rng) >> 11) * (1.0 / 9007199254740992.0); }

/* The shortest prefix of s->prob[0..n) (probabilities in the sampler's order) that holds top_p of the mass, or -1
 * when all n hold less. */
static int32_t nucleus_len(const moet_sampler *s, int32_t n) {
    double c = 0;
    for (int32_t i = 0; i < n; i++) {
        c += s->prob[i];
        if (c >= s->o.top_p) return i + 1;
    }
    return -1;
}

/* Min-p over the first n of s->prob / s->idx, then the draw at u (uniform in [0, 1)) of what is left. */
static int32_t draw_prefix(moet_sampler *s, int32_t n, double u) {
    if (s->o.min_p > 0.0f) {
        const float thr = s->o.min_p * s->prob[0];
        int32_t keep = 1;
        while (keep < n && s->prob[keep] >= thr) keep++;
        n = keep;
    }
    double tot = 0;
    for (int32_t i = 0; i < n; i++) tot += s->prob[i];
    const double r = u * tot;
    double c = 0;
    for (int32_t i = 0; i < n; i++) {
        c += s->prob[i];
        if (r < c) return s->idx[i];
    }
    return s->idx[n - 1];
}

/* From the n candidates in s->idx, sorted by s->logit (already divided by the temperature) descending: top-k,
 * softmax, top-p, min-p, the draw. */
static int32_t draw_sorted(moet_sampler *s, int32_t n) {
    const moet_sampler_options *o = &s->o;
    const float *l = s->logit;
    if (o->top_k > 0 && o->top_k < n) n = o->top_k;
    double sum = 0;
    float mx = l[s->idx[0]];
    for (int32_t i = 0; i < n; i++) {
        s->prob[i] = expf(l[s->idx[i]] - mx);
        sum += s->prob[i];
    }
    for (int32_t i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (o->top_p < 1.0f) {
        const int32_t keep = nucleus_len(s, n);
        if (keep > 0) n = keep;
    }
    return draw_prefix(s, n, uniform01(s));
}

/* The first m ids of the sampler's order (cmp_desc on s->logit: larger first, equal values by lower id) into
 * s->idx[0..m), sorted: a bounded heap of the m best (its root the worst kept), then a sort of those m. The order is
 * total, so this is exactly the first m of a sort of the whole vocabulary, in O(V log m) instead of O(V log V)
 * (151936 logits: ~33 ms a sort on the 2-core machine here). */
static void top_sorted(moet_sampler *s, int32_t m) {
    const float *l = s->logit;
    int32_t *h = s->idx, n = 0;
#define WORSE(a, b) (l[a] < l[b] || (l[a] == l[b] && (a) > (b))) /* a ranks after b */
    for (int32_t i = 0; i < s->V; i++) {
        int32_t j;
        if (n < m) { /* push, sift up */
            j = n++;
            while (j > 0 && WORSE(i, h[(j - 1) / 2])) { h[j] = h[(j - 1) / 2]; j = (j - 1) / 2; }
            h[j] = i;
            continue;
        }
        if (!WORSE(h[0], i)) continue; /* not better than the worst kept */
        j = 0; /* replace the root, sift down */
        for (;;) {
            int32_t c = 2 * j + 1;
            if (c >= n) break;
            if (c + 1 < n && WORSE(h[c + 1], h[c])) c++;
            if (!WORSE(h[c], i)) break;
            h[j] = h[c];
            j = c;
        }
        h[j] = i;
    }
#undef WORSE
    qsort_r(h, (size_t)m, sizeof(int32_t), cmp_desc, s->logit);
}

/* Sampling from the whole (penalised) row in s->logit with temperature > 0: top-k through top_sorted and
 * draw_sorted; without top-k the softmax is over the whole vocabulary (normalised in id order), min-p is a threshold
 * on it, and only top-p needs an order: the sorted prefix, grown until it holds top_p of the mass. One draw of the
 * random stream a call, as before. */
static int32_t sample_row(moet_sampler *s) {
    const moet_sampler_options *o = &s->o;
    const int32_t V = s->V;
    float *l = s->logit;
    for (int32_t i = 0; i < V; i++) l[i] /= o->temperature;
    if (o->top_k > 0 && o->top_k < V) {
        top_sorted(s, o->top_k);
        return draw_sorted(s, o->top_k);
    }
    float mx = l[0];
    for (int32_t i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < V; i++) sum += expf(l[i] - mx);
    const double u = uniform01(s);
    if (o->top_p >= 1.0f) { /* no order needed: min-p keeps p >= min_p p_max, then the draw walks the ids */
        const float thr = o->min_p > 0.0f ? o->min_p * (float)(1.0 / sum) : 0.0f;
        double tot = 0;
        int32_t last = 0;
        for (int32_t i = 0; i < V; i++) {
            const float p = (float)(expf(l[i] - mx) / sum);
            s->prob[i] = p >= thr ? p : 0.0f;
            if (s->prob[i] > 0.0f) { tot += s->prob[i]; last = i; }
        }
        const double r = u * tot;
        double c = 0;
        for (int32_t i = 0; i < V; i++) {
            c += s->prob[i];
            if (s->prob[i] > 0.0f && r < c) return i;
        }
        return last;
    }
    for (int32_t m = V < 1024 ? V : 1024;; m = V / 4 < m ? V : 4 * m) {
        top_sorted(s, m);
        for (int32_t i = 0; i < m; i++) s->prob[i] = (float)(expf(l[s->idx[i]] - mx) / sum);
        int32_t n = nucleus_len(s, m);
        if (n < 0 && m < V) continue; /* the nucleus is longer than the prefix */
        return draw_prefix(s, n < 0 ? m : n, u);
    }
}

static int penalized(const moet_sampler_options *o) {
    return o->repetition_penalty != 1.0f || o->presence_penalty != 0.0f || o->frequency_penalty != 0.0f;
}

int32_t moet_sampler_sample(moet_sampler *s, const float *logits, const int32_t *history, size_t n_history) {
    const moet_sampler_options *o = &s->o;
    const int32_t V = s->V;
    float *l = s->logit;
    memcpy(l, logits, (size_t)V * sizeof(float));
    if (penalized(o) && n_history) apply_penalties(s, l, history, n_history, NULL);
    if (o->temperature <= 0.0f) {
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (l[i] > l[best]) best = i;
        return best;
    }
    return sample_row(s);
}

/* Why the candidates decide exactly: every id outside them has a raw logit <= the last candidate's (b), and
 * penalties that only lower logits (repetition_penalty >= 1, presence and frequency >= 0) keep it <= b, and
 * dividing by the temperature keeps it <= b / T. So when the greedy pick, or the top_k-th candidate after
 * penalties and temperature, is strictly above that bound, the full vocabulary's argmax, or its first top_k in the
 * sampler's order, are among the candidates, in the same order with the same values: the same arithmetic follows
 * on the same numbers. */
int32_t moet_sampler_sample_candidates(moet_sampler *s, const int32_t *ids, const float *vals, int32_t k,
                                       const int32_t *history, size_t n_history) {
    const moet_sampler_options *o = &s->o;
    const int32_t V = s->V;
    if (k <= 0 || k > V) return -1;
    const int all = k == V;
    if (!all) {
        if (o->repetition_penalty < 1.0f || o->presence_penalty < 0.0f || o->frequency_penalty < 0.0f) return -1;
        if (o->temperature > 0.0f && !(o->top_k > 0 && o->top_k < k)) return -1; /* the k-th is the bound itself */
    }
    float *l = s->logit;
    for (int32_t i = 0; i < k; i++) {
        if (ids[i] < 0 || ids[i] >= V || vals[i] != vals[i] || s->mark[ids[i]]) { /* bad or repeated id, NaN */
            for (int32_t j = 0; j < i; j++) s->mark[ids[j]] = 0;
            return -1;
        }
        l[ids[i]] = vals[i];
        s->mark[ids[i]] = 1;
    }
    if (penalized(o) && n_history) apply_penalties(s, l, history, n_history, s->mark);
    for (int32_t i = 0; i < k; i++) s->mark[ids[i]] = 0;
    const float bound = vals[k - 1];
    if (o->temperature <= 0.0f) {
        int32_t best = ids[0];
        for (int32_t i = 1; i < k; i++)
            if (l[ids[i]] > l[best] || (l[ids[i]] == l[best] && ids[i] < best)) best = ids[i];
        return all || l[best] > bound ? best : -1;
    }
    if (all) return sample_row(s); /* every id is a candidate: the row itself */
    for (int32_t i = 0; i < k; i++) {
        l[ids[i]] /= o->temperature;
        s->idx[i] = ids[i];
    }
    qsort_r(s->idx, (size_t)k, sizeof(int32_t), cmp_desc, l);
    if (!all && !(l[s->idx[o->top_k - 1]] > bound / o->temperature)) return -1;
    return draw_sorted(s, k);
}
