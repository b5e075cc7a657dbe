/*
 * oai.c — OpenAI request parsing and error bodies (see oai.h).
 */
#include "server/oai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int oai_fail(oai_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    e->type = status == 401 ? "authentication_error" : status == 404 ? "not_found_error"
              : status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

json_t *oai_json_text(const char *p, size_t n) {
    json_t *s = json_stringn(p, n);  /* NULL when p is not valid UTF-8 */
    if (s) return s;
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        int ok = len > 0 && i + len <= n && !(len == 2 && c < 0xC2);
        for (size_t j = 1; ok && j < len; j++) ok = ((unsigned char)p[i + j] & 0xC0) == 0x80;
        if (ok && len == 3) {
            unsigned cp = ((c & 0x0Fu) << 12) | (((unsigned char)p[i + 1] & 0x3Fu) << 6);
            ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok && len == 4) {
            unsigned cp = ((c & 0x07u) << 18) | (((unsigned char)p[i + 1] & 0x3Fu) << 12);
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (ok) {
            memcpy(o + k, p + i, len);
            k += len;
            i += len;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        }
    }
    json_t *r = json_stringn(o, k);
    free(o);
    return r;
}

char *oai_error_json(const oai_error *e, size_t *len) {
    json_t *err = json_pack("{s:o,s:s,s:o,s:o}", "message", oai_json_text(e->message, strlen(e->message)), "type",
                            e->type ? e->type : "invalid_request_error", "param",
                            e->param[0] ? json_string(e->param) : json_null(), "code",
                            e->code ? json_string(e->code) : json_null());
    json_t *root = json_pack("{s:o}", "error", err);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (s && len) *len = strlen(s);
    return s;
}

void oai_request_free(oai_request *r) {
    for (size_t i = 0; i < r->n_prompts; i++) free(r->prompt_ids[i]);
    free(r->prompt_ids);
    free(r->prompt_len);
    for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    memset(r, 0, sizeof *r);
}

/* ---- field helpers: each names the parameter in its error ----------------------------------------------- */

static int get_num(json_t *root, const char *key, double lo, double hi, double *out, oai_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return oai_fail(e, 400, key, "invalid_type", "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return oai_fail(e, 400, key, "invalid_value", "'%s' must be in [%g, %g], got %g", key, lo, hi, d);
    *out = d;
    return 1;
}

static int get_int(json_t *root, const char *key, long long lo, long long hi, long long *out, oai_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return oai_fail(e, 400, key, "invalid_type", "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return oai_fail(e, 400, key, "invalid_value", "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    return 1;
}

static int get_bool(json_t *root, const char *key, int *out, oai_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return oai_fail(e, 400, key, "invalid_type", "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

static int add_prompt(oai_request *r, int32_t *ids, size_t n, oai_error *e) {
    if (r->n_prompts >= OAI_MAX_PROMPTS) {
        free(ids);
        return oai_fail(e, 400, "prompt", "invalid_value", "at most %d prompts per request", OAI_MAX_PROMPTS);
    }
    int32_t **pi = realloc(r->prompt_ids, (r->n_prompts + 1) * sizeof *pi);
    if (!pi) { free(ids); return oai_fail(e, 500, NULL, NULL, "out of memory"); }
    r->prompt_ids = pi;
    size_t *pl = realloc(r->prompt_len, (r->n_prompts + 1) * sizeof *pl);
    if (!pl) { free(ids); return oai_fail(e, 500, NULL, NULL, "out of memory"); }
    r->prompt_len = pl;
    r->prompt_ids[r->n_prompts] = ids;
    r->prompt_len[r->n_prompts++] = n;
    return 0;
}

static int prompt_from_text(const oai_ctx *c, oai_request *r, const char *text, size_t len, int add_special,
                            oai_error *e) {
    int32_t *ids = NULL;
    size_t n = 0;
    char msg[256];
    if (moet_tokenizer_encode_special(c->tok, text, len, add_special, &ids, &n, msg, sizeof msg))
        return oai_fail(e, 400, "prompt", "invalid_value", "cannot tokenize the prompt: %s", msg);
    return add_prompt(r, ids, n, e);
}

static int prompt_from_ids(const oai_ctx *c, oai_request *r, json_t *arr, oai_error *e) {
    size_t n = json_array_size(arr);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return oai_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->vocab) {
            free(ids);
            return oai_fail(e, 400, "prompt", "invalid_value", "prompt token %zu is not a token id in [0, %d)", i, c->vocab);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    return add_prompt(r, ids, n, e);
}

/* prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...] */
static int parse_prompt(const oai_ctx *c, oai_request *r, json_t *p, oai_error *e) {
    if (!p) return oai_fail(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
    if (json_is_string(p)) return prompt_from_text(c, r, json_string_value(p), json_string_length(p), 1, e);
    if (!json_is_array(p) || json_array_size(p) == 0)
        return oai_fail(e, 400, "prompt", "invalid_type", "'prompt' must be a string, an array of strings, an array of "
                                                          "token ids or an array of token-id arrays (not empty)");
    json_t *first = json_array_get(p, 0);
    if (json_is_integer(first)) return prompt_from_ids(c, r, p, e);
    size_t i;
    json_t *v;
    json_array_foreach(p, i, v) {
        int rc;
        if (json_is_string(v)) rc = prompt_from_text(c, r, json_string_value(v), json_string_length(v), 1, e);
        else if (json_is_array(v)) rc = prompt_from_ids(c, r, v, e);
        else rc = oai_fail(e, 400, "prompt", "invalid_type", "prompt %zu must be a string or an array of token ids", i);
        if (rc) return rc;
    }
    return 0;
}

int oai_chat_render(const oai_ctx *c, json_t *messages, json_t *tools, json_t *kwargs, int add_gen, char **text,
                    oai_error *e) {
    *text = NULL;
    if (!c->tmpl) return oai_fail(e, 400, "messages", NULL, "the model ships no chat template; use /v1/completions");
    json_t *vars = json_object();
    if (!vars) return oai_fail(e, 500, NULL, NULL, "out of memory");
    if (kwargs) json_object_update(vars, kwargs);  /* chat_template_kwargs first: the fixed names win */
    json_object_set(vars, "messages", messages);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_gen));
    json_object_set_new(vars, "bos_token", json_string(c->bos_token ? c->bos_token : ""));
    json_object_set_new(vars, "eos_token", json_string(c->eos_token ? c->eos_token : ""));
    if (tools) json_object_set(vars, "tools", tools);
    else json_object_set_new(vars, "tools", json_null());
    char msg[512];
    size_t len;
    int rc = jinja_render(c->tmpl, vars, text, &len, msg, sizeof msg);
    json_decref(vars);
    if (rc) return oai_fail(e, 400, "messages", "chat_template_error", "chat template: %s", msg);
    return 0;
}

/* messages: [{role, content}], content a string or an array of {type: "text", text} parts (joined). Returns a
 * normalised copy the template sees. */
static int parse_messages(json_t *msgs, json_t **out, oai_error *e) {
    *out = NULL;
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return oai_fail(e, 400, "messages", "invalid_type", "'messages' must be a non-empty array");
    json_t *norm = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) { json_decref(norm); return oai_fail(e, 400, "messages", "invalid_type", "messages[%zu] must be an object", i); }
        json_t *role = json_object_get(m, "role");
        static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", NULL};
        int ok = json_is_string(role);
        for (int k = 0; ok && roles[k]; k++)
            if (!strcmp(json_string_value(role), roles[k])) { ok = 2; break; }
        if (ok != 2) {
            json_decref(norm);
            return oai_fail(e, 400, "messages", "invalid_value", "messages[%zu].role must be one of system, developer, user, "
                                                                 "assistant, tool", i);
        }
        json_t *nm = json_deep_copy(m);
        json_t *content = json_object_get(m, "content");
        if (json_is_array(content)) {  /* content parts: only text is supported */
            size_t total = 0, k;
            json_t *part;
            json_array_foreach(content, k, part) {
                json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
                if (!json_is_string(ty) || strcmp(json_string_value(ty), "text") || !json_is_string(tx)) {
                    json_decref(nm);
                    json_decref(norm);
                    return oai_fail(e, 400, "messages", "invalid_value",
                                    "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} parts are supported", i, k);
                }
                total += json_string_length(tx);
            }
            char *joined = malloc(total + 1);
            size_t off = 0;
            if (!joined) { json_decref(nm); json_decref(norm); return oai_fail(e, 500, NULL, NULL, "out of memory"); }
            json_array_foreach(content, k, part) {
                json_t *tx = json_object_get(part, "text");
                memcpy(joined + off, json_string_value(tx), json_string_length(tx));
                off += json_string_length(tx);
            }
            json_object_set_new(nm, "content", json_stringn(joined, off));
            free(joined);
        } else if (content && !json_is_string(content) && !json_is_null(content)) {
            json_decref(nm);
            json_decref(norm);
            return oai_fail(e, 400, "messages", "invalid_type", "messages[%zu].content must be a string or an array of parts", i);
        } else if (!content && strcmp(json_string_value(role), "assistant")) {
            json_decref(nm);
            json_decref(norm);
            return oai_fail(e, 400, "messages", "missing_required_parameter", "messages[%zu].content is required", i);
        }
        json_array_append_new(norm, nm);
    }
    *out = norm;
    return 0;
}

static int parse_stop(const oai_ctx *c, oai_request *r, json_t *root, oai_error *e) {
    json_t *s = json_object_get(root, "stop");
    json_t *items = NULL;
    if (s && !json_is_null(s)) {
        if (json_is_string(s)) {
            items = json_pack("[O]", s);
        } else if (json_is_array(s)) {
            items = json_incref(s);
        } else {
            return oai_fail(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings/token ids");
        }
    }
    json_t *ids = json_object_get(root, "stop_token_ids");
    if (ids && !json_is_null(ids) && !json_is_array(ids)) {
        json_decref(items);
        return oai_fail(e, 400, "stop_token_ids", "invalid_type", "'stop_token_ids' must be an array of token ids");
    }
    size_t ns = json_array_size(items) + json_array_size(ids);
    if (ns > OAI_MAX_STOPS) {
        json_decref(items);
        return oai_fail(e, 400, "stop", "invalid_value", "at most %d stop sequences", OAI_MAX_STOPS);
    }
    r->stop = calloc(ns + 1, sizeof *r->stop);
    r->stop_ids = calloc(ns + 1, sizeof *r->stop_ids);
    if (!r->stop || !r->stop_ids) { json_decref(items); return oai_fail(e, 500, NULL, NULL, "out of memory"); }
    for (int pass = 0; pass < 2; pass++) {
        json_t *arr = pass ? ids : items;
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            if (json_is_string(v) && !pass) {
                if (json_string_length(v) == 0) continue;
                if (json_string_length(v) > 256) {
                    json_decref(items);
                    return oai_fail(e, 400, "stop", "invalid_value", "stop strings are limited to 256 bytes");
                }
                if (!(r->stop[r->n_stop] = strdup(json_string_value(v)))) {
                    json_decref(items);
                    return oai_fail(e, 500, NULL, NULL, "out of memory");
                }
                r->n_stop++;
            } else if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < c->vocab) {
                r->stop_ids[r->n_stop_ids++] = (int32_t)json_integer_value(v);
            } else {
                json_decref(items);
                return oai_fail(e, 400, pass ? "stop_token_ids" : "stop", "invalid_value",
                                "stop entry %zu must be a string or a token id in [0, %d)", i, c->vocab);
            }
        }
    }
    json_decref(items);
    return 0;
}

/* Fields that change the output and that moet does not implement: refused rather than silently ignored. */
static int refuse_unsupported(json_t *root, int endpoint, oai_error *e) {
    json_t *v;
    if ((v = json_object_get(root, "best_of")) && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return oai_fail(e, 400, "best_of", "unsupported_parameter", "'best_of' other than 1 is not supported");
    if ((v = json_object_get(root, "suffix")) && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v)))
        return oai_fail(e, 400, "suffix", "unsupported_parameter", "'suffix' (insertion) is not supported");
    if ((v = json_object_get(root, "logit_bias")) && !json_is_null(v) && !(json_is_object(v) && !json_object_size(v)))
        return oai_fail(e, 400, "logit_bias", "unsupported_parameter", "'logit_bias' is not supported");
    if ((v = json_object_get(root, "response_format")) && !json_is_null(v)) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text"))
            return oai_fail(e, 400, "response_format", "unsupported_parameter",
                            "only response_format {\"type\": \"text\"} is supported (no constrained decoding)");
    }
    if (endpoint == OAI_CHAT) {
        if ((v = json_object_get(root, "tool_choice")) && !json_is_null(v) &&
            !(json_is_string(v) && (!strcmp(json_string_value(v), "none") || !strcmp(json_string_value(v), "auto"))))
            return oai_fail(e, 400, "tool_choice", "unsupported_parameter", "'tool_choice' must be \"auto\" or \"none\"");
        if ((v = json_object_get(root, "functions")) && !json_is_null(v))
            return oai_fail(e, 400, "functions", "unsupported_parameter", "'functions' is deprecated; pass 'tools'");
        if ((v = json_object_get(root, "modalities")) && json_is_array(v)) {
            size_t i;
            json_t *m;
            json_array_foreach(v, i, m) if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
                return oai_fail(e, 400, "modalities", "unsupported_parameter", "only the text modality is supported");
        }
    }
    return 0;
}

int oai_request_parse(const oai_ctx *c, int endpoint, const char *body, size_t len, oai_request *r, oai_error *e) {
    memset(r, 0, sizeof *r);
    r->endpoint = endpoint;
    r->logprobs = -1;
    r->n = 1;
    r->so = moet_sampler_default_options();
    r->so.temperature = 1.0f;  /* OpenAI's default */
    r->so.penalty_last_n = -1;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return oai_fail(e, 400, NULL, "invalid_json", "invalid JSON body: %s (line %d, column %d)", je.text, je.line, je.column);
    int rc = -1;
    json_t *msgs = NULL;
    char *chat_text = NULL;
    if (!json_is_object(root)) { oai_fail(e, 400, NULL, "invalid_type", "the body must be a JSON object"); goto out; }
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) { oai_fail(e, 400, "model", "invalid_type", "'model' must be a string"); goto out; }
    if (json_is_string(model) && strcmp(json_string_value(model), c->model_name)) {
        oai_fail(e, 404, "model", "model_not_found", "the model '%s' does not exist; this server serves '%s'",
                 json_string_value(model), c->model_name);
        goto out;
    }
    if (refuse_unsupported(root, endpoint, e)) goto out;

    double d;
    long long ll;
    if (get_bool(root, "stream", &r->stream, e) < 0) goto out;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) { oai_fail(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object"); goto out; }
        if (!r->stream) { oai_fail(e, 400, "stream_options", "invalid_value", "'stream_options' is only allowed with stream: true"); goto out; }
        int iu = 0;
        if (get_bool(so, "include_usage", &iu, e) < 0) goto out;
        r->include_usage = iu;
    }
    int k;
    if ((k = get_num(root, "temperature", 0, 2, &d, e)) < 0) goto out;
    if (k) r->so.temperature = (float)d;
    if ((k = get_num(root, "top_p", 0, 1, &d, e)) < 0) goto out;
    if (k) {
        if (d <= 0) { oai_fail(e, 400, "top_p", "invalid_value", "'top_p' must be in (0, 1]"); goto out; }
        r->so.top_p = (float)d;
    }
    if ((k = get_int(root, "top_k", -1, 1 << 30, &ll, e)) < 0) goto out;
    if (k) r->so.top_k = ll < 0 ? 0 : (int32_t)ll;
    if ((k = get_num(root, "min_p", 0, 1, &d, e)) < 0) goto out;
    if (k) r->so.min_p = (float)d;
    if ((k = get_num(root, "presence_penalty", -2, 2, &d, e)) < 0) goto out;
    if (k) r->so.presence_penalty = (float)d;
    if ((k = get_num(root, "frequency_penalty", -2, 2, &d, e)) < 0) goto out;
    if (k) r->so.frequency_penalty = (float)d;
    if ((k = get_num(root, "repetition_penalty", 0.01, 100, &d, e)) < 0) goto out;
    if (k) r->so.repetition_penalty = (float)d;
    if ((k = get_int(root, "seed", INT64_MIN, INT64_MAX, &ll, e)) < 0) goto out;
    r->so.seed = k ? (uint64_t)ll : 0x6d6f6574u;
    if ((k = get_int(root, "n", 1, OAI_MAX_N, &ll, e)) < 0) goto out;
    if (k) r->n = (int)ll;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e) < 0) goto out;
    if (parse_stop(c, r, root, e)) goto out;

    long long max_tokens = -1;
    if ((k = get_int(root, "max_tokens", 0, 1 << 30, &ll, e)) < 0) goto out;
    if (k) max_tokens = ll;
    if (endpoint == OAI_CHAT) {
        if ((k = get_int(root, "max_completion_tokens", 0, 1 << 30, &ll, e)) < 0) goto out;
        if (k) max_tokens = ll;
    }
    if (endpoint == OAI_COMPLETIONS) {
        if (get_bool(root, "echo", &r->echo, e) < 0) goto out;
        if ((k = get_int(root, "logprobs", 0, OAI_MAX_TOP_LOGPROBS, &ll, e)) < 0) goto out;
        if (k) r->logprobs = (int)ll;
        if (parse_prompt(c, r, json_object_get(root, "prompt"), e)) goto out;
        if (max_tokens < 0) max_tokens = 16;  /* the legacy API's default */
    } else {
        if (json_object_get(root, "prompt")) { oai_fail(e, 400, "prompt", "unsupported_parameter", "chat requests take 'messages', not 'prompt'"); goto out; }
        int lp = 0;
        if (get_bool(root, "logprobs", &lp, e) < 0) goto out;
        long long top = 0;
        if ((k = get_int(root, "top_logprobs", 0, OAI_MAX_TOP_LOGPROBS, &top, e)) < 0) goto out;
        if (k && !lp) { oai_fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true"); goto out; }
        if (lp) r->logprobs = (int)top;
        if (parse_messages(json_object_get(root, "messages"), &msgs, e)) goto out;
        json_t *tools = json_object_get(root, "tools");
        if (tools && !json_is_null(tools) && !json_is_array(tools)) { oai_fail(e, 400, "tools", "invalid_type", "'tools' must be an array"); goto out; }
        json_t *tc = json_object_get(root, "tool_choice");
        if (json_is_string(tc) && !strcmp(json_string_value(tc), "none")) tools = NULL;
        r->tools = json_is_array(tools) && json_array_size(tools) > 0;
        json_t *kw = json_object_get(root, "chat_template_kwargs");
        if (kw && !json_is_null(kw) && !json_is_object(kw)) { oai_fail(e, 400, "chat_template_kwargs", "invalid_type", "'chat_template_kwargs' must be an object"); goto out; }
        int add_gen = 1;
        if (get_bool(root, "add_generation_prompt", &add_gen, e) < 0) goto out;
        if (oai_chat_render(c, msgs, json_is_array(tools) && json_array_size(tools) ? tools : NULL,
                            json_is_object(kw) ? kw : NULL, add_gen, &chat_text, e))
            goto out;
        if (prompt_from_text(c, r, chat_text, strlen(chat_text), 0, e)) goto out;
    }
    /* the context: every prompt must leave room for what was asked (vLLM's rule), and hold at least one token */
    for (size_t i = 0; i < r->n_prompts; i++) {
        size_t np = r->prompt_len[i];
        if (np == 0) { oai_fail(e, 400, endpoint == OAI_CHAT ? "messages" : "prompt", "invalid_value", "the prompt is empty"); goto out; }
        if (np >= (size_t)c->n_ctx || (max_tokens > 0 && np + (size_t)max_tokens > (size_t)c->n_ctx)) {
            oai_fail(e, 400, endpoint == OAI_CHAT ? "messages" : "prompt", "context_length_exceeded",
                     "this model's context is %d tokens; the request has %zu prompt tokens and asks for %lld more",
                     c->n_ctx, np, max_tokens < 0 ? 0LL : max_tokens);
            goto out;
        }
    }
    if (max_tokens < 0) {  /* chat without a limit: up to the end of the context */
        size_t longest = 0;
        for (size_t i = 0; i < r->n_prompts; i++) longest = r->prompt_len[i] > longest ? r->prompt_len[i] : longest;
        max_tokens = (long long)((size_t)c->n_ctx - longest);
    }
    r->max_tokens = (int32_t)max_tokens;
    if ((size_t)r->n * r->n_prompts > OAI_MAX_PROMPTS) {
        oai_fail(e, 400, "n", "invalid_value", "n × prompts = %zu choices; at most %d", (size_t)r->n * r->n_prompts, OAI_MAX_PROMPTS);
        goto out;
    }
    if (r->stream && r->n_prompts > 1 && r->echo) {
        oai_fail(e, 400, "echo", "invalid_value", "echo with several prompts is not supported when streaming");
        goto out;
    }
    rc = 0;
out:
    if (rc) oai_request_free(r);
    free(chat_text);
    json_decref(msgs);
    json_decref(root);
    return rc;
}
