/*
 * test_tokenizer.c — moet's tokenizer against HF tokenizers.
 *
 * usage: test_tokenizer TOKENIZER.json CASES.json [TEXT_FILE IDS.u16|IDS.i32]
 * CASES.json was written by tools/make_fixtures.py with tokenizers' Tokenizer.encode(s).ids. Checks every case's
 * ids exactly, decode(encode(s)) == s, and optionally a whole text file against its HF ids (little-endian int32).
 */
#include <jansson.h>
#include <string.h>

#include "core/util.h"
#include "moet.h"
#include "test_util.h"

int main(int argc, char **argv) {
    REQUIRE(argc == 3 || argc == 5, "usage: test_tokenizer TOKENIZER.json CASES.json [TEXT IDS.u16|IDS.i32]");
    char err[1024];
    moet_tokenizer *t;
    REQUIRE(moet_tokenizer_load(argv[1], &t, err, sizeof err) == 0, "%s", err);
    json_error_t je;
    json_t *root = json_load_file(argv[2], 0, &je);
    REQUIRE(root, "%s: %s", argv[2], je.text);
    json_t *cases = json_object_get(root, "cases");
    size_t i;
    json_t *c;
    int n_ok = 0;
    json_array_foreach(cases, i, c) {
        const char *s = json_string_value(json_object_get(c, "text"));
        size_t sl = json_string_length(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        int32_t *ids;
        size_t n;
        REQUIRE(moet_tokenizer_encode(t, s, sl, &ids, &n, err, sizeof err) == 0, "case %zu: %s", i, err);
        int same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
        if (!same) {
            fprintf(stderr, "case %zu %s\n  moet:", i, s);
            for (size_t k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
            fprintf(stderr, "\n  hf:  ");
            for (size_t k = 0; k < json_array_size(want); k++)
                fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, k)));
            fprintf(stderr, "\n");
        }
        CHECK(same, "case %zu: ids differ from HF tokenizers", i);
        char *dec;
        size_t dl;
        REQUIRE(moet_tokenizer_decode(t, ids, n, &dec, &dl, err, sizeof err) == 0, "%s", err);
        /* Round trip wherever HF's own decode round-trips (a normalizer, or a decoder without ByteFallback, can
         * make it lossy); in every case the decoded text must equal HF's. */
        const char *hd = json_string_value(json_object_get(c, "decoded"));
        if (!hd || strcmp(hd, s) == 0)
            CHECK(dl == sl && memcmp(dec, s, sl) == 0, "case %zu: decode(encode(s)) != s: '%s'", i, dec);
        CHECK(!hd || strcmp(hd, dec) == 0, "case %zu: decode '%s' differs from HF's '%s'", i, dec, hd);
        n_ok += same;
        free(dec);
        free(ids);
    }
    fprintf(stderr, "%d / %zu cases equal to HF tokenizers\n", n_ok, json_array_size(cases));
    CHECK(json_array_size(cases) >= 30, "fixture has fewer than 30 cases");
    /* Invalid UTF-8 is an error, not a crash. */
    {
        int32_t *ids;
        size_t n;
        CHECK(moet_tokenizer_encode(t, "ab\xff\xfe", 4, &ids, &n, err, sizeof err) == MOET_EINVAL, "invalid UTF-8 accepted");
        CHECK(moet_tokenizer_encode(t, "\xed\xa0\x80", 3, &ids, &n, err, sizeof err) == MOET_EINVAL, "surrogate accepted");
    }
    if (argc == 5) {
        char *text, *raw;
        size_t tl, rl;
        if (moet_file_read_all(argv[3], 1u << 30, &text, &tl, err, sizeof err)) {
            fprintf(stderr, "skip whole-file check: %s\n", err);
        } else {
            REQUIRE(moet_file_read_all(argv[4], 1u << 30, &raw, &rl, err, sizeof err) == 0, "%s", err);
            int32_t *ids;
            size_t n;
            double t0 = moet_time_s();
            REQUIRE(moet_tokenizer_encode(t, text, tl, &ids, &n, err, sizeof err) == 0, "%s", err);
            double el = moet_time_s() - t0;
            /* HF's ids: little-endian uint16 (.u16, tools/make_fixtures.py) or int32 */
            const size_t al = strlen(argv[4]), wb = al >= 4 && !strcmp(argv[4] + al - 4, ".u16") ? 2 : 4;
            CHECK(rl % wb == 0, "%s: %zu bytes, not a whole number of %zu-byte ids", argv[4], rl, wb);
            size_t nw = rl / wb, first_diff = n < nw ? n : nw;
            for (size_t k = 0; k < (n < nw ? n : nw); k++) {
                const unsigned char *b = (const unsigned char *)raw + wb * k;
                const int32_t w = wb == 2 ? (int32_t)(b[0] | b[1] << 8)
                                          : (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                                                      (uint32_t)b[3] << 24);
                if (w != ids[k]) { first_diff = k; break; }
            }
            CHECK(n == nw && first_diff == n, "%s: %zu ids vs HF's %zu, first difference at %zu", argv[3], n, nw,
                  first_diff);
            if (n == nw && first_diff == n)
                fprintf(stderr, "%s: %zu tokens equal to HF tokenizers' (%.2f MB/s)\n", argv[3], n, (double)tl / 1e6 / el);
            free(ids);
            free(raw);
            free(text);
        }
    }
    json_decref(root);
    moet_tokenizer_free(t);
    TEST_END();
}
