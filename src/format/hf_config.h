/*
 * hf_config.h — typed, range-checked reads from a Hugging Face config.json (jansson object).
 * Every error names the key; the caller prefixes the file.
 */
#ifndef MOET_FORMAT_HF_CONFIG_H
#define MOET_FORMAT_HF_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* Integer key in [lo, hi]. Absent or null: *out = def if !required, else error. */
int moet_cfg_int(const json_t *cfg, const char *key, bool required, int64_t def, int64_t lo, int64_t hi, int32_t *out,
                 char *err, size_t errlen);
/* Number key (integer or real) in [lo, hi]. */
int moet_cfg_num(const json_t *cfg, const char *key, bool required, double def, double lo, double hi, double *out,
                 char *err, size_t errlen);
int moet_cfg_bool(const json_t *cfg, const char *key, bool def, int32_t *out, char *err, size_t errlen);
/* String or NULL when absent. Error if present and not a string. */
int moet_cfg_str(const json_t *cfg, const char *key, const char **out, char *err, size_t errlen);
/* First of several spellings that is present (NULL if none). */
const char *moet_cfg_pick(const json_t *cfg, const char *const *keys);

#endif
