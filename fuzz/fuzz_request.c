/* fuzz_request.c — libFuzzer target: arbitrary bytes as a /v1/completions and a /v1/chat/completions body, parsed
 * against the embedded model's tokenizer and chat template. Must never crash or leak; an accepted request must be
 * one the scheduler can run (every prompt within the context, max_tokens resolved, ids inside the vocabulary).
 * The same bytes as a model's reply go through the tool-call parser: calls found must be well-formed and the content
 * before them inside the text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "moet.h"
#include "server/oai.h"
#include "server/toolcall.h"

static oai_ctx g_ctx;
static moet_tokenizer *g_tok;
static jinja_template *g_tmpl;

static void setup(void) {
    char err[512];
    if (moet_tokenizer_load(MOET_FUZZ_MODEL "/tokenizer.json", &g_tok, err, sizeof err)) abort();
    json_t *cfg = json_load_file(MOET_FUZZ_MODEL "/tokenizer_config.json", 0, NULL);
    const char *src = json_string_value(json_object_get(cfg, "chat_template"));
    if (!src || !(g_tmpl = jinja_compile(src, strlen(src), err, sizeof err))) abort();
    json_decref(cfg);
    g_ctx = (oai_ctx){.tok = g_tok, .tmpl = g_tmpl, .model_name = "moe-mini-a", .n_ctx = 256,
                      .vocab = moet_tokenizer_vocab_size(g_tok), .bos_token = "", .eos_token = "<|endoftext|>"};
}

static void tool_calls(const uint8_t *data, size_t size) {
    size_t cl = (size_t)-1;
    json_t *calls = toolcall_parse((const char *)data, size, "fuzz", &cl);
    size_t part, first = toolcall_find((const char *)data, size, &part);
    if (first > size || part > size) abort();
    if (!calls) return;
    if (cl > first) abort();
    if (cl > size || !json_is_array(calls) || !json_array_size(calls)) abort();
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
        json_t *fn = json_object_get(c, "function");
        if (!json_is_string(json_object_get(c, "id")) || !json_is_string(json_object_get(fn, "name")) ||
            !json_is_string(json_object_get(fn, "arguments")))
            abort();
    }
    json_decref(calls);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok) setup();
    tool_calls(data, size);
    for (int ep = 0; ep < 2; ep++) {
        oai_request r;
        oai_error e;
        if (oai_request_parse(&g_ctx, ep, (const char *)data, size, &r, &e)) {
            if (e.status < 400 || e.status > 599 || !e.message[0]) abort();
            size_t n;
            char *j = oai_error_json(&e, &n);
            if (!j) abort();
            free(j);
            continue;
        }
        if (r.n_prompts == 0 || r.max_tokens < 0 || r.n < 1) abort();
        for (size_t i = 0; i < r.n_prompts; i++) {
            if (r.prompt_len[i] == 0 || r.prompt_len[i] >= (size_t)g_ctx.n_ctx) abort();
            for (size_t k = 0; k < r.prompt_len[i]; k++)
                if (r.prompt_ids[i][k] < 0 || r.prompt_ids[i][k] >= g_ctx.vocab) abort();
        }
        oai_request_free(&r);
    }
    return 0;
}
