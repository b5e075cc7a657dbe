/*
 * test_tools.c — tool calls out of chat replies (server/toolcall.h), on written replies in each supported form:
 * Hermes / Qwen <tool_call> blocks (object, string and missing arguments, several calls, UTF-8), Kimi-K2's section
 * (its own call ids kept), DeepSeek-V3's fenced JSON and V3.1's bare JSON; content before the calls; the replies that
 * must stay content (no calls, bad JSON, a missing end marker, text after the calls, wrong field types, duplicate
 * keys); and toolcall_find's marker and partial-marker offsets for streaming. The served test model is too small to
 * call tools by itself, so the parser is tested here.
 */
#include <string.h>

#include <jansson.h>

#include "server/toolcall.h"
#include "test_util.h"

#define DS_CALLS_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALLS_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_CALL_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALL_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"

static json_t *parse(const char *text, size_t *cl) { return toolcall_parse(text, strlen(text), "chatcmpl-t", cl); }

static const char *fn_field(json_t *calls, size_t i, const char *key) {
    return json_string_value(json_object_get(json_object_get(json_array_get(calls, i), "function"), key));
}

static const char *id_of(json_t *calls, size_t i) {
    return json_string_value(json_object_get(json_array_get(calls, i), "id"));
}

static void hermes(void) {
    size_t cl = 99;
    json_t *c = parse("Let me look that up.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                      "\"unit\": \"c\"}}\n</tool_call>", &cl);
    REQUIRE(c && json_array_size(c) == 1, "hermes: one call in a reply with content before it");
    CHECK(cl == strlen("Let me look that up."), "hermes: content length %zu", cl);
    CHECK(!strcmp(fn_field(c, 0, "name"), "get_weather"), "hermes: name");
    CHECK(!strcmp(fn_field(c, 0, "arguments"), "{\"city\":\"Paris\",\"unit\":\"c\"}"), "hermes: arguments in order, compact: %s",
          fn_field(c, 0, "arguments"));
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(c, 0), "type")), "function"), "hermes: type");
    CHECK(!strcmp(id_of(c, 0), "call_0_chatcmpl-t"), "hermes: id");
    json_decref(c);

    c = parse("<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>\n  <tool_call>\n{\"name\": \"b\"}\n"
              "</tool_call>\n", &cl);
    REQUIRE(c && json_array_size(c) == 2, "hermes: two calls");
    CHECK(cl == 0, "hermes: no content before the calls");
    CHECK(!strcmp(fn_field(c, 0, "arguments"), "{\"x\": 1}"), "hermes: string arguments pass through: %s", fn_field(c, 0, "arguments"));
    CHECK(!strcmp(fn_field(c, 1, "name"), "b") && !strcmp(fn_field(c, 1, "arguments"), "{}"), "hermes: missing arguments: {}");
    CHECK(!strcmp(id_of(c, 1), "call_1_chatcmpl-t"), "hermes: second id");
    json_decref(c);

    c = parse("<tool_call>{\"name\": \"s\", \"arguments\": {\"q\": \"caf\xc3\xa9\"}}</tool_call>", &cl);
    REQUIRE(c, "hermes: UTF-8 arguments");
    CHECK(!strcmp(fn_field(c, 0, "arguments"), "{\"q\":\"caf\xc3\xa9\"}"), "hermes: UTF-8 kept: %s", fn_field(c, 0, "arguments"));
    json_decref(c);
}

static void kimi(void) {
    size_t cl = 99;
    json_t *c = parse("I will check both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                      "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>\n<|tool_call_begin|> functions.add:1 "
                      "<|tool_call_argument_begin|> {\"a\": 2, \"b\": 3} <|tool_call_end|><|tool_calls_section_end|>", &cl);
    REQUIRE(c && json_array_size(c) == 2, "kimi: two calls");
    CHECK(cl == strlen("I will check both."), "kimi: content length %zu", cl);
    CHECK(!strcmp(fn_field(c, 0, "name"), "get_weather") && !strcmp(fn_field(c, 1, "name"), "add"), "kimi: names");
    CHECK(!strcmp(id_of(c, 0), "functions.get_weather:0") && !strcmp(id_of(c, 1), "functions.add:1"), "kimi: its own ids");
    CHECK(!strcmp(fn_field(c, 1, "arguments"), "{\"a\":2,\"b\":3}"), "kimi: arguments: %s", fn_field(c, 1, "arguments"));
    json_decref(c);
}

static void deepseek(void) {
    size_t cl = 99;
    json_t *c = parse("Checking." DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "get_weather\n```json\n{\"city\": \"Oslo\"}\n```"
                      DS_CALL_END DS_CALLS_END, &cl);
    REQUIRE(c && json_array_size(c) == 1, "deepseek v3: one call");
    CHECK(cl == strlen("Checking."), "deepseek v3: content length %zu", cl);
    CHECK(!strcmp(fn_field(c, 0, "name"), "get_weather"), "deepseek v3: name %s", fn_field(c, 0, "name"));
    CHECK(!strcmp(fn_field(c, 0, "arguments"), "{\"city\":\"Oslo\"}"), "deepseek v3: arguments %s", fn_field(c, 0, "arguments"));
    json_decref(c);
    c = parse(DS_CALLS_BEGIN DS_CALL_BEGIN "get_weather" DS_SEP "{\"city\": \"Rome\"}" DS_CALL_END DS_CALL_BEGIN "noop" DS_SEP
              "{}" DS_CALL_END DS_CALLS_END "\n", &cl);
    REQUIRE(c && json_array_size(c) == 2, "deepseek v3.1: two calls");
    CHECK(cl == 0 && !strcmp(fn_field(c, 0, "name"), "get_weather") && !strcmp(fn_field(c, 1, "arguments"), "{}"),
          "deepseek v3.1: names and arguments");
    json_decref(c);
}

static void plain(void) {
    static const char *const texts[] = {
        "The weather in Paris is mild.",
        "<tool_call>{\"name\": \"a\", \"arguments\": {}</tool_call>",         /* bad JSON */
        "<tool_call>{\"name\": \"a\", \"arguments\": {}}",                    /* unclosed */
        "<tool_call>{\"name\": \"a\"}</tool_call> and then some words",       /* text after the calls */
        "<tool_call>{\"name\": 3}</tool_call>",                               /* name not a string */
        "<tool_call>{\"name\": \"\"}</tool_call>",                            /* empty name */
        "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>",       /* arguments an array */
        "<tool_call>[\"a\"]</tool_call>",                                     /* not an object */
        "<tool_call>{\"name\": \"a\", \"name\": \"b\"}</tool_call>",          /* duplicate keys */
        "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": 1}</tool_call>", /* one bad of two */
        "<tool_call",
        "<|tool_calls_section_begin|><|tool_calls_section_end|>",             /* no calls */
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\":1}<|tool_call_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1]<|tool_call_end|>"
        "<|tool_calls_section_end|>",                                         /* arguments not an object */
        DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "f\n```json\n{\"a\": 1}\n" DS_CALL_END DS_CALLS_END, /* open fence */
        DS_CALLS_BEGIN DS_CALL_BEGIN DS_SEP "{}" DS_CALL_END DS_CALLS_END,    /* no name */
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t cl;
        json_t *c = parse(texts[i], &cl);
        CHECK(!c, "stays content: case %zu: %s", i, texts[i]);
        json_decref(c);
    }
    size_t cl;
    const char *t = "hi <tool_call>{\"name\": \"a\"}</tool_call>";
    CHECK(!toolcall_parse(t, 3, "x", &cl), "text cut before the block");
}

static void find(void) {
    size_t part;
    const char *t = "abc <tool_call>{}";
    CHECK(toolcall_find(t, strlen(t), &part) == 4 && part == strlen(t), "find: the marker's offset, no partial");
    t = "abc <tool_ca";
    CHECK(toolcall_find(t, strlen(t), &part) == strlen(t) && part == 4, "find: a partial marker at the tail (%zu)", part);
    t = "abc <|tool_calls_sec";
    CHECK(toolcall_find(t, strlen(t), &part) == strlen(t) && part == 4, "find: a partial kimi marker (%zu)", part);
    t = "x <";
    CHECK(toolcall_find(t, strlen(t), &part) == strlen(t) && part == 2, "find: '<' may start a marker (%zu)", part);
    t = "plain text.";
    CHECK(toolcall_find(t, strlen(t), &part) == strlen(t) && part == strlen(t), "find: nothing in plain text");
}

int main(void) {
    hermes();
    kimi();
    deepseek();
    plain();
    find();
    TEST_END();
}
