/*
 * pretok.c — normalizers and pre-tokenizers of HF tokenizers, on PCRE2 (UTF + Unicode properties) and utf8proc.
 *
 * Why PCRE2: the pre-tokenizer regexes that real tokenizers ship (GPT-2's, Qwen2's, Llama-3's) use \p{L}, \p{N},
 * lookahead and case-insensitive groups; PCRE2 with PCRE2_UTF|PCRE2_UCP runs them unchanged, so no pattern is
 * hand-translated. Why utf8proc: NFC/NFKC normalization (Qwen2's normalizer) needs the Unicode tables.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/util.h"
#include "tokenizer/tokenizer_int.h"

static const char k_gpt2_re[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- piece lists ---------------------------------------------------------------------------------------------- */

int moet_pieces_add(moet_pieces *p, const char *s, size_t len) {
    if (p->len + len > p->cap) {
        size_t nc = p->cap ? p->cap : 256;
        while (nc < p->len + len) nc *= 2;
        char *nb = realloc(p->buf, nc);
        if (!nb) return -1;
        p->buf = nb;
        p->cap = nc;
    }
    if (p->n == p->ncap) {
        size_t nc = p->ncap ? p->ncap * 2 : 64;
        size_t *no = realloc(p->off, nc * sizeof(size_t));
        if (!no) return -1;
        p->off = no;
        size_t *nl = realloc(p->plen, nc * sizeof(size_t));
        if (!nl) return -1;
        p->plen = nl;
        p->ncap = nc;
    }
    if (len) memcpy(p->buf + p->len, s, len);
    p->off[p->n] = p->len;
    p->plen[p->n] = len;
    p->len += len;
    p->n++;
    return 0;
}

void moet_pieces_clear(moet_pieces *p) { p->len = p->n = 0; }

void moet_pieces_free(moet_pieces *p) {
    free(p->buf);
    free(p->off);
    free(p->plen);
    memset(p, 0, sizeof(*p));
}

pcre2_code *moet_tok_regex(const char *pattern, size_t len, int literal, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t flags = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL excludes UCP */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, flags, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        moet_err(err, errlen, MOET_EFORMAT, "regex '%.*s' does not compile at offset %zu: %s", (int)(len > 80 ? 80 : len),
                 pattern, (size_t)eo, (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* best effort; the interpreter is the fallback */
    return re;
}

/* ---- parsing -------------------------------------------------------------------------------------------------- */

static int pattern_of(const json_t *j, pcre2_code **re, char *err, size_t errlen) {
    const json_t *pat = json_object_get(j, "pattern");
    const char *rs = json_string_value(json_object_get(pat, "Regex"));
    const char *ls = json_string_value(json_object_get(pat, "String"));
    if (!rs && !ls) return moet_err(err, errlen, MOET_EFORMAT, "pattern must be {\"Regex\": ...} or {\"String\": ...}");
    *re = moet_tok_regex(rs ? rs : ls, strlen(rs ? rs : ls), !rs, err, errlen);
    return *re ? MOET_OK : MOET_EFORMAT;
}

static int dup_str(const json_t *v, char **out, size_t *len) {
    const char *s = json_string_value(v);
    if (!s) return -1;
    *len = json_string_length(v);
    *out = malloc(*len + 1);
    if (!*out) return -1;
    memcpy(*out, s, *len + 1);
    return 0;
}

int moet_tok_parse_normalizer(moet_tokenizer *t, const json_t *j, char *err, size_t errlen) {
    if (!j || json_is_null(j)) return MOET_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return moet_err(err, errlen, MOET_EFORMAT, "normalizer without a type");
    if (strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(j, "normalizers");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            int rc = moet_tok_parse_normalizer(t, v, err, errlen);
            if (rc) return rc;
        }
        return MOET_OK;
    }
    if (t->n_norm == MOET_TOK_MAX_OPS) return moet_err(err, errlen, MOET_EUNSUP, "too many normalizers");
    moet_norm_op *op = &t->norm[t->n_norm];
    memset(op, 0, sizeof(*op));
    if (strcmp(type, "NFC") == 0) op->kind = NORM_NFC;
    else if (strcmp(type, "NFKC") == 0) op->kind = NORM_NFKC;
    else if (strcmp(type, "NFD") == 0) op->kind = NORM_NFD;
    else if (strcmp(type, "NFKD") == 0) op->kind = NORM_NFKD;
    else if (strcmp(type, "Prepend") == 0) {
        op->kind = NORM_PREPEND;
        if (dup_str(json_object_get(j, "prepend"), &op->a, &op->alen))
            return moet_err(err, errlen, MOET_EFORMAT, "Prepend normalizer needs a string 'prepend'");
    } else if (strcmp(type, "Replace") == 0) {
        op->kind = NORM_REPLACE;
        int rc = pattern_of(j, &op->re, err, errlen);
        if (rc) return rc;
        if (dup_str(json_object_get(j, "content"), &op->b, &op->blen))
            return moet_err(err, errlen, MOET_EFORMAT, "Replace normalizer needs a string 'content'");
    } else {
        return moet_err(err, errlen, MOET_EUNSUP,
                        "normalizer '%s' is not supported (supported: NFC, NFKC, NFD, NFKD, Prepend, Replace, Sequence)",
                        type);
    }
    t->n_norm++;
    return MOET_OK;
}

static const char *k_behaviors[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};

int moet_tok_parse_pretokenizer(moet_tokenizer *t, const json_t *j, char *err, size_t errlen) {
    if (!j || json_is_null(j)) return MOET_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return moet_err(err, errlen, MOET_EFORMAT, "pre_tokenizer without a type");
    if (strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(j, "pretokenizers");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            int rc = moet_tok_parse_pretokenizer(t, v, err, errlen);
            if (rc) return rc;
        }
        return MOET_OK;
    }
    if (t->n_pretok == MOET_TOK_MAX_OPS) return moet_err(err, errlen, MOET_EUNSUP, "too many pre-tokenizers");
    moet_pretok_op *op = &t->pretok[t->n_pretok];
    memset(op, 0, sizeof(*op));
    if (strcmp(type, "ByteLevel") == 0) {
        op->kind = PT_BYTELEVEL;
        op->add_prefix_space = json_is_true(json_object_get(j, "add_prefix_space"));
        const json_t *ur = json_object_get(j, "use_regex");
        op->use_regex = ur ? json_is_true(ur) : 1;
        if (op->use_regex && !(op->re = moet_tok_regex(k_gpt2_re, sizeof k_gpt2_re - 1, 0, err, errlen)))
            return MOET_EFORMAT;
        t->byte_level = 1;
    } else if (strcmp(type, "Split") == 0) {
        op->kind = PT_SPLIT;
        int rc = pattern_of(j, &op->re, err, errlen);
        if (rc) return rc;
        const char *b = json_string_value(json_object_get(j, "behavior"));
        op->behavior = -1;
        for (int i = 0; b && i < 5; i++)
            if (strcmp(b, k_behaviors[i]) == 0) op->behavior = i;
        if (op->behavior < 0) return moet_err(err, errlen, MOET_EUNSUP, "Split behavior '%s' is not supported", b ? b : "?");
        if (json_is_true(json_object_get(j, "invert")))
            return moet_err(err, errlen, MOET_EUNSUP, "Split with invert=true is not supported");
    } else if (strcmp(type, "Metaspace") == 0) {
        op->kind = PT_METASPACE;
        const char *r = json_string_value(json_object_get(j, "replacement"));
        if (!r) r = "\xe2\x96\x81";
        op->repl_len = strlen(r);
        if (op->repl_len == 0 || op->repl_len >= sizeof op->repl)
            return moet_err(err, errlen, MOET_EFORMAT, "Metaspace replacement must be one character");
        memcpy(op->repl, r, op->repl_len);
        const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
        const json_t *aps = json_object_get(j, "add_prefix_space");
        op->prepend_scheme = ps ? (strcmp(ps, "first") == 0 ? PREPEND_FIRST : strcmp(ps, "never") == 0 ? PREPEND_NEVER
                                                                                                       : PREPEND_ALWAYS)
                                : (aps && !json_is_true(aps)) ? PREPEND_NEVER : PREPEND_ALWAYS;
        const json_t *sp = json_object_get(j, "split");
        op->split = sp ? json_is_true(sp) : 1;
    } else if (strcmp(type, "Digits") == 0) {
        op->kind = PT_DIGITS;
        op->individual_digits = json_is_true(json_object_get(j, "individual_digits"));
    } else {
        return moet_err(err, errlen, MOET_EUNSUP,
                        "pre_tokenizer '%s' is not supported (supported: ByteLevel, Split, Metaspace, Digits, Sequence)",
                        type);
    }
    t->n_pretok++;
    return MOET_OK;
}

/* ---- normalize ------------------------------------------------------------------------------------------------ */

static int regex_replace(const pcre2_code *re, const char *s, size_t len, const char *rep, size_t rlen, char **out,
                         size_t *olen) {
    moet_pieces acc = {0};
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return -1;
    size_t pos = 0, last = 0;
    int rc = 0;
    while (pos <= len) {
        int r = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (r < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (moet_pieces_add(&acc, s + last, ov[0] - last) || moet_pieces_add(&acc, rep, rlen)) { rc = -1; break; }
        last = ov[1];
        if (ov[1] == ov[0]) {
            if (ov[1] >= len) break;
            size_t step = 1;
            while (ov[1] + step < len && ((uint8_t)s[ov[1] + step] & 0xc0) == 0x80) step++;
            if (moet_pieces_add(&acc, s + ov[1], step)) { rc = -1; break; }
            last = pos = ov[1] + step;
        } else {
            pos = ov[1];
        }
    }
    pcre2_match_data_free(md);
    if (!rc && moet_pieces_add(&acc, s + last, len - last)) rc = -1;
    if (!rc && moet_pieces_add(&acc, "", 1)) rc = -1; /* NUL */
    if (rc) { moet_pieces_free(&acc); return -1; }
    *out = acc.buf;
    *olen = acc.len - 1;
    free(acc.off);
    free(acc.plen);
    return 0;
}

int moet_tok_normalize(const moet_tokenizer *t, const char *s, size_t len, char **out, size_t *out_len) {
    char *cur = malloc(len + 1);
    if (!cur) return -1;
    memcpy(cur, s, len);
    cur[len] = 0;
    size_t clen = len;
    for (int i = 0; i < t->n_norm; i++) {
        const moet_norm_op *op = &t->norm[i];
        char *nx = NULL;
        size_t nlen = 0;
        switch (op->kind) {
        case NORM_NFC: case NORM_NFKC: case NORM_NFD: case NORM_NFKD: {
            int opts = UTF8PROC_STABLE | (op->kind == NORM_NFC || op->kind == NORM_NFKC ? UTF8PROC_COMPOSE
                                                                                        : UTF8PROC_DECOMPOSE) |
                       (op->kind == NORM_NFKC || op->kind == NORM_NFKD ? UTF8PROC_COMPAT : 0);
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)clen, &dst,
                                              (utf8proc_option_t)opts);
            if (r < 0) { free(cur); return -1; }
            nx = (char *)dst;
            nlen = (size_t)r;
            break;
        }
        case NORM_PREPEND:
            if (clen == 0) continue; /* HF prepends only to non-empty strings */
            nx = malloc(clen + op->alen + 1);
            if (!nx) { free(cur); return -1; }
            memcpy(nx, op->a, op->alen);
            memcpy(nx + op->alen, cur, clen + 1);
            nlen = clen + op->alen;
            break;
        case NORM_REPLACE:
            if (regex_replace(op->re, cur, clen, op->b, op->blen, &nx, &nlen)) { free(cur); return -1; }
            break;
        }
        free(cur);
        cur = nx;
        clen = nlen;
    }
    *out = cur;
    *out_len = clen;
    return 0;
}

/* ---- pre-tokenize ------------------------------------------------------------------------------------------------ */

/* Splits s by re into pieces according to behavior, appending to out. */
static int split_regex(const pcre2_code *re, int behavior, const char *s, size_t len, moet_pieces *out) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return -1;
    size_t pos = 0, last = 0;   /* last: end of the previous match */
    size_t pend_b = 0, pend_e = 0; /* a pending span to merge (MergedWithNext / Contiguous) */
    int have_pend = 0, rc = 0;
#define EMIT(b, e) do { if ((e) > (b) && moet_pieces_add(out, s + (b), (e) - (b))) { rc = -1; goto done; } } while (0)
    while (pos < len) {
        int r = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (r < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t mb = ov[0], me = ov[1];
        if (me == mb) { /* empty match: skip one character */
            pos = mb + 1;
            while (pos < len && ((uint8_t)s[pos] & 0xc0) == 0x80) pos++;
            continue;
        }
        switch (behavior) {
        case SPLIT_ISOLATED: EMIT(last, mb); EMIT(mb, me); break;
        case SPLIT_REMOVED: EMIT(last, mb); break;
        case SPLIT_MERGED_PREV: EMIT(last, me); break;
        case SPLIT_MERGED_NEXT:
            if (have_pend) { EMIT(pend_b, mb); } else { EMIT(last, mb); }
            pend_b = mb; have_pend = 1;
            break;
        case SPLIT_CONTIGUOUS:
            if (have_pend && pend_e == mb) { pend_e = me; break; }
            if (have_pend) EMIT(pend_b, pend_e);
            EMIT(last, mb);
            pend_b = mb; pend_e = me; have_pend = 1;
            break;
        }
        last = pos = me;
    }
    if (behavior == SPLIT_MERGED_NEXT && have_pend) { EMIT(pend_b, len); }
    else {
        if (behavior == SPLIT_CONTIGUOUS && have_pend) EMIT(pend_b, pend_e);
        EMIT(last, len);
    }
#undef EMIT
done:
    pcre2_match_data_free(md);
    return rc;
}

static int apply_op(const moet_pretok_op *op, const char *s, size_t len, int first, moet_pieces *out) {
    switch (op->kind) {
    case PT_BYTELEVEL: {
        char *tmp = NULL;
        if (op->add_prefix_space && len && s[0] != ' ') {
            if (!(tmp = malloc(len + 1))) return -1;
            tmp[0] = ' ';
            memcpy(tmp + 1, s, len);
            s = tmp;
            len++;
        }
        int rc = op->use_regex ? split_regex(op->re, SPLIT_ISOLATED, s, len, out)
                               : (len ? moet_pieces_add(out, s, len) : 0);
        free(tmp);
        return rc;
    }
    case PT_SPLIT: return split_regex(op->re, op->behavior, s, len, out);
    case PT_DIGITS: {
        size_t i = 0, start = 0;
        while (i < len) {
            if (s[i] >= '0' && s[i] <= '9') {
                if (i > start && moet_pieces_add(out, s + start, i - start)) return -1;
                size_t e = i + 1;
                if (!op->individual_digits)
                    while (e < len && s[e] >= '0' && s[e] <= '9') e++;
                if (moet_pieces_add(out, s + i, e - i)) return -1;
                start = i = e;
            } else {
                i++;
            }
        }
        return len > start ? moet_pieces_add(out, s + start, len - start) : 0;
    }
    case PT_METASPACE: {
        /* Replace spaces by the replacement, prepend it per scheme, then split before each replacement. */
        moet_pieces tmp = {0};
        int pre = op->prepend_scheme == PREPEND_ALWAYS || (op->prepend_scheme == PREPEND_FIRST && first);
        /* HF replaces spaces first and prepends only if the result does not already start with the replacement. */
        int starts = (len && s[0] == ' ') || (len >= op->repl_len && memcmp(s, op->repl, op->repl_len) == 0);
        if (pre && !starts && moet_pieces_add(&tmp, op->repl, op->repl_len)) return -1;
        for (size_t i = 0; i < len; i++) {
            if (s[i] == ' ' ? moet_pieces_add(&tmp, op->repl, op->repl_len) : moet_pieces_add(&tmp, s + i, 1)) {
                moet_pieces_free(&tmp);
                return -1;
            }
        }
        int rc = 0;
        if (!op->split) {
            rc = tmp.len ? moet_pieces_add(out, tmp.buf, tmp.len) : 0;
        } else {
            size_t start = 0;
            for (size_t i = 0; i + op->repl_len <= tmp.len; i++) {
                if (i > start && memcmp(tmp.buf + i, op->repl, op->repl_len) == 0) {
                    if ((rc = moet_pieces_add(out, tmp.buf + start, i - start))) break;
                    start = i;
                }
            }
            if (!rc && tmp.len > start) rc = moet_pieces_add(out, tmp.buf + start, tmp.len - start);
        }
        moet_pieces_free(&tmp);
        return rc;
    }
    }
    return -1;
}

int moet_tok_pretokenize(const moet_tokenizer *t, const char *s, size_t len, int first, moet_pieces *out) {
    if (t->n_pretok == 0) return len ? moet_pieces_add(out, s, len) : 0;
    moet_pieces a = {0}, b = {0};
    int rc = moet_pieces_add(&a, s, len);
    for (int i = 0; !rc && i < t->n_pretok; i++) {
        moet_pieces_clear(&b);
        for (size_t k = 0; !rc && k < a.n; k++)
            rc = apply_op(&t->pretok[i], a.buf + a.off[k], a.plen[k], first && k == 0, &b);
        moet_pieces sw = a;
        a = b;
        b = sw;
    }
    for (size_t k = 0; !rc && k < a.n; k++)
        if (a.plen[k]) rc = moet_pieces_add(out, a.buf + a.off[k], a.plen[k]);
    moet_pieces_free(&a);
    moet_pieces_free(&b);
    return rc;
}
