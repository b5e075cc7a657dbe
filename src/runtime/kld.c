/* kld.c — see kld.h. */
#include "runtime/kld.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void moet_log_softmax(const float *logits, int32_t V, float *out) {
    float mx = logits[0];
    for (int32_t i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double s = 0;
    for (int32_t i = 0; i < V; i++) s += exp((double)logits[i] - mx);
    double lse = mx + log(s);
    for (int32_t i = 0; i < V; i++) out[i] = (float)((double)logits[i] - lse);
}

static int cmp_desc(const void *a, const void *b, void *key) {
    const float *k = key;
    float x = k[*(const int32_t *)a], y = k[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

void moet_kld_record(const float *logp, int32_t V, uint32_t topk, int32_t *scratch, int32_t *ids, float *lp,
                     float *rest) {
    for (int32_t i = 0; i < V; i++) scratch[i] = i;
    qsort_r(scratch, (size_t)V, sizeof(int32_t), cmp_desc, (void *)logp);
    double tail = 0;
    for (int32_t i = (int32_t)topk; i < V; i++) tail += exp((double)logp[scratch[i]]);
    for (uint32_t i = 0; i < topk; i++) { ids[i] = scratch[i]; lp[i] = logp[scratch[i]]; }
    *rest = tail > 0 ? (float)log(tail) : -INFINITY;
}

double moet_kld_eval(const int32_t *ids, const float *lp, float rest, uint32_t topk, const float *logq, int32_t V,
                     uint8_t *mark) {
    double kl = 0;
    for (uint32_t i = 0; i < topk; i++) {
        kl += exp((double)lp[i]) * ((double)lp[i] - (double)logq[ids[i]]);
        mark[ids[i]] = 1;
    }
    if (isfinite(rest)) {
        double qrest = 0;
        for (int32_t j = 0; j < V; j++)
            if (!mark[j]) qrest += exp((double)logq[j]);
        if (qrest < 1e-300) qrest = 1e-300;
        kl += exp((double)rest) * ((double)rest - log(qrest));
    }
    for (uint32_t i = 0; i < topk; i++) mark[ids[i]] = 0;
    return kl;
}

static int put32(FILE *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return fwrite(b, 1, 4, f) == 4 ? 0 : -1;
}
static int put64(FILE *f, uint64_t v) { return put32(f, (uint32_t)v) || put32(f, (uint32_t)(v >> 32)) ? -1 : 0; }
static int get32(FILE *f, uint32_t *v) {
    uint8_t b[4];
    if (fread(b, 1, 4, f) != 4) return -1;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return 0;
}
static int get64(FILE *f, uint64_t *v) {
    uint32_t lo, hi;
    if (get32(f, &lo) || get32(f, &hi)) return -1;
    *v = (uint64_t)hi << 32 | lo;
    return 0;
}

int moet_kld_write_header(FILE *f, const moet_kld_header *h) {
    if (fwrite("MOETKLD1", 1, 8, f) != 8) return -1;
    return put32(f, 1) || put32(f, h->vocab) || put32(f, h->ctx) || put32(f, h->topk) || put64(f, h->n_positions) ||
                   put64(f, h->tokens_hash) ? -1 : 0;
}

int moet_kld_read_header(FILE *f, moet_kld_header *h) {
    char magic[8];
    uint32_t ver;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "MOETKLD1", 8) || get32(f, &ver) || ver != 1) return -1;
    if (get32(f, &h->vocab) || get32(f, &h->ctx) || get32(f, &h->topk) || get64(f, &h->n_positions) ||
        get64(f, &h->tokens_hash))
        return -1;
    if (h->vocab == 0 || h->vocab > (1u << 24) || h->topk == 0 || h->topk > h->vocab) return -1;
    return 0;
}

uint64_t moet_fnv1a_ids(const int32_t *ids, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ (uint8_t)((uint32_t)ids[i] >> (8 * b))) * 1099511628211ull;
    return h;
}
