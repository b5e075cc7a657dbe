/*
 * metrics.c — Prometheus text for /metrics: request counts by endpoint and status, token counters, queue and batch
 * gauges, and histograms of time to first token, inter-token latency and request duration (seconds).
 */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double bucket_le[METRICS_NBUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                   0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};

void metrics_init(metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void metrics_destroy(metrics *m) { pthread_mutex_destroy(&m->mu); }

static int status_class(int status) {
    switch (status) {
    case 200: return 0;
    case 400: return 1;
    case 401: case 404: return 2;
    case 413: return 3;
    case 429: return 4;
    default: return 5;
    }
}

void metrics_request(metrics *m, int endpoint, int status) {
    pthread_mutex_lock(&m->mu);
    if (endpoint == 0 || endpoint == 1) m->requests[endpoint][status_class(status)]++;
    else m->other_requests++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe(metrics *m, metrics_hist *h, double s) {
    pthread_mutex_lock(&m->mu);
    h->count++;
    h->sum += s;
    for (int i = 0; i < METRICS_NBUCKETS; i++)
        if (s <= bucket_le[i]) { h->buckets[i]++; break; }
    pthread_mutex_unlock(&m->mu);
}

void metrics_add(metrics *m, uint64_t *counter, uint64_t n) {
    pthread_mutex_lock(&m->mu);
    *counter += n;
    pthread_mutex_unlock(&m->mu);
}

void metrics_gauges(metrics *m, int64_t queue_depth, int64_t running) {
    pthread_mutex_lock(&m->mu);
    m->queue_depth = queue_depth;
    m->running = running;
    pthread_mutex_unlock(&m->mu);
}

typedef struct { char *p; size_t n, cap; int oom; } sbuf;

static void put(sbuf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) { b->n += (size_t)k; return; }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = cap;
    }
}

static void hist(sbuf *b, const char *name, const char *help, const metrics_hist *h) {
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < METRICS_NBUCKETS; i++) {
        cum += h->buckets[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, bucket_le[i], (unsigned long long)cum);
    }
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->count, name, h->sum,
        name, (unsigned long long)h->count);
}

char *metrics_render(metrics *m, size_t *len) {
    static const char *ep[2] = {"completions", "chat_completions"};
    static const char *st[6] = {"200", "400", "401_404", "413", "429", "5xx"};
    sbuf b = {0};
    pthread_mutex_lock(&m->mu);
    put(&b, "# HELP moet_requests_total Requests answered, by endpoint and status.\n# TYPE moet_requests_total counter\n");
    for (int e = 0; e < 2; e++)
        for (int s = 0; s < 6; s++)
            put(&b, "moet_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", ep[e], st[s],
                (unsigned long long)m->requests[e][s]);
    put(&b, "moet_requests_total{endpoint=\"other\",status=\"any\"} %llu\n", (unsigned long long)m->other_requests);
    put(&b, "# HELP moet_prompt_tokens_total Prompt tokens prefilled.\n# TYPE moet_prompt_tokens_total counter\n"
            "moet_prompt_tokens_total %llu\n", (unsigned long long)m->prompt_tokens);
    put(&b, "# HELP moet_generation_tokens_total Tokens generated.\n# TYPE moet_generation_tokens_total counter\n"
            "moet_generation_tokens_total %llu\n", (unsigned long long)m->generation_tokens);
    put(&b, "# HELP moet_sequences_finished_total Sequences finished, by reason.\n# TYPE moet_sequences_finished_total counter\n"
            "moet_sequences_finished_total{reason=\"stop\"} %llu\nmoet_sequences_finished_total{reason=\"length\"} %llu\n"
            "moet_sequences_finished_total{reason=\"cancelled\"} %llu\n",
        (unsigned long long)m->finished_stop, (unsigned long long)m->finished_length, (unsigned long long)m->cancelled);
    put(&b, "# HELP moet_gate_steps_total Decode steps the confidence gate checked (--delta gate).\n# TYPE moet_gate_steps_total counter\n"
            "moet_gate_steps_total %llu\n"
            "# HELP moet_gate_corrected_total Decode steps redone with base + delta experts.\n# TYPE moet_gate_corrected_total counter\n"
            "moet_gate_corrected_total %llu\n",
        (unsigned long long)m->gate_steps, (unsigned long long)m->gate_corrected);
    put(&b, "# HELP moet_preemptions_total Sequences preempted because the KV pool was full (recomputed later).\n"
            "# TYPE moet_preemptions_total counter\nmoet_preemptions_total %llu\n"
            "# HELP moet_recomputed_tokens_total Tokens prefilled again after a preemption.\n"
            "# TYPE moet_recomputed_tokens_total counter\nmoet_recomputed_tokens_total %llu\n"
            "# HELP moet_prefix_cache_hit_tokens_total Prompt tokens whose KV blocks were shared, not computed.\n"
            "# TYPE moet_prefix_cache_hit_tokens_total counter\nmoet_prefix_cache_hit_tokens_total %llu\n",
        (unsigned long long)m->preemptions, (unsigned long long)m->recomputed_tokens,
        (unsigned long long)m->prefix_hit_tokens);
    put(&b, "# HELP moet_expert_cache_fetched_total Routed experts made resident (--expert-slots).\n"
            "# TYPE moet_expert_cache_fetched_total counter\nmoet_expert_cache_fetched_total %llu\n"
            "# HELP moet_expert_cache_evicted_total Routed experts evicted to make room.\n"
            "# TYPE moet_expert_cache_evicted_total counter\nmoet_expert_cache_evicted_total %llu\n"
            "# HELP moet_expert_cache_replayed_steps_total Steps run again after fetching the experts they missed.\n"
            "# TYPE moet_expert_cache_replayed_steps_total counter\nmoet_expert_cache_replayed_steps_total %llu\n"
            "# HELP moet_expert_cache_uses_total Routed experts asked for (a layer's expert once a forward pass).\n"
            "# TYPE moet_expert_cache_uses_total counter\nmoet_expert_cache_uses_total %llu\n"
            "# HELP moet_expert_cache_misses_total Of those, not resident (1 - misses / uses: the hit rate).\n"
            "# TYPE moet_expert_cache_misses_total counter\nmoet_expert_cache_misses_total %llu\n",
        (unsigned long long)m->expert_fetched, (unsigned long long)m->expert_evicted,
        (unsigned long long)m->expert_replays, (unsigned long long)m->expert_uses,
        (unsigned long long)m->expert_misses);
    put(&b, "# HELP moet_queue_depth Requests waiting for a sequence slot.\n# TYPE moet_queue_depth gauge\n"
            "moet_queue_depth %lld\n", (long long)m->queue_depth);
    put(&b, "# HELP moet_running_sequences Sequences in the running batch.\n# TYPE moet_running_sequences gauge\n"
            "moet_running_sequences %lld\n", (long long)m->running);
    hist(&b, "moet_time_to_first_token_seconds", "From request arrival to its first generated token.", &m->ttft);
    hist(&b, "moet_inter_token_latency_seconds", "Between consecutive generated tokens of a sequence.", &m->itl);
    hist(&b, "moet_request_duration_seconds", "From arrival to the last token.", &m->e2e);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) { free(b.p); return NULL; }
    *len = b.n;
    return b.p;
}
