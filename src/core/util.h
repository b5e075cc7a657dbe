/*
 * util.h — small things every file needs: error formatting, checked size arithmetic, logging, file helpers.
 *
 * Why checked arithmetic everywhere: every size in moet that comes from a file (safetensors header, config.json,
 * a pack) is attacker-controlled as far as the parser is concerned. A shape like [2^40, 2^40] must become a clear
 * error, never a wrapped multiplication that passes a bounds check.
 */
#ifndef MOET_CORE_UTIL_H
#define MOET_CORE_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moet.h"

#ifdef __cplusplus /* the CUDA backend logs too */
extern "C" {
#endif

#if defined(__GNUC__)
#define MOET_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MOET_PRINTF(a, b)
#endif

/* Writes a formatted message into err (if any) and returns code. */
int moet_err(char *err, size_t errlen, int code, const char *fmt, ...) MOET_PRINTF(4, 5);

/* Checked arithmetic: return false on overflow (the result is then unspecified). */
static inline bool moet_mul_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static inline bool moet_add_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool moet_mul_size(size_t a, size_t b, size_t *r) { return !__builtin_mul_overflow(a, b, r); }

/* Logging to stderr. Level: 0 error, 1 warn, 2 info, 3 debug. */
enum { MOET_LOG_ERROR = 0, MOET_LOG_WARN, MOET_LOG_INFO, MOET_LOG_DEBUG };
void moet_log_set_level(int level);
int moet_log_level(void);
void moet_log(int level, const char *fmt, ...) MOET_PRINTF(2, 3);
#define MOET_LOGE(...) moet_log(MOET_LOG_ERROR, __VA_ARGS__)
#define MOET_LOGW(...) moet_log(MOET_LOG_WARN, __VA_ARGS__)
#define MOET_LOGI(...) moet_log(MOET_LOG_INFO, __VA_ARGS__)
#define MOET_LOGD(...) moet_log(MOET_LOG_DEBUG, __VA_ARGS__)

/* Reads a whole file into a NUL-terminated malloc'd buffer; max_bytes bounds it. */
int moet_file_read_all(const char *path, size_t max_bytes, char **data, size_t *len, char *err, size_t errlen);
bool moet_file_exists(const char *path);
/* dir + "/" + name into buf; returns false if it does not fit. */
bool moet_path_join(char *buf, size_t cap, const char *dir, const char *name);

/* A read-only memory map of a whole file. */
typedef struct {
    void *data;
    size_t size;
} moet_mmap;
int moet_mmap_open(const char *path, moet_mmap *m, char *err, size_t errlen);
void moet_mmap_close(moet_mmap *m);

/* Monotonic seconds. */
double moet_time_s(void);
/* Peak resident set size of this process in bytes (0 if unknown). */
uint64_t moet_peak_rss_bytes(void);

/* BF16 / F16 widening (exact). */
static inline float moet_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
float moet_f16_to_f32(uint16_t h);
uint16_t moet_f32_to_bf16(float f); /* round to nearest even, NaN preserved */

#ifdef __cplusplus
}
#endif

#endif
