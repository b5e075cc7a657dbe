/*
 * pool.h — a persistent pthread pool for data-parallel loops.
 *
 * moet_pool_for(p, n, fn, ctx) splits [0, n) into one contiguous range per thread and runs fn on each, the calling
 * thread taking the first share, and returns when all are done. Contiguous ranges (not work stealing) keep each
 * thread on its own weight rows, which is what a bandwidth-bound matvec wants. Threads are created once, so the
 * decode loop never creates threads or allocates.
 */
#ifndef MOET_CORE_POOL_H
#define MOET_CORE_POOL_H

#include <stdint.h>

typedef struct moet_pool moet_pool;
/* fn(ctx, begin, end, thread_index) */
typedef void (*moet_pool_fn)(void *ctx, int64_t begin, int64_t end, int tid);

moet_pool *moet_pool_create(int n_threads);
void moet_pool_free(moet_pool *p);
int moet_pool_threads(const moet_pool *p);
void moet_pool_for(moet_pool *p, int64_t n, moet_pool_fn fn, void *ctx);
/* Number of online CPUs. */
int moet_cpu_count(void);

#endif
