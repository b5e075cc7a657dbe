/*
 * metrics.h — the server's counters and latency histograms, rendered as Prometheus text for GET /metrics.
 * Every update takes one mutex: updates are a few per generated token, far below contention.
 */
#ifndef MOET_SERVER_METRICS_H
#define MOET_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define METRICS_NBUCKETS 14

typedef struct {
    uint64_t count, buckets[METRICS_NBUCKETS];  /* cumulative at render time, per bucket here */
    double sum;
} metrics_hist;

typedef struct {
    pthread_mutex_t mu;
    uint64_t requests[2][6];       /* [endpoint: completions, chat][status class: 200, 400, 401/404, 413, 429, 5xx] */
    uint64_t other_requests;       /* /v1/models, /tokenize, /detokenize, /health, /metrics */
    uint64_t prompt_tokens, generation_tokens, cancelled, finished_stop, finished_length;
    uint64_t gate_steps, gate_corrected; /* --delta gate: decode steps checked, and redone with the delta */
    uint64_t preemptions, recomputed_tokens, prefix_hit_tokens; /* sequences preempted when the KV pool ran out, tokens prefilled again */
    uint64_t expert_fetched, expert_evicted, expert_replays;   /* --expert-slots: the expert cache's counts */
    uint64_t expert_uses, expert_misses;                       /* and its uses, those not resident (hit rate) */
    int64_t queue_depth, running;  /* gauges, set by the scheduler */
    metrics_hist ttft, itl, e2e;
} metrics;

void metrics_init(metrics *m);
void metrics_destroy(metrics *m);
void metrics_request(metrics *m, int endpoint, int status);  /* endpoint 0 completions, 1 chat, -1 other */
void metrics_observe(metrics *m, metrics_hist *h, double seconds);
void metrics_add(metrics *m, uint64_t *counter, uint64_t n);
void metrics_gauges(metrics *m, int64_t queue_depth, int64_t running);
/* Prometheus text exposition format 0.0.4; malloc'd. */
char *metrics_render(metrics *m, size_t *len);

#endif
