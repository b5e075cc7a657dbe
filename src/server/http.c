/*
 * http.c — routing and the byte pump of `moet serve` (see http.h).
 */
#include "server/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "core/util.h"

typedef struct {
    char *body;
    size_t len, cap;
    int too_large;
    srv_req *q;
} conn_ctx;

/* the response's view of a streamed request */
typedef struct {
    srv_req *q;
    struct MHD_Connection *conn;
    moet_server *srv;
} stream_ctx;

static enum MHD_Result send_bytes(struct MHD_Connection *conn, int status, const char *type, const char *p, size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)p, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *conn, int status, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return MHD_NO;
    enum MHD_Result ok = send_bytes(conn, status, "application/json", s, strlen(s));
    free(s);
    return ok;
}

static enum MHD_Result send_error(moet_server *srv, struct MHD_Connection *conn, int endpoint, const oai_error *e) {
    size_t n;
    char *s = oai_error_json(e, &n);
    metrics_request(&srv->mx, endpoint, e->status);
    if (!s) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(s); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (e->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (e->status == 429 || e->status == 503) MHD_add_response_header(r, "Retry-After", "1");
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)e->status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result fail(moet_server *srv, struct MHD_Connection *conn, int endpoint, int status, const char *code,
                            const char *msg) {
    oai_error e;
    oai_fail(&e, status, NULL, code, "%s", msg);
    return send_error(srv, conn, endpoint, &e);
}

/* True once the peer closed or reset the connection. */
static int peer_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

static void wait_tick(srv_req *q) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&q->cv, &q->mu, &ts);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *sc = cls;
    srv_req *q = sc->q;
    pthread_mutex_lock(&q->mu);
    while (q->out_read == q->out_len && !q->done) {
        pthread_mutex_unlock(&q->mu);
        if (peer_gone(sc->conn)) {
            atomic_store(&q->cancelled, 1);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        pthread_mutex_lock(&q->mu);
        if (q->out_read == q->out_len && !q->done) wait_tick(q);
    }
    size_t n = q->out_len - q->out_read;
    if (n == 0) {  /* done and drained */
        pthread_mutex_unlock(&q->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (n > max) n = max;
    memcpy(buf, q->out + q->out_read, n);
    q->out_read += n;
    pthread_mutex_unlock(&q->mu);
    (void)pos;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    srv_req *q = sc->q;
    pthread_mutex_lock(&q->mu);
    int done = q->done;
    pthread_mutex_unlock(&q->mu);
    if (!done) atomic_store(&q->cancelled, 1);
    srv_req_release(q);
    free(sc);
}

static int authorized(moet_server *srv, struct MHD_Connection *conn) {
    if (!srv->api_key) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(srv->api_key);
    unsigned diff = a != b;
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(h[i] ^ srv->api_key[i]);  /* constant time */
    return diff == 0;
}

/* POST /v1/completions and /v1/chat/completions: parse, submit, then answer from the request's output. */
static enum MHD_Result generate(moet_server *srv, struct MHD_Connection *conn, int endpoint, conn_ctx *cc) {
    oai_request r;
    oai_error e;
    if (oai_request_parse(&srv->oc, endpoint, cc->body ? cc->body : "", cc->len, &r, &e)) return send_error(srv, conn, endpoint, &e);
    srv_req *q = srv_req_new(&r);
    if (!q) {
        oai_request_free(&r);
        return fail(srv, conn, endpoint, 503, NULL, "out of memory");
    }
    int rc = sched_submit(srv->sched, q);
    if (rc) {
        srv_req_release(q);
        return rc == 429 ? fail(srv, conn, endpoint, 429, "queue_full", "the request queue is full; retry later")
                         : fail(srv, conn, endpoint, 503, "shutting_down", "the server is shutting down");
    }
    cc->q = q;  /* released when the connection completes */
    /* wait for the first output (stream) or all of it (whole), noticing a client that leaves */
    pthread_mutex_lock(&q->mu);
    while (!q->done && !(q->r.stream && q->out_len > 0)) {
        pthread_mutex_unlock(&q->mu);
        if (peer_gone(conn)) {
            atomic_store(&q->cancelled, 1);
            return MHD_NO;
        }
        pthread_mutex_lock(&q->mu);
        if (!q->done && !(q->r.stream && q->out_len > 0)) wait_tick(q);
    }
    int status = q->status;
    int stream_ok = q->r.stream && q->out_len > 0 && (status == 200 || !q->done);
    if (!stream_ok) {  /* a whole response, or an error before any event */
        if (status == 499) {
            pthread_mutex_unlock(&q->mu);
            return MHD_NO;
        }
        enum MHD_Result ok = send_bytes(conn, status, "application/json", q->out ? q->out : "", q->out_len);
        pthread_mutex_unlock(&q->mu);
        metrics_request(&srv->mx, endpoint, status);
        return ok;
    }
    pthread_mutex_unlock(&q->mu);
    stream_ctx *sc = malloc(sizeof *sc);
    if (!sc) return MHD_NO;
    pthread_mutex_lock(&q->mu);
    q->refs++;
    pthread_mutex_unlock(&q->mu);
    sc->q = q;
    sc->conn = conn;
    sc->srv = srv;
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, sc, stream_free);
    if (!resp) {
        stream_free(sc);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ok = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    metrics_request(&srv->mx, endpoint, 200);
    return ok;
}

static json_t *ids_json(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* POST /tokenize {"prompt" | "content": text, "add_special_tokens"} or {"messages": [...]}
 * -> {"tokens", "count", "max_model_len"} (vLLM's shape; llama.cpp's "content" key is accepted too). */
static enum MHD_Result tokenize(moet_server *srv, struct MHD_Connection *conn, conn_ctx *cc) {
    oai_error e;
    json_error_t je;
    json_t *root = json_loadb(cc->body ? cc->body : "", cc->len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return fail(srv, conn, -1, 400, "invalid_json", "the body must be a JSON object");
    }
    json_t *p = json_object_get(root, "prompt");
    if (!p) p = json_object_get(root, "content");
    json_t *msgs = json_object_get(root, "messages");
    json_t *as = json_object_get(root, "add_special_tokens");
    if (as && !json_is_boolean(as)) {
        json_decref(root);
        return fail(srv, conn, -1, 400, "invalid_type", "'add_special_tokens' must be a boolean");
    }
    char *text = NULL;
    int add_special = 1;
    if (json_is_string(p)) {
        text = strdup(json_string_value(p));
    } else if (json_is_array(msgs)) {
        json_t *agp = json_object_get(root, "add_generation_prompt");
        if (oai_chat_render(&srv->oc, msgs, NULL, NULL, json_is_true(agp), &text, &e)) {
            json_decref(root);
            return send_error(srv, conn, -1, &e);
        }
        add_special = 0;
    } else {
        json_decref(root);
        return fail(srv, conn, -1, 400, "missing_required_parameter", "give 'prompt' (a string) or 'messages'");
    }
    if (as) add_special = json_is_true(as);
    int32_t *ids = NULL;
    size_t n = 0;
    char msg[256];
    if (!text) {
        json_decref(root);
        return fail(srv, conn, -1, 503, NULL, "out of memory");
    }
    int rc = moet_tokenizer_encode_special(srv->oc.tok, text, strlen(text), add_special, &ids, &n, msg, sizeof msg);
    free(text);
    json_decref(root);
    if (rc) return fail(srv, conn, -1, 400, "invalid_value", msg);
    metrics_request(&srv->mx, -1, 200);
    enum MHD_Result ok = send_json(conn, 200, json_pack("{s:o,s:I,s:i}", "tokens", ids_json(ids, n), "count", (json_int_t)n,
                                                        "max_model_len", srv->oc.n_ctx));
    free(ids);
    return ok;
}

/* POST /detokenize {"tokens": [ids]} -> {"prompt": text} */
static enum MHD_Result detokenize(moet_server *srv, struct MHD_Connection *conn, conn_ctx *cc) {
    json_error_t je;
    json_t *root = json_loadb(cc->body ? cc->body : "", cc->len, JSON_REJECT_DUPLICATES, &je);
    json_t *t = json_object_get(root, "tokens");
    if (!json_is_array(t)) {
        json_decref(root);
        return fail(srv, conn, -1, 400, "invalid_type", "'tokens' must be an array of token ids");
    }
    size_t n = json_array_size(t);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) { json_decref(root); return fail(srv, conn, -1, 503, NULL, "out of memory"); }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= srv->oc.vocab) {
            free(ids);
            json_decref(root);
            return fail(srv, conn, -1, 400, "invalid_value", "'tokens' holds something that is not a token id");
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(root);
    char *text = NULL;
    size_t len = 0;
    char msg[256];
    int rc = moet_tokenizer_decode(srv->oc.tok, ids, n, &text, &len, msg, sizeof msg);
    free(ids);
    if (rc) return fail(srv, conn, -1, 400, "invalid_value", msg);
    metrics_request(&srv->mx, -1, 200);
    enum MHD_Result ok = send_json(conn, 200, json_pack("{s:o}", "prompt", oai_json_text(text, len)));
    free(text);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    moet_server *srv = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {  /* first call: headers only */
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        atomic_fetch_add(&srv->active, 1);
        return MHD_YES;
    }
    if (*upload_size) {  /* a piece of the body */
        if (!cc->too_large) {
            if (cc->len + *upload_size > srv->max_body) {
                cc->too_large = 1;
                free(cc->body);
                cc->body = NULL;
                cc->len = 0;
            } else {
                if (cc->len + *upload_size + 1 > cc->cap) {
                    size_t cap = cc->cap ? cc->cap : 4096;
                    while (cap < cc->len + *upload_size + 1) cap *= 2;
                    char *nb = realloc(cc->body, cap);
                    if (!nb) return MHD_NO;
                    cc->body = nb;
                    cc->cap = cap;
                }
                memcpy(cc->body + cc->len, upload, *upload_size);
                cc->len += *upload_size;
                cc->body[cc->len] = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    int endpoint = !strcmp(url, "/v1/completions") ? OAI_COMPLETIONS : !strcmp(url, "/v1/chat/completions") ? OAI_CHAT : -1;
    int state = atomic_load(&srv->state);
    if (!strcmp(url, "/health")) {
        metrics_request(&srv->mx, -1, state == SERVER_READY ? 200 : 503);
        const char *st = state == SERVER_READY ? "ok" : state == SERVER_LOADING ? "loading" : "draining";
        return send_json(conn, state == SERVER_READY ? 200 : 503, json_pack("{s:s}", "status", st));
    }
    if (!strcmp(url, "/metrics") && get) {
        size_t n;
        char *text = metrics_render(&srv->mx, &n);
        if (!text) return MHD_NO;
        enum MHD_Result ok = send_bytes(conn, 200, "text/plain; version=0.0.4", text, n);
        free(text);
        return ok;
    }
    int known = endpoint >= 0 || !strcmp(url, "/v1/models") || !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize");
    if (!known) return fail(srv, conn, -1, 404, "not_found", "no such endpoint");
    if (!authorized(srv, conn)) return fail(srv, conn, endpoint, 401, "invalid_api_key", "invalid or missing API key (Authorization: Bearer KEY)");
    if (cc->too_large) {
        char m[96];
        snprintf(m, sizeof m, "the request body is larger than %zu bytes", srv->max_body);
        return fail(srv, conn, endpoint, 413, "request_too_large", m);
    }
    if (state != SERVER_READY)
        return fail(srv, conn, endpoint, 503, state == SERVER_LOADING ? "loading" : "shutting_down",
                    state == SERVER_LOADING ? "the model is still loading" : "the server is shutting down");
    if (!strcmp(url, "/v1/models")) {
        if (!get) return fail(srv, conn, -1, 405, "method_not_allowed", "use GET");
        metrics_request(&srv->mx, -1, 200);
        json_t *model = json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", srv->oc.model_name, "object", "model", "created",
                                  (json_int_t)time(NULL), "owned_by", "moet", "max_model_len", srv->oc.n_ctx);
        return send_json(conn, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model));
    }
    if (!post) return fail(srv, conn, endpoint, 405, "method_not_allowed", "use POST");
    if (!strcmp(url, "/tokenize")) return tokenize(srv, conn, cc);
    if (!strcmp(url, "/detokenize")) return detokenize(srv, conn, cc);
    (void)version;
    return generate(srv, conn, endpoint, cc);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    if (cc->q) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) atomic_store(&cc->q->cancelled, 1);
        srv_req_release(cc->q);
    }
    free(cc->body);
    free(cc);
    *con_cls = NULL;
    atomic_fetch_sub(&((moet_server *)cls)->active, 1);
    (void)conn;
}

int http_start(moet_server *srv, const char *host, int port, char *err, size_t errlen) {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return moet_err(err, errlen, MOET_EINVAL, "--host '%s' is not an IPv4 address", host);
    srv->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                                   (uint16_t)port, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR, &addr,
                                   MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_CONNECTION_LIMIT,
                                   (unsigned)srv->max_conns, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_END);
    if (!srv->daemon) return moet_err(err, errlen, MOET_EIO, "cannot listen on %s:%d (in use, or not permitted)", host, port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : port;
    return 0;
}

void http_stop(moet_server *srv) {
    if (srv->daemon) MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
}
