/*
 * test_tools.c — the chat endpoint's tool-call parser (oai_tool_calls_parse) on replies in the Hermes / Qwen form:
 * calls with object, string and missing arguments, several calls, content before them, and the replies that must
 * stay plain content (no block, bad JSON, an unclosed block, text after the calls, wrong field types, duplicate keys).
 * The served test model is too small to call tools by itself, so the parser is tested here on written replies.
 */
#include <string.h>

#include <jansson.h>

#include "server/oai.h"
#include "test_util.h"

static json_t *parse(const char *text, size_t *cl) { return oai_tool_calls_parse(text, strlen(text), "chatcmpl-t", cl); }

static const char *fn_field(json_t *calls, size_t i, const char *key) {
    return json_string_value(json_object_get(json_object_get(json_array_get(calls, i), "function"), key));
}

int main(void) {
    size_t cl = 99;
    json_t *c = parse("Let me look that up.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                      "\"unit\": \"c\"}}\n</tool_call>", &cl);
    REQUIRE(c && json_array_size(c) == 1, "one call in a reply with content before it");
    CHECK(cl == strlen("Let me look that up."), "content length %zu", cl);
    CHECK(!strcmp(fn_field(c, 0, "name"), "get_weather"), "name");
    CHECK(!strcmp(fn_field(c, 0, "arguments"), "{\"city\":\"Paris\",\"unit\":\"c\"}"), "arguments in order, compact: %s",
          fn_field(c, 0, "arguments"));
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(c, 0), "type")), "function"), "type");
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(c, 0), "id")), "call_0_chatcmpl-t"), "id");
    json_decref(c);

    c = parse("<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>\n  <tool_call>\n{\"name\": \"b\"}\n"
              "</tool_call>\n",
              &cl);
    REQUIRE(c && json_array_size(c) == 2, "two calls");
    CHECK(cl == 0, "no content before the calls");
    CHECK(!strcmp(fn_field(c, 0, "arguments"), "{\"x\": 1}"), "string arguments pass through: %s", fn_field(c, 0, "arguments"));
    CHECK(!strcmp(fn_field(c, 1, "name"), "b") && !strcmp(fn_field(c, 1, "arguments"), "{}"), "missing arguments: {}");
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(c, 1), "id")), "call_1_chatcmpl-t"), "second id");
    json_decref(c);

    c = parse("<tool_call>{\"name\": \"s\", \"arguments\": {\"q\": \"caf\xc3\xa9\"}}</tool_call>", &cl);
    REQUIRE(c, "UTF-8 arguments");
    CHECK(!strcmp(fn_field(c, 0, "arguments"), "{\"q\":\"caf\xc3\xa9\"}"), "UTF-8 kept: %s", fn_field(c, 0, "arguments"));
    json_decref(c);

    static const char *const plain[] = {
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
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        c = parse(plain[i], &cl);
        CHECK(!c, "stays content: %s", plain[i]);
        json_decref(c);
    }
    /* lengths are honoured: a block past n is not seen */
    const char *t = "hi <tool_call>{\"name\": \"a\"}</tool_call>";
    CHECK(!oai_tool_calls_parse(t, 3, "x", &cl), "text cut before the block");
    TEST_END();
}
