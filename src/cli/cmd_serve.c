/*
 * cmd_serve.c — `moet serve`: the OpenAI-compatible HTTP server (src/server/).
 *
 * Order of events: listen first (so /health answers 503 "loading" while the weights load), load the model and its
 * chat template, create the scheduler with --max-seqs sessions, then serve until SIGTERM/SIGINT. On the signal new
 * requests get 503, in-flight ones finish, and the process exits 0. Signals are taken by sigwait in the main thread
 * (blocked everywhere else), so no handler runs inside the server's threads.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "core/util.h"
#include "server/http.h"
#include "server/jinja.h"

static void usage(void) {
    fprintf(stderr,
            "usage: moet serve [-m MODEL] [--host 127.0.0.1] [--port 8000] [--api-key KEY | --api-key-file F]\n"
            "                  [--max-seqs N] [--ctx N] [--kv-tokens N] [--kv-block N] [--no-prefix-cache] [--queue N] [--timeout S]\n"
            "                  [--max-body BYTES]\n"
            "                  [--served-model-name NAME] [-t THREADS] [--device cpu|cuda[:N]]\n"
            "  --max-seqs  sequences in the running batch (sessions; default 4)\n"
            "  --ctx       context per sequence, prompt + output (default: min(model, 4096))\n"
            "  --kv-tokens the paged KV cache shared by all sequences, in tokens (default: max-seqs x ctx); a\n"
            "              request waits until its prompt's blocks are free\n"
            "  --kv-block  tokens a KV block (a power of two; default 32)\n"
            "  --no-prefix-cache  do not share the KV blocks of equal prompt prefixes between requests\n"
            "  --queue     requests that may wait for a sequence slot; beyond it: 429 (default 64)\n"
            "  --timeout   seconds a request may wait for a slot before 503 (default 600; 0: forever)\n"
            "  --delta     off|on|gate|pick with a delta pack (--delta-file, default X.delta.gguf beside a pack X.gguf):\n"
            "              pick (default) runs base + delta on the picks of at least --delta-pick R (0.8) x the token's\n"
            "              mean routing weight; gate redoes a decode step on base + delta when its top-1 probability\n"
            "              < --tau (0.6); on: base + delta on every pick\n");
}

static const char *base_name(const char *p) {
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    static char buf[256];
    size_t s = n;
    while (s > 0 && p[s - 1] != '/') s--;
    snprintf(buf, sizeof buf, "%.*s", (int)(n - s), p + s);
    return buf;
}

int cmd_serve(int argc, char **argv) {
    cli_common c = {0};
    const char *host = "127.0.0.1", *api_key = NULL, *api_key_file = NULL, *name = NULL;
    long port = 8000, max_seqs = 4, ctx = 0, queue = 64, timeout = 600, max_body = 8 << 20, kv_tokens = 0,
         kv_block = 32;
    const char *delta_mode = NULL;
    int no_prefix = 0;
    double tau = 0.6;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v = NULL;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
#define INT(dst, lo, hi) do { VAL(); if (cli_parse_int(v, lo, hi, &dst)) { \
        fprintf(stderr, "moet serve: %s needs an integer in [%ld, %ld]\n", a, (long)(lo), (long)(hi)); return 2; } } while (0)
        if (!strcmp(a, "--host")) { VAL(); host = v; }
        else if (!strcmp(a, "--port")) INT(port, 0, 65535);
        else if (!strcmp(a, "--api-key")) { VAL(); api_key = v; }
        else if (!strcmp(a, "--api-key-file")) { VAL(); api_key_file = v; }
        else if (!strcmp(a, "--max-seqs")) INT(max_seqs, 1, 256);
        else if (!strcmp(a, "--ctx")) INT(ctx, 16, 1 << 22);
        else if (!strcmp(a, "--kv-tokens")) INT(kv_tokens, 16, INT32_MAX);
        else if (!strcmp(a, "--kv-block")) INT(kv_block, 1, 1 << 16);
        else if (!strcmp(a, "--no-prefix-cache")) no_prefix = 1;
        else if (!strcmp(a, "--queue")) INT(queue, 0, 1 << 20);
        else if (!strcmp(a, "--timeout")) INT(timeout, 0, 1 << 24);
        else if (!strcmp(a, "--max-body")) INT(max_body, 1024, 1L << 30);
        else if (!strcmp(a, "--served-model-name")) { VAL(); name = v; }
        else if (!strcmp(a, "--delta")) { VAL(); delta_mode = v; }
        else if (!strcmp(a, "--tau")) {
            VAL();
            if (cli_parse_float(v, &tau) || !(tau >= 0 && tau <= 1)) { fprintf(stderr, "moet serve: --tau needs a number in [0, 1]\n"); return 2; }
        }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else { fprintf(stderr, "moet serve: unknown option '%s'\n", a); usage(); return 2; }
#undef INT
#undef VAL
    }
    if (api_key && api_key_file) { fprintf(stderr, "moet serve: give --api-key or --api-key-file, not both\n"); return 2; }
    char *key_buf = NULL;
    if (api_key_file) {
        size_t n;
        char err[256];
        if (moet_file_read_all(api_key_file, 4096, &key_buf, &n, err, sizeof err)) {
            fprintf(stderr, "moet serve: %s\n", err);
            return 1;
        }
        while (n && (key_buf[n - 1] == '\n' || key_buf[n - 1] == '\r' || key_buf[n - 1] == ' ')) key_buf[--n] = 0;
        if (!n) { fprintf(stderr, "moet serve: %s is empty\n", api_key_file); free(key_buf); return 1; }
        api_key = key_buf;
    }

    /* every thread created from here on inherits the blocked set; the main thread takes the signals */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    static moet_server srv;
    memset(&srv, 0, sizeof srv);
    atomic_store(&srv.state, SERVER_LOADING);
    srv.api_key = api_key;
    srv.max_body = (size_t)max_body;
    srv.max_conns = (int)(max_seqs + queue + 64);
    metrics_init(&srv.mx);
    char err[512];
    int rc = 1;
    moet_model *m = NULL;
    jinja_template *tmpl = NULL;
    char *bos = NULL, *eos = NULL;
    if (http_start(&srv, host, (int)port, err, sizeof err)) {
        fprintf(stderr, "moet serve: %s\n", err);
        goto out;
    }
    fprintf(stderr, "moet serve: listening on http://%s:%d (loading the model)\n", host, srv.port);

    if (delta_mode && strcmp(delta_mode, "off") && strcmp(delta_mode, "on") && strcmp(delta_mode, "gate") &&
        strcmp(delta_mode, "pick")) {
        fprintf(stderr, "moet serve: --delta " CLI_DELTA_MODES "\n");
        goto out;
    }
    if (delta_mode && !strcmp(delta_mode, "off") && !c.delta_file) c.delta_file = ""; /* no use loading it */
    if (!(m = cli_load_model(&c))) goto out;
    moet_model_info info;
    moet_model_info_get(m, &info);
    const int dmode = cli_delta_mode("serve", delta_mode, &info); /* CLI_DELTA_* */
    if (dmode < 0) goto out;
    delta_mode = cli_delta_names[dmode];
    const char *tsrc = moet_model_chat_template(m);
    if (tsrc && !(tmpl = jinja_compile(tsrc, strlen(tsrc), err, sizeof err)))
        MOET_LOGW("the model's chat template does not compile (chat completions disabled): %s", err);
    const moet_tokenizer *tok = moet_model_tokenizer(m);
    int32_t eos_ids[4];
    char tb[256];
    int bl;
    if (moet_model_eos_ids(m, eos_ids, 4) > 0 && (bl = moet_tokenizer_token_bytes(tok, eos_ids[0], 0, tb, sizeof tb)) > 0)
        eos = strndup(tb, (size_t)bl);
    int32_t bos_id = moet_tokenizer_token_id(tok, "<s>");
    if (bos_id < 0) bos_id = moet_tokenizer_token_id(tok, "<|begin_of_text|>");
    if (bos_id >= 0 && (bl = moet_tokenizer_token_bytes(tok, bos_id, 0, tb, sizeof tb)) > 0) bos = strndup(tb, (size_t)bl);

    int32_t n_ctx = ctx ? (int32_t)ctx : (info.max_positions < 4096 ? info.max_positions : 4096);
    if (n_ctx > info.max_positions) {
        fprintf(stderr, "moet serve: --ctx %d exceeds the model's %d positions\n", n_ctx, info.max_positions);
        goto out;
    }
    const char *model_name = name ? name : base_name(c.model ? c.model : MOET_DEFAULT_MODEL_DIR);
    srv.oc = (oai_ctx){.tok = tok, .tmpl = tmpl, .model_name = model_name, .n_ctx = n_ctx, .vocab = info.vocab_size,
                       .bos_token = bos, .eos_token = eos};
    sched_options so = {.max_seqs = (int)max_seqs, .n_ctx = n_ctx, .queue_cap = (int)queue,
                        .queue_timeout = (double)timeout, .model_name = model_name,
                        .delta_mode = dmode == CLI_DELTA_PICK ? 1 : dmode, /* sched: pick is on with R */
                        .tau = (float)tau,
                        .delta_pick = (float)(c.delta_pick_set ? c.delta_pick
                                                               : dmode == CLI_DELTA_PICK ? CLI_DELTA_PICK_DEFAULT : 0.0),
                        .kv_tokens = (int32_t)kv_tokens, .kv_block = (int32_t)kv_block,
                        .no_prefix_cache = no_prefix, .kv_type = c.kv_type};
    if (sched_create(m, &so, &srv.mx, &srv.sched, err, sizeof err)) {
        fprintf(stderr, "moet serve: %s\n", err);
        goto out;
    }
    atomic_store(&srv.state, SERVER_READY);
    fprintf(stderr, "moet serve: ready: model '%s' (%s), %ld sequences of %d tokens, KV pool %ld tokens (%s) in blocks "
                    "of %ld, chat template %s, API key %s, delta %s\n", model_name, info.backend, max_seqs, n_ctx,
            kv_tokens ? kv_tokens : max_seqs * n_ctx, cli_kv_type_name(c.kv_type ? c.kv_type : MOET_KV_F32), kv_block,
            tmpl ? "yes" : "none",
            api_key ? "required" : "off", delta_mode);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "moet serve: %s: finishing in-flight requests\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    atomic_store(&srv.state, SERVER_DRAINING);
    sched_wait_idle(srv.sched);
    /* the last bytes of finished streams are still being written: let their connections complete */
    for (int i = 0; i < 3000 && atomic_load(&srv.active) > 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    rc = 0;
out:
    http_stop(&srv);  /* joins the connection threads: nothing uses the scheduler after this */
    sched_free(srv.sched);
    jinja_free(tmpl);
    free(bos);
    free(eos);
    moet_model_free(m);
    metrics_destroy(&srv.mx);
    free(key_buf);
    if (rc == 0) fprintf(stderr, "moet serve: stopped\n");
    return rc;
}
