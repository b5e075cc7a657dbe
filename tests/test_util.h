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

#endif
