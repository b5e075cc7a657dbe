/*
 * test_jinja.c — the chat-template interpreter against jinja2's own renderings (tests/fixtures/chat_templates.json,
 * written by tools/make_chat_fixtures.py with the environment transformers uses): every case must render byte for
 * byte the same, or fail where jinja2 failed (with raise_exception's message where the template raised). Then the
 * limits: runaway loops, deep nesting and huge output are errors, not hangs.
 */
#include <string.h>

#include <jansson.h>

#include "server/jinja.h"
#include "test_util.h"

static void show_diff(const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t s = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  first difference at byte %zu\n  want: %.80s\n  got:  %.80s\n", i, want + s, got + s);
}

static void limits(void) {
    static const char *const runaway[] = {
        "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
        "{% for i in range(100000000) %}{% endfor %}",
        "{{ 'x' * 100000000 }}",
        "{% set s = namespace(v='ab') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v }}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    };
    for (size_t i = 0; i < sizeof runaway / sizeof runaway[0]; i++) {
        char err[256] = "";
        jinja_template *t = jinja_compile(runaway[i], strlen(runaway[i]), err, sizeof err);
        REQUIRE(t, "compile %s: %s", runaway[i], err);
        char *out = NULL;
        CHECK(jinja_render(t, NULL, &out, NULL, err, sizeof err) != 0 && !out, "runaway template rendered: %s", runaway[i]);
        jinja_free(t);
    }
    /* nesting past the parser's depth limit */
    char deep[8192];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 3000; i++) deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 3000 && n < sizeof deep - 8; i++) deep[n++] = ')';
    memcpy(deep + n, " }}", 4);
    char err[256] = "";
    jinja_template *t = jinja_compile(deep, strlen(deep), err, sizeof err);
    CHECK(!t && strstr(err, "deeply"), "3000 nested parentheses: %s", t ? "compiled" : err);
    jinja_free(t);
}

int main(int argc, char **argv) {
    REQUIRE(argc == 2, "usage: test_jinja chat_templates.json");
    json_error_t je;
    json_t *cases = json_load_file(argv[1], 0, &je);
    REQUIRE(json_is_array(cases), "%s: %s", argv[1], je.text);
    size_t i, passed = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *src = json_string_value(json_object_get(c, "template"));
        const char *want = json_string_value(json_object_get(c, "expected"));
        const char *want_err = json_string_value(json_object_get(c, "error"));
        REQUIRE(name && src && (want || want_err), "case %zu malformed", i);
        char err[512] = "";
        jinja_template *t = jinja_compile(src, strlen(src), err, sizeof err);
        char *out = NULL;
        size_t len = 0;
        int rc = t ? jinja_render(t, json_object_get(c, "vars"), &out, &len, err, sizeof err) : -1;
        if (want) {
            CHECK(rc == 0, "%s: error: %s", name, err);
            if (rc == 0) {
                int same = len == strlen(want) && !memcmp(out, want, len);
                CHECK(same, "%s: output differs from jinja2's", name);
                if (!same) show_diff(want, out);
                passed += same;
            }
        } else {
            CHECK(rc != 0, "%s: rendered, jinja2 failed with: %s", name, want_err);
            /* a template's own raise_exception message must come through unchanged */
            if (rc != 0 && strstr(src, "raise_exception")) CHECK(!strcmp(err, want_err), "%s: message '%s', want '%s'", name, err, want_err);
            passed += rc != 0;
        }
        free(out);
        jinja_free(t);
    }
    fprintf(stderr, "%zu/%zu chat-template cases agree with jinja2\n", passed, json_array_size(cases));
    json_decref(cases);
    limits();
    TEST_END();
}
