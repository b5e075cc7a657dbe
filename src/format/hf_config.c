/* hf_config.c — see hf_config.h. */
#include "format/hf_config.h"

#include <math.h>

#include "core/util.h"

static bool absent(const json_t *v) { return !v || json_is_null(v); }

int moet_cfg_int(const json_t *cfg, const char *key, bool required, int64_t def, int64_t lo, int64_t hi, int32_t *out,
                 char *err, size_t errlen) {
    const json_t *v = json_object_get(cfg, key);
    if (absent(v)) {
        if (required) return moet_err(err, errlen, MOET_EFORMAT, "missing required key '%s'", key);
        *out = (int32_t)def;
        return MOET_OK;
    }
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v);
    } else {
        return moet_err(err, errlen, MOET_EFORMAT, "key '%s' must be an integer", key);
    }
    if (x < lo || x > hi)
        return moet_err(err, errlen, MOET_EFORMAT, "key '%s' = %lld outside [%lld, %lld]", key, (long long)x,
                        (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return MOET_OK;
}

int moet_cfg_num(const json_t *cfg, const char *key, bool required, double def, double lo, double hi, double *out,
                 char *err, size_t errlen) {
    const json_t *v = json_object_get(cfg, key);
    if (absent(v)) {
        if (required) return moet_err(err, errlen, MOET_EFORMAT, "missing required key '%s'", key);
        *out = def;
        return MOET_OK;
    }
    if (!json_is_number(v)) return moet_err(err, errlen, MOET_EFORMAT, "key '%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return moet_err(err, errlen, MOET_EFORMAT, "key '%s' = %g outside [%g, %g]", key, x, lo, hi);
    *out = x;
    return MOET_OK;
}

int moet_cfg_bool(const json_t *cfg, const char *key, bool def, int32_t *out, char *err, size_t errlen) {
    const json_t *v = json_object_get(cfg, key);
    if (absent(v)) { *out = def; return MOET_OK; }
    if (!json_is_boolean(v)) return moet_err(err, errlen, MOET_EFORMAT, "key '%s' must be true or false", key);
    *out = json_is_true(v);
    return MOET_OK;
}

int moet_cfg_str(const json_t *cfg, const char *key, const char **out, char *err, size_t errlen) {
    const json_t *v = json_object_get(cfg, key);
    *out = NULL;
    if (absent(v)) return MOET_OK;
    if (!json_is_string(v)) return moet_err(err, errlen, MOET_EFORMAT, "key '%s' must be a string", key);
    *out = json_string_value(v);
    return MOET_OK;
}

const char *moet_cfg_pick(const json_t *cfg, const char *const *keys) {
    for (; *keys; keys++)
        if (!absent(json_object_get(cfg, *keys))) return *keys;
    return NULL;
}
