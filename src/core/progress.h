/*
 * progress.h — a thread-safe progress line on stderr for long work (calibrating, quantizing): counts units, redraws
 * at most four times a second and on the last unit, shows the rate, and ends the line when done.
 */
#ifndef MOET_CORE_PROGRESS_H
#define MOET_CORE_PROGRESS_H

#include <pthread.h>
#include <stdint.h>

typedef struct {
    pthread_mutex_t mu;
    const char *what, *unit;  /* "quantizing experts to w2", "experts" */
    int64_t done, total;
    double t0, last;
} moet_progress;

void moet_progress_init(moet_progress *p, const char *what, const char *unit, int64_t total);
/* Adds n units (any thread). */
void moet_progress_add(moet_progress *p, int64_t n);
void moet_progress_end(moet_progress *p);

#endif
