/* fuzz_tokenizer.c — libFuzzer target: arbitrary bytes through encode (invalid UTF-8 must be an error) and, when
 * accepted, decode(encode(s)) == s. Uses the embedded model's tokenizer.json (MOET_FUZZ_TOKENIZER). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moet.h"

static moet_tokenizer *g_tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok) {
        char err[512];
        if (moet_tokenizer_load(MOET_FUZZ_TOKENIZER, &g_tok, err, sizeof err)) abort();
    }
    int32_t *ids;
    size_t n;
    if (moet_tokenizer_encode(g_tok, (const char *)data, size, &ids, &n, NULL, 0) != MOET_OK) return 0;
    char *text;
    size_t len;
    if (moet_tokenizer_decode(g_tok, ids, n, &text, &len, NULL, 0) != MOET_OK) abort();
    if (len != size || memcmp(text, data, size) != 0) abort(); /* byte-level BPE round-trips exactly */
    free(text);
    free(ids);
    return 0;
}
