/* progress.c — see progress.h. */
#include "core/progress.h"

#include <stdio.h>

#include "core/util.h"

void moet_progress_init(moet_progress *p, const char *what, const char *unit, int64_t total) {
    pthread_mutex_init(&p->mu, NULL);
    p->what = what;
    p->unit = unit;
    p->done = 0;
    p->total = total;
    p->t0 = moet_time_s();
    p->last = 0;
}

void moet_progress_add(moet_progress *p, int64_t n) {
    pthread_mutex_lock(&p->mu);
    p->done += n;
    double now = moet_time_s();
    if (now - p->last >= 0.25 || p->done >= p->total) {
        p->last = now;
        double el = now - p->t0;
        fprintf(stderr, "\rmoet: %s [%lld/%lld %s] %.1f %s/s", p->what, (long long)p->done, (long long)p->total,
                p->unit, (double)p->done / (el > 0 ? el : 1e-9), p->unit);
    }
    pthread_mutex_unlock(&p->mu);
}

void moet_progress_end(moet_progress *p) {
    fprintf(stderr, "\n");
    pthread_mutex_destroy(&p->mu);
}
