/*
 * sched.h — the scheduler: one thread that owns every session and runs the continuous batch.
 *
 * HTTP threads parse a request (oai.h), wrap it in a srv_req and submit it; the scheduler gives each of its choices
 * a session slot as slots free up, and at every step advances every running sequence by one unit: a prefill chunk
 * or one decoded token. Sequences join and leave the batch between steps, so a long generation never blocks a new
 * short one. Everything a client sees (SSE chunks, the final JSON, error bodies) is formatted by the scheduler into
 * the request's output buffer; the HTTP side only moves those bytes, and tells the scheduler when the client left.
 *
 * A step: prefill chunks one sequence at a time, then every decoding sequence samples its next token, and the
 * tokens of all that go on are fed through one batched forward (moet_batch_decode): the weights are read once per
 * step for the whole running batch, attention runs per sequence on its own KV cache.
 */
#ifndef MOET_SERVER_SCHED_H
#define MOET_SERVER_SCHED_H

#include <pthread.h>
#include <stdatomic.h>

#include "moet.h"
#include "server/metrics.h"
#include "server/oai.h"

typedef struct srv_choice srv_choice;

typedef struct srv_req {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                /* the HTTP side and the scheduler each hold one */
    oai_request r;
    char id[48];
    long long created;
    double t_arrive;
    /* output: written by the scheduler under mu, consumed by the HTTP side */
    char *out;
    size_t out_len, out_cap, out_read;
    int done;                /* all output written */
    int status;              /* HTTP status of the output (200, or an error's) */
    atomic_int cancelled;    /* the client disconnected */
    /* scheduler-private */
    srv_choice *ch;
    int n_ch, n_done, started;
    size_t prompt_tokens, completion_tokens;
    struct srv_req *next;
} srv_req;

/* A request holding r (ownership moves in); refs = 1 (the caller's). */
srv_req *srv_req_new(oai_request *r);
void srv_req_release(srv_req *q);

typedef struct {
    int max_seqs;            /* sessions = sequences in the running batch */
    int32_t n_ctx;           /* context per session */
    int queue_cap;           /* requests waiting for a slot beyond this are refused (429) */
    double queue_timeout;    /* seconds a request may wait for a slot (then 503); <= 0: forever */
    const char *model_name;
    int delta_mode;          /* 0 base experts, 1 base + delta for every step, 2 the confidence gate per step */
    float tau;               /* gate: a decode step whose top-1 probability is below tau is redone with the delta */
    float delta_pick;        /* the picks a delta step runs the delta on (moet_delta_pick); 0: every pick */
    int32_t kv_tokens;       /* the sessions' shared paged KV pool in tokens; <= 0: max_seqs x n_ctx */
    int32_t kv_block;        /* tokens a KV block; <= 0: 32 */
    int32_t kv_type;         /* MOET_KV_AUTO (0), MOET_KV_F32 or MOET_KV_F16 */
    int no_prefix_cache;     /* 1: sequences do not share the KV blocks of equal prompt prefixes */
} sched_options;

typedef struct sched sched;

int sched_create(const moet_model *m, const sched_options *o, metrics *mx, sched **out, char *err, size_t errlen);
/* Takes a reference on q. Returns 0, or 429 (queue full) / 503 (shutting down) without taking it. */
int sched_submit(sched *s, srv_req *q);
/* Waits until no request is queued or running. */
void sched_wait_idle(sched *s);
void sched_free(sched *s);

#endif
