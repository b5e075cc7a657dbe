/*
 * oai.h — the OpenAI API's request and error shapes: a request body becomes an oai_request (token ids, sampling,
 * stops, logprobs, streaming), or an oai_error with the status, type, param and message a client expects.
 * Parsing is strict the way the OpenAI API is: wrong types and out-of-range values are 400 with the parameter
 * named; fields that would change the output but that moet does not implement are refused, not ignored.
 */
#ifndef MOET_SERVER_OAI_H
#define MOET_SERVER_OAI_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "moet.h"
#include "server/jinja.h"

enum { OAI_COMPLETIONS = 0, OAI_CHAT = 1 };

#define OAI_MAX_N 16          /* choices per request */
#define OAI_MAX_PROMPTS 64    /* prompts in one completions request */
#define OAI_MAX_STOPS 16
#define OAI_MAX_TOP_LOGPROBS 20

typedef struct {
    int status;          /* HTTP status */
    const char *type;    /* "invalid_request_error", "authentication_error", ... */
    const char *code;    /* NULL or a machine-readable code, e.g. "context_length_exceeded" */
    char param[64];
    char message[512];
} oai_error;

/* Sets e and returns -1. */
int oai_fail(oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error": {"message", "type", "param", "code"}} as malloc'd text. */
char *oai_error_json(const oai_error *e, size_t *len);

/* What request parsing needs to know about the served model. */
typedef struct {
    const moet_tokenizer *tok;
    const jinja_template *tmpl;  /* NULL: the model has no chat template (chat requests are 400) */
    const char *model_name;
    int32_t n_ctx;               /* a sequence's context: prompt + generated tokens */
    int32_t vocab;
    const char *bos_token, *eos_token;  /* texts the chat template sees */
} oai_ctx;

typedef struct {
    int endpoint;
    int stream, include_usage, echo, ignore_eos;
    int tools;                   /* chat with a non-empty 'tools' and tool_choice not "none": replies are parsed for calls */
    size_t n_prompts;
    int32_t **prompt_ids;        /* [n_prompts] */
    size_t *prompt_len;
    int32_t max_tokens;          /* resolved: what may be generated per choice (>= 0) */
    int n;                       /* choices per prompt */
    moet_sampler_options so;
    int logprobs;                /* -1: none; else the number of top alternatives per token (0..20) */
    char **stop;                 /* stop strings */
    size_t n_stop;
    int32_t *stop_ids;           /* stop token ids (stop_token_ids, or integers in stop) */
    size_t n_stop_ids;
} oai_request;

/* Parses a /v1/completions (endpoint OAI_COMPLETIONS) or /v1/chat/completions body. On error returns -1 with e set
 * (r is left empty); on success the caller frees r with oai_request_free. */
int oai_request_parse(const oai_ctx *c, int endpoint, const char *body, size_t len, oai_request *r, oai_error *e);
void oai_request_free(oai_request *r);

/* Renders messages (+ tools, + chat_template_kwargs) with the chat template into prompt text (malloc'd). */
int oai_chat_render(const oai_ctx *c, json_t *messages, json_t *tools, json_t *kwargs, int add_generation_prompt,
                    char **text, oai_error *e);

/* Bytes as a JSON string value: invalid UTF-8 (a token holding part of a character) becomes U+FFFD. */
json_t *oai_json_text(const char *p, size_t n);

#endif
