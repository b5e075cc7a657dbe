/*
 * sched.c — the continuous-batching scheduler (see sched.h), and the OpenAI response shapes it writes:
 * completions and chat completions, whole or as SSE chunks, with logprobs in the legacy shape
 * ({tokens, token_logprobs, top_logprobs, text_offset}) or the chat shape ({content: [{token, logprob, bytes,
 * top_logprobs}]}).
 *
 * Text is produced as bytes: each token's bytes are appended to the choice's text. A stream only sends text that
 * is final: complete UTF-8 characters, and nothing that could still turn out to be the start of a stop string.
 */
#include "server/sched.h"

#include "runtime/session_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "server/toolcall.h"

/* ST_PREEMPTED: holds its slot but no KV (the pool ran out at a decode step); its history is prefilled again
 * when the blocks are free, and it goes on as if nothing happened (recompute, as vLLM preempts) */
enum { ST_WAIT, ST_PREFILL, ST_DECODE, ST_DONE, ST_PREEMPTED };
enum { FIN_NONE, FIN_STOP, FIN_LENGTH, FIN_CANCEL };

struct srv_choice {
    srv_req *q;
    int index, prompt_i, state, finish, slot;
    moet_sampler *smp;
    int32_t *hist;           /* prompt + generated ids */
    size_t n_prompt, n_hist, n_pre;
    size_t n_target;         /* tokens the prefill runs to: the prompt, or after a preemption the whole history */
    int recompute;           /* prefilling tokens it had prefilled before a preemption */
    int32_t n_gen;
    char *text;              /* echo text + generated text, bytes */
    size_t tlen, tcap, sent, gen_start;
    json_t *lp;              /* logprobs of the tokens not yet sent (stream) or all (whole response) */
    size_t echo_off;         /* text offset of the next echoed prompt token */
    double t_last;
    int role_sent;
    int ready;               /* a distribution to sample the next token from is there: */
    int src;                 /*   -1 its session's last logit row, i >= 0 row i of the last batched step */
    const float *lg;         /*   that row on the host, NULL until something needs it (choice_logits) */
};

struct sched {
    const moet_model *m;
    const moet_tokenizer *tok;
    sched_options o;
    metrics *mx;
    int32_t vocab, n_batch;
    moet_session **slots;
    moet_batch *batch;       /* one forward for the decode tokens of all running sequences */
    moet_kv *kv;             /* the slots' shared paged KV pool */
    uint64_t hits_seen;      /* its prefix-cache hits already in the metrics */
    int64_t ec_seen[5];      /* the expert cache's counts already in the metrics */
    srv_choice **slot_owner;
    int32_t eos[16], eot[16];
    int n_eos, n_eot;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv, idle_cv;
    srv_req *head, *tail;    /* waiting: submitted, not all choices placed */
    int n_waiting;
    srv_req **running;       /* requests with a placed choice */
    int n_running, cap_running;
    int stop, draining;
    float *lsm;              /* [vocab] log-softmax scratch */
    char err[256];
};

/* ---- requests -------------------------------------------------------------------------------------------- */

srv_req *srv_req_new(oai_request *r) {
    srv_req *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->refs = 1;
    q->r = *r;
    memset(r, 0, sizeof *r);
    q->status = 200;
    q->created = (long long)time(NULL);
    q->t_arrive = moet_time_s();
    static atomic_ullong counter;
    unsigned long long k = atomic_fetch_add(&counter, 1) + 1;
    snprintf(q->id, sizeof q->id, "%s-%llx%06llx", q->r.endpoint == OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)q->created, k & 0xFFFFFF);
    return q;
}

static void choice_free(srv_choice *c) {
    moet_sampler_free(c->smp);
    free(c->hist);
    free(c->text);
    json_decref(c->lp);
    c->smp = NULL;
    c->hist = NULL;
    c->text = NULL;
    c->lp = NULL;
}

void srv_req_release(srv_req *q) {
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    int left = --q->refs;
    pthread_mutex_unlock(&q->mu);
    if (left) return;
    for (int i = 0; i < q->n_ch; i++) choice_free(&q->ch[i]);
    free(q->ch);
    oai_request_free(&q->r);
    free(q->out);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

/* Appends bytes to q's output and wakes the HTTP side. Called with q->mu not held. */
static void emit(srv_req *q, const char *p, size_t n) {
    pthread_mutex_lock(&q->mu);
    if (q->out_len + n + 1 > q->out_cap) {
        size_t cap = q->out_cap ? q->out_cap : 1024;
        while (cap < q->out_len + n + 1) cap *= 2;
        char *np = realloc(q->out, cap);
        if (!np) { pthread_mutex_unlock(&q->mu); return; }  /* the client loses this chunk; nothing crashes */
        q->out = np;
        q->out_cap = cap;
    }
    memcpy(q->out + q->out_len, p, n);
    q->out_len += n;
    q->out[q->out_len] = 0;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void emit_json(srv_req *q, json_t *j, int sse) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return;
    if (sse) emit(q, "data: ", 6);
    emit(q, s, strlen(s));
    if (sse) emit(q, "\n\n", 2);
    free(s);
}

static void finish_request(srv_req *q, int status) {
    pthread_mutex_lock(&q->mu);
    q->status = status;
    q->done = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void fail_request(srv_req *q, int status, const char *code, const char *msg) {
    oai_error e;
    oai_fail(&e, status, NULL, code, "%s", msg);
    size_t n;
    char *s = oai_error_json(&e, &n);
    if (s) {
        if (q->r.stream && q->started) {  /* headers are out: the error becomes an event */
            emit(q, "data: ", 6);
            emit(q, s, n);
            emit(q, "\n\n", 2);
        } else {
            emit(q, s, n);
        }
    }
    free(s);
    finish_request(q, status);
}

/* ---- logprobs -------------------------------------------------------------------------------------------- */

static void log_softmax(const float *l, int32_t V, float *out) {
    float mx = l[0];
    for (int32_t i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < V; i++) sum += exp((double)(l[i] - mx));
    float lse = mx + (float)log(sum);
    for (int32_t i = 0; i < V; i++) out[i] = l[i] - lse;
}

static int top_n(const float *lp, int32_t V, int n, int32_t *ids) {
    int k = 0;
    for (int32_t i = 0; i < V; i++) {
        if (k < n || lp[i] > lp[ids[k - 1]]) {
            int j = k < n ? k++ : k - 1;
            while (j > 0 && lp[ids[j - 1]] < lp[i]) { ids[j] = ids[j - 1]; j--; }
            ids[j] = i;
        }
    }
    return k;
}

static json_t *token_text(const moet_tokenizer *tok, int32_t id, int at_start, char *buf, size_t cap, int *len) {
    int b = moet_tokenizer_token_bytes(tok, id, at_start, buf, cap);
    if (b < 0) b = 0;
    *len = b;
    return oai_json_text(buf, (size_t)b);
}

static json_t *bytes_array(const char *p, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

/* Records token id (with logprob from lsm, NULL lsm: the first prompt token, no logprob) at text offset off. */
static void lp_add(sched *s, srv_choice *c, int32_t id, const float *lsm, int at_start, size_t off) {
    int chat = c->q->r.endpoint == OAI_CHAT;
    int ntop = c->q->r.logprobs;
    char buf[512];
    int len;
    json_t *t = token_text(s->tok, id, at_start, buf, sizeof buf, &len);
    int32_t ids[OAI_MAX_TOP_LOGPROBS];
    int k = lsm ? top_n(lsm, s->vocab, ntop, ids) : 0;
    if (!c->lp) {
        c->lp = chat ? json_pack("{s:[]}", "content")
                     : json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
    }
    if (chat) {
        json_t *top = json_array();
        for (int i = 0; i < k; i++) {
            char b2[512];
            int l2;
            json_t *tt = token_text(s->tok, ids[i], 0, b2, sizeof b2, &l2);
            json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", tt, "logprob", (double)lsm[ids[i]], "bytes",
                                                 bytes_array(b2, l2)));
        }
        json_array_append_new(json_object_get(c->lp, "content"),
                              json_pack("{s:o,s:f,s:o,s:o}", "token", t, "logprob", lsm ? (double)lsm[id] : 0.0, "bytes",
                                        bytes_array(buf, len), "top_logprobs", top));
        return;
    }
    json_array_append_new(json_object_get(c->lp, "tokens"), t);
    json_array_append_new(json_object_get(c->lp, "token_logprobs"), lsm ? json_real(lsm[id]) : json_null());
    json_t *top;
    if (!lsm) {
        top = json_null();
    } else {
        top = json_object();
        for (int i = 0; i < k; i++) {
            char b2[512];
            int l2;
            l2 = moet_tokenizer_token_bytes(s->tok, ids[i], 0, b2, sizeof b2);
            json_t *key = oai_json_text(b2, l2 > 0 ? (size_t)l2 : 0);
            json_object_set_new(top, json_string_value(key), json_real(lsm[ids[i]]));
            json_decref(key);
        }
        /* the chosen token is always listed (the legacy API's rule), so top_logprobs >= token_logprob holds */
        json_t *key = oai_json_text(buf, (size_t)len);
        if (!json_object_get(top, json_string_value(key))) json_object_set_new(top, json_string_value(key), json_real(lsm[id]));
        json_decref(key);
    }
    json_array_append_new(json_object_get(c->lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(c->lp, "text_offset"), json_integer((json_int_t)off));
}

/* ---- text and stops -------------------------------------------------------------------------------------- */

static int text_put(srv_choice *c, const char *p, size_t n) {
    if (c->tlen + n + 1 > c->tcap) {
        size_t cap = c->tcap ? c->tcap : 256;
        while (cap < c->tlen + n + 1) cap *= 2;
        char *np = realloc(c->text, cap);
        if (!np) return -1;
        c->text = np;
        c->tcap = cap;
    }
    memcpy(c->text + c->tlen, p, n);
    c->tlen += n;
    c->text[c->tlen] = 0;
    return 0;
}

/* Bytes at the end of the text that may not be sent yet: an incomplete UTF-8 character, or a tail that is the
 * start of a stop string. */
static size_t holdback(const srv_choice *c) {
    const oai_request *r = &c->q->r;
    size_t hold = 0, gen = c->tlen - c->gen_start;
    for (size_t i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t k = sl - 1; k > hold; k--)
            if (k <= gen && !memcmp(c->text + c->tlen - k, r->stop[i], k)) { hold = k; break; }
    }
    /* incomplete trailing UTF-8 sequence */
    size_t i = c->tlen, back = 0;
    while (i > c->gen_start && back < 4 && ((unsigned char)c->text[i - 1] & 0xC0) == 0x80) { i--; back++; }
    if (i > c->gen_start) {
        unsigned char lead = (unsigned char)c->text[i - 1];
        size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
        if (need > back + 1 && back + 1 > hold) hold = back + 1;
    }
    return hold;
}

/* Looks for a stop string in the text generated so far (from the bytes the last token could complete). */
static int find_stop(srv_choice *c, size_t added) {
    const oai_request *r = &c->q->r;
    for (size_t i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        size_t from = c->tlen - c->gen_start > added + sl ? c->tlen - added - sl + 1 : c->gen_start;
        for (size_t p = from; p + sl <= c->tlen; p++)
            if (!memcmp(c->text + p, r->stop[i], sl)) {
                c->tlen = p;
                c->text[p] = 0;
                return 1;
            }
    }
    return 0;
}

/* ---- responses ------------------------------------------------------------------------------------------- */

static const char *finish_name(int f) { return f == FIN_STOP ? "stop" : f == FIN_LENGTH ? "length" : NULL; }

static json_t *chunk_base(sched *s, srv_req *q) {
    return json_pack("{s:s,s:s,s:I,s:s,s:[]}", "id", q->id, "object",
                     q->r.endpoint == OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)q->created, "model", s->o.model_name, "choices");
}

/* Choice c's tool calls from its generated text (NULL: none), ids unique across the request's choices. */
static json_t *choice_tool_calls(const srv_choice *c, size_t *content_len) {
    char sfx[96];
    snprintf(sfx, sizeof sfx, "%s-%d", c->q->id, c->index);
    return toolcall_parse(c->text + c->gen_start, c->tlen - c->gen_start, sfx, content_len);
}

/* A chat choice's finish reason: "tool_calls" when it stopped on its own after calling tools. */
static const char *chat_finish(const srv_choice *c, const json_t *calls) {
    return calls && c->finish == FIN_STOP ? "tool_calls" : finish_name(c->finish);
}

/* Streams what is final of choice c (all of it once c finished). With tools, content stops where a tool call
 * starts; once c finished, its calls go out as one delta.tool_calls chunk, then the finish reason. */
static void stream_choice(sched *s, srv_choice *c) {
    srv_req *q = c->q;
    size_t upto = c->finish ? c->tlen : c->tlen - holdback(c);
    int chat = q->r.endpoint == OAI_CHAT;
    json_t *calls = NULL;
    if (chat && q->r.tools && c->tlen > c->gen_start) {
        const char *g = c->text + c->gen_start;
        const size_t gl = c->tlen - c->gen_start;
        size_t part, cl;
        const size_t mk = toolcall_find(g, gl, &part);
        if (c->finish) {
            if (mk < gl && (calls = choice_tool_calls(c, &cl))) upto = c->gen_start + cl;
        } else {
            const size_t lim = c->gen_start + (mk < part ? mk : part);
            if (upto > lim) upto = lim;
        }
    }
    if (upto < c->sent) upto = c->sent;
    if (chat && !c->role_sent) {
        json_t *j = chunk_base(s, q);
        json_array_append_new(json_object_get(j, "choices"),
                              json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", c->index, "delta", "role", "assistant",
                                        "content", "", "logprobs", "finish_reason"));
        if (q->r.include_usage) json_object_set_new(j, "usage", json_null());
        emit_json(q, j, 1);
        c->role_sent = 1;
    }
    if (upto == c->sent && !c->finish) return;
    json_t *lp = c->lp ? c->lp : json_null();
    c->lp = NULL;
    if (calls) { /* content left (if any), the calls, then the finish reason */
        size_t k;
        json_t *tc;
        json_array_foreach(calls, k, tc) json_object_set_new(tc, "index", json_integer((json_int_t)k));
        json_t *delta = json_pack("{s:O}", "tool_calls", calls);
        if (upto > c->sent) json_object_set_new(delta, "content", oai_json_text(c->text + c->sent, upto - c->sent));
        json_t *j = chunk_base(s, q);
        json_array_append_new(json_object_get(j, "choices"),
                              json_pack("{s:i,s:o,s:o,s:n}", "index", c->index, "delta", delta, "logprobs", lp, "finish_reason"));
        if (q->r.include_usage) json_object_set_new(j, "usage", json_null());
        emit_json(q, j, 1);
        j = chunk_base(s, q);
        json_array_append_new(json_object_get(j, "choices"),
                              json_pack("{s:i,s:{},s:n,s:s}", "index", c->index, "delta", "logprobs", "finish_reason",
                                        chat_finish(c, calls)));
        if (q->r.include_usage) json_object_set_new(j, "usage", json_null());
        emit_json(q, j, 1);
        json_decref(calls);
        c->sent = c->tlen;
        return;
    }
    json_t *j = chunk_base(s, q);
    json_t *text = oai_json_text(c->text + c->sent, upto - c->sent);
    json_t *ch;
    const char *fin = finish_name(c->finish);
    if (chat)
        ch = json_pack("{s:i,s:o,s:o,s:o}", "index", c->index, "delta",
                       upto > c->sent ? json_pack("{s:o}", "content", text) : (json_decref(text), json_object()),
                       "logprobs", lp, "finish_reason", fin ? json_string(fin) : json_null());
    else
        ch = json_pack("{s:i,s:o,s:o,s:o}", "index", c->index, "text", text, "logprobs", lp, "finish_reason",
                       fin ? json_string(fin) : json_null());
    json_array_append_new(json_object_get(j, "choices"), ch);
    if (q->r.include_usage) json_object_set_new(j, "usage", json_null());
    emit_json(q, j, 1);
    c->sent = upto;
}

static json_t *usage(srv_req *q) {
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)q->prompt_tokens, "completion_tokens",
                     (json_int_t)q->completion_tokens, "total_tokens", (json_int_t)(q->prompt_tokens + q->completion_tokens));
}

static void respond_whole(sched *s, srv_req *q) {
    int chat = q->r.endpoint == OAI_CHAT;
    json_t *choices = json_array();
    for (int i = 0; i < q->n_ch; i++) {
        srv_choice *c = &q->ch[i];
        json_t *text = oai_json_text(c->text ? c->text : "", c->tlen);
        json_t *lp = c->lp ? c->lp : json_null();
        c->lp = NULL;
        const char *fin = finish_name(c->finish);
        size_t cl = 0;
        json_t *calls = chat && q->r.tools && c->tlen > c->gen_start
                            ? choice_tool_calls(c, &cl) : NULL;
        if (calls) { /* content: what came before the calls, or null */
            json_decref(text);
            text = cl ? oai_json_text(c->text + c->gen_start, cl) : json_null();
            fin = chat_finish(c, calls);
        }
        if (calls)
            json_array_append_new(choices, json_pack("{s:i,s:{s:s,s:o,s:o},s:o,s:s?}", "index", c->index, "message",
                                                     "role", "assistant", "content", text, "tool_calls", calls,
                                                     "logprobs", lp, "finish_reason", fin));
        else if (chat)
            json_array_append_new(choices, json_pack("{s:i,s:{s:s,s:o},s:o,s:s?}", "index", c->index, "message", "role",
                                                     "assistant", "content", text, "logprobs", lp, "finish_reason", fin));
        else
            json_array_append_new(choices, json_pack("{s:i,s:o,s:o,s:s?}", "index", c->index, "text", text, "logprobs",
                                                     lp, "finish_reason", fin));
    }
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", q->id, "object", chat ? "chat.completion" : "text_completion",
                          "created", (json_int_t)q->created, "model", s->o.model_name, "choices", choices, "usage", usage(q));
    emit_json(q, j, 0);
}

static void request_finished(sched *s, srv_req *q) {
    if (atomic_load(&q->cancelled)) {
        finish_request(q, 499);
        return;
    }
    if (q->r.stream) {
        if (q->r.include_usage) {
            json_t *j = chunk_base(s, q);
            json_object_set_new(j, "usage", usage(q));
            emit_json(q, j, 1);
        }
        emit(q, "data: [DONE]\n\n", 14);
    } else {
        respond_whole(s, q);
    }
    metrics_observe(s->mx, &s->mx->e2e, moet_time_s() - q->t_arrive);
    finish_request(q, 200);
}

/* ---- stepping one sequence ------------------------------------------------------------------------------- */

static void choice_done(sched *s, srv_choice *c, int fin) {
    c->finish = fin;
    c->state = ST_DONE;
    if (c->slot >= 0) {
        s->slot_owner[c->slot] = NULL;
        moet_session_truncate(s->slots[c->slot], 0, NULL, 0); /* its KV blocks back to the pool */
    }
    c->slot = -1;
    srv_req *q = c->q;
    if (fin == FIN_CANCEL) metrics_add(s->mx, &s->mx->cancelled, 1);
    else metrics_add(s->mx, fin == FIN_STOP ? &s->mx->finished_stop : &s->mx->finished_length, 1);
    if (q->r.stream && fin != FIN_CANCEL) stream_choice(s, c);
    moet_sampler_free(c->smp);
    c->smp = NULL;
    if (++q->n_done == q->n_ch) request_finished(s, q);
}

static int is_stop_id(sched *s, srv_choice *c, int32_t id) {
    const oai_request *r = &c->q->r;
    for (size_t i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == id) return 1;
    if (r->ignore_eos) return 0;
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == id) return 1;
    if (r->endpoint == OAI_CHAT)
        for (int i = 0; i < s->n_eot; i++)
            if (s->eot[i] == id) return 1;
    return 0;
}

/* Starts choice c on slot: sampler, history, echo text. Returns -1 on failure (out of memory). */
static int choice_start(sched *s, srv_choice *c, int slot) {
    srv_req *q = c->q;
    const oai_request *r = &q->r;
    c->slot = slot;
    s->slot_owner[slot] = c;
    c->n_prompt = r->prompt_len[c->prompt_i];
    c->hist = malloc((c->n_prompt + (size_t)r->max_tokens + 1) * sizeof(int32_t));
    moet_sampler_options so = r->so;
    so.seed += (uint64_t)c->index;
    char err[256];
    if (!c->hist || moet_sampler_create(&so, s->vocab, &c->smp, err, sizeof err)) return -1;
    memcpy(c->hist, r->prompt_ids[c->prompt_i], c->n_prompt * sizeof(int32_t));
    c->n_hist = c->n_prompt;
    c->n_pre = 0;
    c->n_target = c->n_prompt;
    c->recompute = 0;
    c->state = ST_PREFILL;
    if (moet_session_truncate(s->slots[slot], 0, err, sizeof err)) return -1;
    if (r->echo) {
        char buf[512];
        for (size_t i = 0; i < c->n_prompt; i++) {
            int b = moet_tokenizer_token_bytes(s->tok, c->hist[i], i == 0, buf, sizeof buf);
            if (b > 0 && text_put(c, buf, (size_t)b)) return -1;
        }
    }
    c->gen_start = c->tlen;
    if (!q->started) {
        q->started = 1;
        q->prompt_tokens = 0;
    }
    q->prompt_tokens += c->index % r->n == 0 ? c->n_prompt : 0;  /* each prompt counted once, as OpenAI does */
    return 0;
}

/* The row c samples from, copied from the backend on first use (sessions and the batch keep only sampling
 * candidates on the host after a step). */
static const float *choice_logits(sched *s, srv_choice *c) {
    if (!c->lg) {
        if (c->src >= 0) {
            c->lg = moet_batch_logits(s->batch, c->src);
        } else {
            int32_t rows = 1;
            const float *lg = moet_session_logits(s->slots[c->slot], &rows);
            c->lg = lg + (size_t)(rows > 0 ? rows - 1 : 0) * (size_t)s->vocab; /* echo kept every row: the last */
        }
    }
    return c->lg;
}

static int32_t choice_candidates(sched *s, srv_choice *c, const int32_t **ids, const float **vals) {
    return c->src >= 0 ? moet_batch_candidates(s->batch, c->src, ids, vals)
                       : moet_session_candidates(s->slots[c->slot], ids, vals);
}

/* c's next distribution is its session's last row (src -1) or row src of the batched step just run */
static void choice_ready(srv_choice *c, int src) {
    c->ready = 1;
    c->src = src;
    c->lg = NULL;
}

/* --delta gate: a decode step whose distribution is unconfident (top-1 probability below tau) is redone on base +
 * delta for that sequence alone, and the sequence samples from the corrected logits. 0, or -1 on failure. */
static int gate_step(sched *s, srv_choice *c, moet_session *ss, int32_t id) {
    metrics_add(s->mx, &s->mx->gate_steps, 1);
    /* from the row's candidates where the step kept them (4 bytes: the row stays on the device), else the row */
    const float p = c->src >= 0 ? moet_batch_top1(s->batch, c->src) : moet_session_top1(ss);
    if (!(p < s->o.tau)) return 0;
    char err[256];
    if (moet_session_redo_delta(ss, id, err, sizeof err)) { MOET_LOGE("%s: gate: %s", c->q->id, err); return -1; }
    choice_ready(c, -1); /* the session's redone step */
    metrics_add(s->mx, &s->mx->gate_corrected, 1);
    return 0;
}

/* Tokens of KV blocks that n tokens take (whole blocks of the pool). */
static int64_t kv_round(const sched *s, int64_t n) {
    const int64_t bt = moet_kv_block_tokens(s->kv);
    return (n + bt - 1) / bt * bt;
}

/* c gives its KV blocks back and waits, keeping its slot, for the blocks of its first n_target history tokens
 * (+1) to be free; then that history is prefilled again and it goes on. */
static void preempt(sched *s, srv_choice *c, size_t n_target) {
    MOET_LOGI("%s: preempted (KV pool full): %zu tokens to recompute when blocks are free", c->q->id, n_target);
    moet_session_truncate(s->slots[c->slot], 0, NULL, 0);
    metrics_add(s->mx, &s->mx->preemptions, 1);
    c->state = ST_PREEMPTED;
    c->recompute = c->n_pre > 0 || c->recompute; /* what it had prefilled was counted once */
    c->n_pre = 0;
    c->n_target = n_target;
    c->ready = 0;
    c->lg = NULL;
}

/* One prefill chunk of c; after the last, c's next token can be sampled from its session's last logits row. */
static void choice_prefill(sched *s, srv_choice *c) {
    srv_req *q = c->q;
    const oai_request *r = &q->r;
    moet_session *ss = s->slots[c->slot];
    char err[256];
    if (c->state == ST_PREFILL) {
        const int resumed = c->recompute; /* prefilling again after a preemption: the prompt's echo,
                                             * logprobs and counts were done the first time */
        int want_lp = r->echo && r->logprobs >= 0 && !resumed;
        size_t n = c->n_target - c->n_pre;
        if (n > (size_t)s->n_batch) n = (size_t)s->n_batch;
        const int erc = moet_session_eval(ss, c->hist + c->n_pre, (int32_t)n,
                                          want_lp ? MOET_LOGITS_ALL : MOET_LOGITS_LAST, err, sizeof err);
        if (erc == MOET_ENOMEM && !want_lp) { /* others took the blocks first: wait for them, then start over */
            preempt(s, c, c->n_target);
            return;
        }
        if (erc) {
            MOET_LOGE("%s: prefill: %s", q->id, err);
            choice_done(s, c, FIN_LENGTH);
            return;
        }
        if (want_lp) {
            /* row i of the chunk holds the distribution of prompt token n_pre + i + 1 */
            const float *lg = moet_session_logits(ss, NULL);
            char buf[512];
            for (size_t i = 0; i < n; i++) {
                size_t pos = c->n_pre + i;
                if (pos == 0) {
                    lp_add(s, c, c->hist[0], NULL, 1, 0);
                    int b = moet_tokenizer_token_bytes(s->tok, c->hist[0], 1, buf, sizeof buf);
                    c->echo_off = b > 0 ? (size_t)b : 0;
                }
                if (pos + 1 >= c->n_prompt) break;
                log_softmax(lg + i * (size_t)s->vocab, s->vocab, s->lsm);
                lp_add(s, c, c->hist[pos + 1], s->lsm, 0, c->echo_off);
                int b = moet_tokenizer_token_bytes(s->tok, c->hist[pos + 1], 0, buf, sizeof buf);
                c->echo_off += b > 0 ? (size_t)b : 0;
            }
        }
        c->n_pre += n;
        metrics_add(s->mx, resumed ? &s->mx->recomputed_tokens : &s->mx->prompt_tokens, n);
        if (c->n_pre == c->n_target) {
            choice_ready(c, -1);
            /* the gate decides every step a token is sampled from, the prompt's last included (its earlier
             * positions stay on the base experts: prefill is not redone token by token) */
            if (s->o.delta_mode == 2 && r->max_tokens != 0 && gate_step(s, c, ss, c->hist[c->n_target - 1])) {
                choice_done(s, c, FIN_LENGTH);
                return;
            }
            c->state = ST_DECODE;
            if (!resumed) c->t_last = moet_time_s();
            if (r->max_tokens == 0) choice_done(s, c, FIN_LENGTH);
        }
    }
}

/* Samples c's next token from its distribution (choice_ready), emits it, and returns it for the next forward, or -1 when c finished. */
static int32_t choice_sample(sched *s, srv_choice *c) {
    srv_req *q = c->q;
    const oai_request *r = &q->r;
    moet_session *ss = s->slots[c->slot];
    int full_hist = r->so.repetition_penalty != 1.0f;
    const int32_t *hist = full_hist ? c->hist : c->hist + c->n_prompt;
    const size_t n_hist = full_hist ? c->n_hist : c->n_hist - c->n_prompt;
    /* from the step's candidates where they decide exactly (moet_sampler_sample_candidates), else the whole row;
     * logprobs need the row anyway */
    const int32_t *cid;
    const float *cval;
    const int32_t kc = r->logprobs >= 0 ? 0 : choice_candidates(s, c, &cid, &cval);
    int32_t id = kc > 0 ? moet_sampler_sample_candidates(c->smp, cid, cval, kc, hist, n_hist) : -1;
    if (id < 0) id = moet_sampler_sample(c->smp, choice_logits(s, c), hist, n_hist);
    double now = moet_time_s();
    if (c->n_gen == 0) metrics_observe(s->mx, &s->mx->ttft, now - q->t_arrive);
    else metrics_observe(s->mx, &s->mx->itl, now - c->t_last);
    c->t_last = now;
    if (is_stop_id(s, c, id)) {
        choice_done(s, c, FIN_STOP);
        return -1;
    }
    c->hist[c->n_hist++] = id;
    c->n_gen++;
    q->completion_tokens++;
    metrics_add(s->mx, &s->mx->generation_tokens, 1);
    char buf[512];
    int b = moet_tokenizer_token_bytes(s->tok, id, 0, buf, sizeof buf);
    size_t off = c->tlen;
    if (b > 0) text_put(c, buf, (size_t)b);
    if (r->logprobs >= 0) {
        log_softmax(choice_logits(s, c), s->vocab, s->lsm);
        lp_add(s, c, id, s->lsm, 0, off);
    }
    if (r->n_stop && find_stop(c, b > 0 ? (size_t)b : 0)) {
        choice_done(s, c, FIN_STOP);
        return -1;
    }
    if (c->n_gen >= r->max_tokens || moet_session_pos(ss) >= s->o.n_ctx) {
        choice_done(s, c, FIN_LENGTH);
        return -1;
    }
    if (r->stream) stream_choice(s, c);
    c->ready = 0;
    c->lg = NULL;
    return id;
}

/* Each of n sequences' tokens in its own forward (each samples from its session's logits). */
static void feed_each(sched *s, srv_choice **cs, moet_session **ss, int32_t *ids, int n) {
    char err[256];
    for (int i = 0; i < n; i++) {
        const int rc = moet_session_eval(ss[i], &ids[i], 1, MOET_LOGITS_LAST, err, sizeof err);
        if (rc) { MOET_LOGE("%s: decode: %s", cs[i]->q->id, err); choice_done(s, cs[i], FIN_LENGTH); continue; }
        choice_ready(cs[i], -1);
        if (s->o.delta_mode == 2 && gate_step(s, cs[i], ss[i], ids[i])) choice_done(s, cs[i], FIN_LENGTH);
    }
}

/* Feeds the sampled tokens of n sequences: one batched forward (one when n = 1), then each samples from its row. */
static void feed(sched *s, srv_choice **cs, int32_t *ids, int n) {
    char err[256];
    moet_session *ss[256];
    for (int i = 0; i < n; i++) ss[i] = s->slots[cs[i]->slot];
    int rc, k = 0;
    for (int i = 0; i < n; i++) { /* each row's KV block for this token; a sequence the pool cannot extend now
                                    * is preempted (recomputed later), or ends when the whole pool is too small */
        rc = moet_session_reserve(ss[i], 1, err, sizeof err);
        if (rc) {
            srv_choice *c = cs[i];
            if (rc != MOET_ENOMEM || kv_round(s, (int64_t)c->n_hist + 1) > moet_kv_tokens(s->kv)) {
                MOET_LOGE("%s: decode: %s", c->q->id, err);
                choice_done(s, c, FIN_LENGTH);
                continue;
            }
            preempt(s, c, c->n_hist); /* the token just sampled included: its logits row is the next step's */
            continue;
        }
        cs[k] = cs[i];
        ss[k] = ss[i];
        ids[k++] = ids[i];
    }
    n = k;
    if (n == 0) return;
    if (n == 1 || !s->batch) {
        feed_each(s, cs, ss, ids, n);
        return;
    }
    rc = moet_batch_decode(s->batch, ss, ids, n, err, sizeof err);
    if (rc == MOET_ENOMEM) {
        /* memory a batched step needs and one sequence's may not (the expert cache's slots cannot hold what n rows
         * route to): this step a sequence at a time (the failed step left every session as it was) */
        MOET_LOGW("batched decode of %d sequences: %s; one at a time this step", n, err);
        feed_each(s, cs, ss, ids, n);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (rc) { MOET_LOGE("%s: batched decode: %s", cs[i]->q->id, err); choice_done(s, cs[i], FIN_LENGTH); continue; }
        choice_ready(cs[i], i);
        if (s->o.delta_mode == 2 && gate_step(s, cs[i], ss[i], ids[i])) choice_done(s, cs[i], FIN_LENGTH);
    }
}

/* ---- the loop -------------------------------------------------------------------------------------------- */

static int free_slot(sched *s) {
    for (int i = 0; i < s->o.max_seqs; i++)
        if (!s->slot_owner[i]) return i;
    return -1;
}

static void running_add(sched *s, srv_req *q) {
    if (s->n_running == s->cap_running) {
        int cap = s->cap_running ? 2 * s->cap_running : 16;
        srv_req **nr = realloc(s->running, (size_t)cap * sizeof *nr);
        if (!nr) return;  /* cannot happen before a slot-sized array is full; the request then waits */
        s->running = nr;
        s->cap_running = cap;
    }
    s->running[s->n_running++] = q;
}

/* Places waiting choices on free slots, in arrival order; drops timed-out and cancelled waiters. Called with
 * s->mu held. */
static void admit(sched *s) {
    double now = moet_time_s();
    int preempted = 0; /* a preempted sequence gets the free blocks before any new request */
    int64_t promised = 0; /* KV tokens the choices placed here will take */
    for (int i = 0; i < s->o.max_seqs; i++) preempted |= s->slot_owner[i] && s->slot_owner[i]->state == ST_PREEMPTED;
    srv_req **pp = &s->head;
    while (*pp) {
        srv_req *q = *pp;
        if (!q->started && (atomic_load(&q->cancelled) ||
                            (s->o.queue_timeout > 0 && now - q->t_arrive > s->o.queue_timeout))) {
            *pp = q->next;
            s->n_waiting--;
            if (atomic_load(&q->cancelled)) finish_request(q, 499);
            else fail_request(q, 503, "queue_timeout", "timed out waiting for a free sequence slot");
            srv_req_release(q);
            continue;
        }
        int placed_all = 1;
        for (int i = 0; i < q->n_ch; i++) {
            srv_choice *c = &q->ch[i];
            if (c->state != ST_WAIT) continue;
            int slot = free_slot(s);
            if (slot < 0) { placed_all = 0; break; }
            /* the prompt's KV blocks (and its first generated token's) must be free: else it waits for running
             * sequences to give theirs back, or fails when the whole pool could not hold it */
            const int64_t need = kv_round(s, (int64_t)q->r.prompt_len[c->prompt_i] + 1);
            if (need > moet_kv_tokens(s->kv)) {
                if (!q->started) {
                    *pp = q->next;
                    s->n_waiting--;
                    char msg[160];
                    snprintf(msg, sizeof msg, "the prompt's %lld tokens need more KV cache than the server's pool "
                             "holds (%d tokens: --kv-tokens)", (long long)q->r.prompt_len[c->prompt_i],
                             moet_kv_tokens(s->kv));
                    fail_request(q, 400, "context_length_exceeded", msg);
                    srv_req_release(q);
                    goto next_request;
                }
                c->slot = -1;
                choice_done(s, c, FIN_LENGTH);
                continue;
            }
            if (preempted || promised + need > moet_kv_free_tokens(s->kv)) { placed_all = 0; break; }
            promised += need; /* its prefill takes them (after any prefix-cache blocks it can share) */
            if (!q->started) running_add(s, q);  /* the queue's reference moves to the running set */
            if (choice_start(s, c, slot)) {
                MOET_LOGE("%s: cannot start a sequence (out of memory)", q->id);
                q->started = 1;
                choice_done(s, c, FIN_LENGTH);
            }
        }
        if (!placed_all) break;  /* FIFO: the requests behind one that could not be placed keep waiting */
        *pp = q->next;
        s->n_waiting--;
    next_request:;
    }
    s->tail = NULL;
    for (srv_req *q = s->head; q; q = q->next) s->tail = q;
}

static void *sched_main(void *arg) {
    sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        admit(s);
        if (s->n_running == 0) {
            metrics_gauges(s->mx, s->n_waiting, 0);
            pthread_cond_broadcast(&s->idle_cv);
            if (s->stop && !s->head) break;
            if (s->head) {  /* waiting only on timeouts: poll */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50 * 1000 * 1000;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            } else {
                pthread_cond_wait(&s->cv, &s->mu);
            }
            continue;
        }
        int n_seq = 0;
        for (int i = 0; i < s->o.max_seqs; i++) n_seq += s->slot_owner[i] != NULL;
        metrics_gauges(s->mx, s->n_waiting, n_seq);
        pthread_mutex_unlock(&s->mu);

        /* one step: prefill chunks; then every decoding sequence samples, and the ones that go on are fed together */
        srv_choice *fc[256];
        int32_t fid[256];
        int nf = 0;
        for (int i = 0; i < s->o.max_seqs; i++) {
            srv_choice *c = s->slot_owner[i];
            if (!c) continue;
            if (atomic_load(&c->q->cancelled)) { choice_done(s, c, FIN_CANCEL); continue; }
            if (c->state == ST_PREEMPTED) {
                if (kv_round(s, (int64_t)c->n_target + 1) <= moet_kv_free_tokens(s->kv))
                    c->state = ST_PREFILL; /* its blocks are free again: recompute its history (what the prefix
                                            * cache still holds of it is shared, not recomputed) */
            }
            if (c->state == ST_PREFILL) choice_prefill(s, c);
        }
        for (int i = 0; i < s->o.max_seqs; i++) {
            srv_choice *c = s->slot_owner[i];
            if (!c || c->state != ST_DECODE || !c->ready) continue;
            const int32_t id = choice_sample(s, c);
            if (id >= 0) { fc[nf] = c; fid[nf++] = id; }
        }
        if (nf) feed(s, fc, fid, nf);
        { /* the pool's hit counter into the metrics (a counter: only its growth is added) */
            const uint64_t hits = moet_kv_hit_tokens(s->kv);
            if (hits > s->hits_seen) metrics_add(s->mx, &s->mx->prefix_hit_tokens, hits - s->hits_seen);
            s->hits_seen = hits;
            int64_t ec[5]; /* the expert cache's counts likewise */
            moet_model_expert_cache_stats(s->m, &ec[0], &ec[1], &ec[2]);
            moet_model_expert_cache_uses(s->m, &ec[3], &ec[4]);
            uint64_t *const dst[5] = {&s->mx->expert_fetched, &s->mx->expert_evicted, &s->mx->expert_replays,
                                      &s->mx->expert_uses, &s->mx->expert_misses};
            for (int i = 0; i < 5; i++) {
                if (ec[i] > s->ec_seen[i]) metrics_add(s->mx, dst[i], (uint64_t)(ec[i] - s->ec_seen[i]));
                s->ec_seen[i] = ec[i];
            }
        }

        pthread_mutex_lock(&s->mu);
        /* requests whose choices all finished leave the running set */
        int k = 0;
        for (int i = 0; i < s->n_running; i++) {
            srv_req *q = s->running[i];
            if (q->n_done == q->n_ch) srv_req_release(q);
            else s->running[k++] = q;
        }
        s->n_running = k;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int sched_submit(sched *s, srv_req *q) {
    pthread_mutex_lock(&s->mu);
    if (s->draining || s->stop) { pthread_mutex_unlock(&s->mu); return 503; }
    if (s->n_waiting >= s->o.queue_cap) { pthread_mutex_unlock(&s->mu); return 429; }
    int n = (int)(q->r.n_prompts * (size_t)q->r.n);
    q->ch = calloc((size_t)n, sizeof *q->ch);
    if (!q->ch) { pthread_mutex_unlock(&s->mu); return 503; }
    q->n_ch = n;
    for (int i = 0; i < n; i++) {
        q->ch[i].q = q;
        q->ch[i].index = i;
        q->ch[i].prompt_i = i / q->r.n;
        q->ch[i].slot = -1;
    }
    pthread_mutex_lock(&q->mu);
    q->refs++;
    pthread_mutex_unlock(&q->mu);
    q->next = NULL;
    if (s->tail) s->tail->next = q;
    else s->head = q;
    s->tail = q;
    s->n_waiting++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void sched_wait_idle(sched *s) {
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    while (s->head || s->n_running) pthread_cond_wait(&s->idle_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* End-of-turn tokens of the chat formats moet knows: a chat reply ends at its turn's end even where
 * generation_config lists only the document end. */
static const char *const eot_names[] = {"<|im_end|>", "<|eot_id|>", "<|end|>", "<|return|>", "<|call|>", "<|eom_id|>",
                                        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "<|user|>",
                                        "<|observation|>", "</s>", "<|endoftext|>", NULL};

int sched_create(const moet_model *m, const sched_options *o, metrics *mx, sched **out, char *err, size_t errlen) {
    *out = NULL;
    sched *s = calloc(1, sizeof *s);
    if (!s) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    s->m = m;
    s->o = *o;
    s->mx = mx;
    s->tok = moet_model_tokenizer(m);
    moet_model_info info;
    moet_model_info_get(m, &info);
    s->vocab = info.vocab_size;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    s->n_eos = moet_model_eos_ids(m, s->eos, 16);
    for (int i = 0; eot_names[i] && s->n_eot < 16; i++) {
        int32_t id = moet_tokenizer_token_id(s->tok, eot_names[i]);
        if (id >= 0) s->eot[s->n_eot++] = id;
    }
    s->slots = calloc((size_t)o->max_seqs, sizeof *s->slots);
    s->slot_owner = calloc((size_t)o->max_seqs, sizeof *s->slot_owner);
    s->lsm = malloc((size_t)s->vocab * sizeof(float));
    if (!s->slots || !s->slot_owner || !s->lsm) {
        sched_free(s);
        return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    }
    /* one paged KV pool for every slot: a sequence holds the blocks it uses, so the pool can be far smaller than
     * max_seqs x n_ctx (admit() waits for a prompt's blocks; a decode step that finds none left ends that sequence
     * with finish_reason "length") */
    moet_kv_options ko = moet_kv_default_options();
    const int64_t all = (int64_t)o->max_seqs * o->n_ctx;
    ko.n_tokens = o->kv_tokens > 0 ? o->kv_tokens : all > INT32_MAX ? INT32_MAX : (int32_t)all;
    if (o->kv_block > 0) ko.block_tokens = o->kv_block;
    ko.type = o->kv_type;
    ko.prefix_cache = !o->no_prefix_cache;
    int krc = moet_kv_create(m, &ko, &s->kv, err, errlen);
    if (krc) {
        sched_free(s);
        return krc;
    }
    moet_session_options so = moet_session_default_options();
    so.n_ctx = o->n_ctx;
    so.kv = s->kv;
    so.n_candidates = 64; /* a decode step copies 64 candidates a row (and lz, the gate's confidence); whole rows
                           * only for logprobs or sampling options the candidates cannot decide
                           * (moet_sampler_sample_candidates) */
    s->n_batch = so.n_batch < o->n_ctx ? so.n_batch : o->n_ctx;
    for (int i = 0; i < o->max_seqs; i++) {
        int rc = moet_session_create(m, &so, &s->slots[i], err, errlen);
        if (rc) {
            sched_free(s);
            return rc;
        }
        if (o->delta_mode == 1) moet_session_use_delta(s->slots[i], 1);
        if (o->delta_mode && (rc = moet_session_set_delta_pick(s->slots[i], o->delta_pick, err, errlen))) {
            sched_free(s);
            return rc;
        }
    }
    if (o->max_seqs > 1 && moet_batch_create(m, o->max_seqs, o->n_ctx, &s->batch, err, errlen)) {
        sched_free(s);
        return MOET_ENOMEM;
    }
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        sched_free(s);
        return moet_err(err, errlen, MOET_ENOMEM, "cannot start the scheduler thread");
    }
    *out = s;
    return MOET_OK;
}

void sched_free(sched *s) {
    if (!s) return;
    if (s->thread) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    moet_batch_free(s->batch);
    for (int i = 0; s->slots && i < s->o.max_seqs; i++) moet_session_free(s->slots[i]);
    moet_kv_free(s->kv);
    free(s->slots);
    free(s->slot_owner);
    free(s->running);
    free(s->lsm);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->idle_cv);
    free(s);
}
