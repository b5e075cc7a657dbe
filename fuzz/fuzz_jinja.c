/* fuzz_jinja.c — libFuzzer target: arbitrary bytes as a chat template, compiled and (when it compiles) rendered
 * with a conversation, tools and the usual variables. Must never crash, hang or leak: syntax errors and runtime
 * errors are messages, and the step/output/depth limits bound what any template can cost. */
#include <stdint.h>
#include <stdlib.h>

#include <jansson.h>

#include "server/jinja.h"

static json_t *g_vars;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_vars) {
        g_vars = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                            "\"content\": \"Hi \\u00e9\"}, {\"role\": \"assistant\", \"content\": \"<think>x</think>ok\", "
                            "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null]}}}]}, "
                            "{\"role\": \"tool\", \"content\": \"42\"}], \"tools\": [{\"type\": \"function\", \"function\": "
                            "{\"name\": \"f\", \"parameters\": {}}}], \"add_generation_prompt\": true, \"bos_token\": "
                            "\"<s>\", \"eos_token\": \"</s>\"}", 0, NULL);
        if (!g_vars) abort();
    }
    char err[256];
    jinja_template *t = jinja_compile((const char *)data, size, err, sizeof err);
    if (!t) return 0;
    char *out = NULL;
    size_t n;
    if (jinja_render(t, g_vars, &out, &n, err, sizeof err) == 0) free(out);
    jinja_free(t);
    return 0;
}
