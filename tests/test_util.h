/* test_util.h — tiny assertion helpers for moet's CTest programs (each test is one executable). */
#ifndef MOET_TEST_UTIL_H
#define MOET_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

static int g_fail = 0;
#define CHECK(cond, ...) do { if (!(cond)) { g_fail++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define REQUIRE(cond, ...) do { if (!(cond)) { fprintf(stderr, "FATAL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)
#define TEST_END() do { if (g_fail) { fprintf(stderr, "%d check(s) failed\n", g_fail); return 1; } \
    fprintf(stderr, "ok\n"); return 0; } while (0)
/* CTest treats exit code 77 as "skipped" (SKIP_RETURN_CODE). */
#define TEST_SKIP_CODE 77

#ifdef MOET_H /* the end-to-end tests (moet.h included first) */
/* `prog MODEL_DIR [device]`: the model loaded on that device (the default one when absent), its vocabulary size in
 * *vocab; exits on failure. */
static inline moet_model *test_model_open(int argc, char **argv, int32_t *vocab) {
    REQUIRE(argc >= 2, "usage: %s MODEL_DIR [device]", argv[0]);
    char err[512];
    moet_model_options mo = moet_model_default_options();
    mo.device = argc > 2 ? argv[2] : NULL;
    moet_model *m;
    REQUIRE(moet_model_load(argv[1], &mo, &m, err, sizeof err) == 0, "%s", err);
    moet_model_info info;
    moet_model_info_get(m, &info);
    *vocab = info.vocab_size;
    return m;
}
#endif

#endif
