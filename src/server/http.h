/*
 * http.h — `moet serve`'s HTTP side on libmicrohttpd: routing, API keys, body limits, the endpoints that need no
 * scheduling (/health, /metrics, /v1/models, /tokenize, /detokenize) and the byte pump between a request's output
 * buffer (written by the scheduler) and its connection, whole or as a server-sent-event stream.
 *
 * One thread per connection: a connection's thread may block waiting for its request's output, and notices a
 * client that went away (the socket hung up) while it waits, which cancels the request's sequences.
 */
#ifndef MOET_SERVER_HTTP_H
#define MOET_SERVER_HTTP_H

#include <stdatomic.h>
#include <stddef.h>

#include "moet.h"
#include "server/metrics.h"
#include "server/oai.h"
#include "server/sched.h"

enum { SERVER_LOADING = 0, SERVER_READY = 1, SERVER_DRAINING = 2 };

typedef struct {
    struct MHD_Daemon *daemon;
    atomic_int state;
    const char *api_key;     /* NULL: no authentication */
    size_t max_body;         /* bytes; larger bodies are 413 */
    int max_conns;
    oai_ctx oc;              /* valid once state is SERVER_READY */
    sched *sched;
    metrics mx;
    int port;                /* the bound port (after http_start) */
    atomic_int active;       /* requests between their first byte and their completion */
} moet_server;

/* Starts listening on host:port (port 0: any free port, written to srv->port). */
int http_start(moet_server *srv, const char *host, int port, char *err, size_t errlen);
void http_stop(moet_server *srv);

#endif
