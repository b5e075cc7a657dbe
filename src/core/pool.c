/* pool.c — see pool.h. One mutex + two condition variables; a generation counter starts each parallel loop. */
#include "pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct moet_pool {
    int n;                 /* total threads including the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int pending;
    int quit;
    moet_pool_fn fn;
    void *ctx;
    int64_t total;
};

typedef struct {
    moet_pool *p;
    int tid;
} worker_arg;

static void run_share(moet_pool *p, int tid) {
    int64_t per = p->total / p->n, rem = p->total % p->n;
    int64_t b = tid * per + (tid < rem ? tid : rem);
    int64_t e = b + per + (tid < rem ? 1 : 0);
    if (b < e) p->fn(p->ctx, b, e, tid);
}

static void *worker(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    moet_pool *p = wa.p;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->quit) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_share(p, wa.tid);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int moet_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

moet_pool *moet_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = moet_cpu_count();
    moet_pool *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->th) { free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof(*wa));
        if (!wa) { p->n = i; break; }
        wa->p = p;
        wa->tid = i;
        if (pthread_create(&p->th[i], NULL, worker, wa) != 0) { free(wa); p->n = i; break; }
    }
    return p;
}

void moet_pool_free(moet_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
}

int moet_pool_threads(const moet_pool *p) { return p ? p->n : 1; }

void moet_pool_for(moet_pool *p, int64_t n, moet_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!p || p->n == 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
