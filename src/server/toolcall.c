/*
 * toolcall.c — tool calls out of a chat reply (toolcall.h): one parser per model family's form, chosen by the
 * first opening marker in the reply. Each parser accepts only a whole, well-formed run of calls followed by nothing
 * but whitespace; anything else leaves the reply as content.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/toolcall.h"

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static const char *skip_space(const char *p, const char *end) {
    while (p < end && is_space(*p)) p++;
    return p;
}

static const char *find(const char *p, const char *end, const char *lit) {
    return memmem(p, (size_t)(end - p), lit, strlen(lit));
}

/* p past lit when the text at p starts with it, else NULL. */
static const char *eat(const char *p, const char *end, const char *lit) {
    const size_t n = strlen(lit);
    return (size_t)(end - p) >= n && !memcmp(p, lit, n) ? p + n : NULL;
}

/* [*a, *b) without surrounding whitespace. */
static void trim(const char **a, const char **b) {
    while (*a < *b && is_space(**a)) (*a)++;
    while (*b > *a && is_space((*b)[-1])) (*b)--;
}

/* Appends {"id", "type", "function": {"name", "arguments"}} to calls; args_text is taken (malloc'd); id NULL: a
 * generated one. -1 (nothing appended) when the name is empty or not UTF-8. */
static int push_call(json_t *calls, const char *name, size_t nl, char *args_text, const char *id, size_t il,
                     const char *sfx) {
    json_t *jn = nl ? json_stringn(name, nl) : NULL;
    char gen[128];
    if (!id) {
        snprintf(gen, sizeof gen, "call_%zu_%s", json_array_size(calls), sfx ? sfx : "");
        id = gen;
        il = strlen(gen);
    }
    json_t *ji = json_stringn(id, il);
    json_t *ja = args_text ? json_string(args_text) : NULL;
    free(args_text);
    if (!jn || !ji || !ja) {
        json_decref(jn);
        json_decref(ji);
        json_decref(ja);
        return -1;
    }
    json_array_append_new(calls, json_pack("{s:o,s:s,s:{s:o,s:o}}", "id", ji, "type", "function", "function", "name",
                                           jn, "arguments", ja));
    return 0;
}

/* Arguments given as JSON text: an object, re-written compact in its own key order; NULL when it is not one. */
static char *args_object(const char *a, const char *b) {
    trim(&a, &b);
    json_t *o = json_loadb(a, (size_t)(b - a), JSON_REJECT_DUPLICATES, NULL);
    char *s = json_is_object(o) ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}

/* ---- hermes: <tool_call>{"name", "arguments"}</tool_call>, repeated ------------------------------------------ */

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"

static int parse_hermes(const char *p, const char *end, json_t *calls, const char *sfx) {
    while (p < end) {
        const char *body = eat(p, end, HERMES_OPEN), *close = body ? find(body, end, HERMES_CLOSE) : NULL;
        if (!close) return -1;
        json_t *call = json_loadb(body, (size_t)(close - body), JSON_REJECT_DUPLICATES, NULL);
        json_t *name = json_object_get(call, "name"), *args = json_object_get(call, "arguments");
        int ok = json_is_object(call) && json_is_string(name) && (!args || json_is_object(args) || json_is_string(args));
        char *at = !ok ? NULL : !args ? strdup("{}") : json_is_string(args) ? strdup(json_string_value(args))
                                                                         : json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
        ok = ok && at && !push_call(calls, json_string_value(name), json_string_length(name), at, NULL, 0, sfx);
        json_decref(call);
        if (!ok) return -1;
        p = skip_space(close + strlen(HERMES_CLOSE), end);
    }
    return 0;
}

/* ---- kimi_k2: a section of <|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|> --------- */

#define KIMI_OPEN "<|tool_calls_section_begin|>"
#define KIMI_CLOSE "<|tool_calls_section_end|>"
#define KIMI_CALL "<|tool_call_begin|>"
#define KIMI_ARGS "<|tool_call_argument_begin|>"
#define KIMI_END "<|tool_call_end|>"

static int parse_kimi(const char *p, const char *end, json_t *calls, const char *sfx) {
    p = eat(p, end, KIMI_OPEN);
    for (;;) {
        p = skip_space(p, end);
        const char *q = eat(p, end, KIMI_CLOSE);
        if (q) return skip_space(q, end) == end ? 0 : -1;
        const char *id = eat(p, end, KIMI_CALL), *am = id ? find(id, end, KIMI_ARGS) : NULL;
        const char *args = am ? am + strlen(KIMI_ARGS) : NULL, *ce = args ? find(args, end, KIMI_END) : NULL;
        if (!ce) return -1;
        const char *ie = am;
        trim(&id, &ie);
        /* the id is functions.NAME:INDEX; the name is what lies between the first '.' and the last ':' */
        const char *na = memchr(id, '.', (size_t)(ie - id)), *nb = ie;
        na = na ? na + 1 : id;
        for (const char *c = ie; c > na; c--)
            if (c[-1] == ':') { nb = c - 1; break; }
        char *at = args_object(args, ce);
        if (!at || push_call(calls, na, (size_t)(nb - na), at, id, (size_t)(ie - id), sfx)) return -1;
        p = ce + strlen(KIMI_END);
    }
}

/* ---- deepseek_v3: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜> (V3)
 *      or <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜> (V3.1), inside the calls markers --------- */

#define DS_OPEN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CLOSE "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_CALL "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"
#define DS_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"

static int parse_deepseek(const char *p, const char *end, json_t *calls, const char *sfx) {
    p = eat(p, end, DS_OPEN);
    for (;;) {
        p = skip_space(p, end);
        const char *q = eat(p, end, DS_CLOSE);
        if (q) return skip_space(q, end) == end ? 0 : -1;
        const char *x = eat(p, end, DS_CALL), *sep = x ? find(x, end, DS_SEP) : NULL;
        const char *y = sep ? sep + strlen(DS_SEP) : NULL, *ce = y ? find(y, end, DS_END) : NULL;
        if (!ce) return -1;
        const char *na, *nb, *aa, *ab, *fence = find(y, ce, "```json");
        if (fence) { /* V3: the name, then the arguments in a json code fence */
            na = y;
            nb = fence;
            aa = fence + strlen("```json");
            ab = ce;
            trim(&aa, &ab);
            if (ab - aa < 3 || memcmp(ab - 3, "```", 3)) return -1;
            ab -= 3;
        } else { /* V3.1 */
            na = x;
            nb = sep;
            aa = y;
            ab = ce;
        }
        trim(&na, &nb);
        char *at = args_object(aa, ab);
        if (!at || push_call(calls, na, (size_t)(nb - na), at, NULL, 0, sfx)) return -1;
        p = ce + strlen(DS_END);
    }
}

/* ---- the forms, and the two entry points ---------------------------------------------------------------------- */

typedef struct {
    const char *open;
    int (*parse)(const char *p, const char *end, json_t *calls, const char *sfx);
} toolcall_form;

static const toolcall_form g_forms[] = {
    {HERMES_OPEN, parse_hermes},
    {KIMI_OPEN, parse_kimi},
    {DS_OPEN, parse_deepseek},
};
#define N_FORMS (sizeof g_forms / sizeof g_forms[0])

/* The first form's marker in the text: its offset (n: none) and the form. */
static size_t first_marker(const char *text, size_t n, const toolcall_form **form) {
    size_t best = n;
    *form = NULL;
    for (size_t i = 0; i < N_FORMS; i++) {
        const char *m = memmem(text, n, g_forms[i].open, strlen(g_forms[i].open));
        if (m && (size_t)(m - text) < best) {
            best = (size_t)(m - text);
            *form = &g_forms[i];
        }
    }
    return best;
}

size_t toolcall_find(const char *text, size_t n, size_t *partial) {
    const toolcall_form *f;
    const size_t first = first_marker(text, n, &f);
    size_t part = n;
    for (size_t i = 0; i < N_FORMS; i++) {
        const size_t ml = strlen(g_forms[i].open);
        for (size_t k = ml - 1; k > 0; k--)
            if (k <= n && !memcmp(text + n - k, g_forms[i].open, k)) {
                if (n - k < part) part = n - k;
                break;
            }
    }
    *partial = part;
    return first;
}

json_t *toolcall_parse(const char *text, size_t n, const char *id_suffix, size_t *content_len) {
    const toolcall_form *f;
    const size_t first = first_marker(text, n, &f);
    if (!f) return NULL;
    json_t *calls = json_array();
    if (f->parse(text + first, text + n, calls, id_suffix) || !json_array_size(calls)) {
        json_decref(calls);
        return NULL;
    }
    size_t cl = first;
    while (cl > 0 && is_space(text[cl - 1])) cl--;
    *content_len = cl;
    return calls;
}
