/*
 * decode.c — HF decoders as a chain over a list of token strings (each decoder maps the list to a new list, as
 * tokenizers' decode_chain does), concatenated at the end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tokenizer/tokenizer_int.h"

static int dup_json_str(const json_t *v, char **out, size_t *len) {
    const char *s = json_string_value(v);
    if (!s) return -1;
    *len = json_string_length(v);
    if (!(*out = malloc(*len + 1))) return -1;
    memcpy(*out, s, *len + 1);
    return 0;
}

int moet_tok_parse_decoder(moet_tokenizer *t, const json_t *j, char *err, size_t errlen) {
    if (!j || json_is_null(j)) return MOET_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return moet_err(err, errlen, MOET_EFORMAT, "decoder without a type");
    if (strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(j, "decoders"), i, v) {
            int rc = moet_tok_parse_decoder(t, v, err, errlen);
            if (rc) return rc;
        }
        return MOET_OK;
    }
    if (t->n_dec == MOET_TOK_MAX_OPS) return moet_err(err, errlen, MOET_EUNSUP, "too many decoders");
    moet_dec_op *op = &t->dec[t->n_dec];
    memset(op, 0, sizeof(*op));
    if (strcmp(type, "ByteLevel") == 0) {
        op->kind = DEC_BYTELEVEL;
    } else if (strcmp(type, "Metaspace") == 0) {
        op->kind = DEC_METASPACE;
        const char *r = json_string_value(json_object_get(j, "replacement"));
        if (!r) r = "\xe2\x96\x81";
        op->repl_len = strlen(r);
        if (!op->repl_len || op->repl_len >= sizeof op->repl)
            return moet_err(err, errlen, MOET_EFORMAT, "Metaspace replacement must be one character");
        memcpy(op->repl, r, op->repl_len);
        const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
        const json_t *aps = json_object_get(j, "add_prefix_space");
        op->prepend_scheme = ps ? (strcmp(ps, "never") == 0 ? PREPEND_NEVER : PREPEND_ALWAYS)
                                : (aps && !json_is_true(aps)) ? PREPEND_NEVER : PREPEND_ALWAYS;
    } else if (strcmp(type, "Replace") == 0) {
        op->kind = DEC_REPLACE;
        const json_t *pat = json_object_get(j, "pattern");
        if (!json_object_get(pat, "String"))
            return moet_err(err, errlen, MOET_EUNSUP, "Replace decoder with a Regex pattern is not supported");
        if (dup_json_str(json_object_get(pat, "String"), &op->a, &op->alen) ||
            dup_json_str(json_object_get(j, "content"), &op->b, &op->blen) || op->alen == 0)
            return moet_err(err, errlen, MOET_EFORMAT, "Replace decoder needs pattern.String and content");
    } else if (strcmp(type, "ByteFallback") == 0) {
        op->kind = DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        op->kind = DEC_FUSE;
    } else if (strcmp(type, "Strip") == 0) {
        op->kind = DEC_STRIP;
        if (dup_json_str(json_object_get(j, "content"), &op->a, &op->alen) || op->alen == 0)
            return moet_err(err, errlen, MOET_EFORMAT, "Strip decoder needs content");
        op->strip_start = (int)json_integer_value(json_object_get(j, "start"));
        op->strip_stop = (int)json_integer_value(json_object_get(j, "stop"));
    } else {
        return moet_err(err, errlen, MOET_EUNSUP,
                        "decoder '%s' is not supported (supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, "
                        "Strip, Sequence)", type);
    }
    t->n_dec++;
    return MOET_OK;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Applies one decoder to list a, writing list b. */
static int apply_dec(const moet_tokenizer *t, const moet_dec_op *op, const moet_pieces *a, int at_start, moet_pieces *b) {
    if (op->kind == DEC_FUSE) {
        if (a->n == 0) return 0;
        return moet_pieces_add(b, a->buf, a->len); /* pieces are stored back to back */
    }
    for (size_t k = 0; k < a->n; k++) {
        const char *s = a->buf + a->off[k];
        size_t n = a->plen[k];
        moet_pieces tmp = {0};
        int rc = 0;
        switch (op->kind) {
        case DEC_BYTELEVEL:
            for (size_t i = 0; i < n && !rc;) {
                uint8_t c = (uint8_t)s[i];
                uint32_t cp = c;
                size_t cl = 1;
                if (c >= 0xc0 && c < 0xe0 && i + 1 < n) { cp = ((c & 0x1fu) << 6) | ((uint8_t)s[i + 1] & 0x3fu); cl = 2; }
                else if (c >= 0xe0 && c < 0xf0) cl = 3;
                else if (c >= 0xf0) cl = 4;
                if (i + cl > n) cl = n - i;
                if (cl <= 2 && cp < 512 && t->bl_dec[cp] >= 0) {
                    char byte = (char)t->bl_dec[cp];
                    rc = moet_pieces_add(&tmp, &byte, 1);
                } else {
                    rc = moet_pieces_add(&tmp, s + i, cl);
                }
                i += cl;
            }
            break;
        case DEC_METASPACE: {
            /* As tokenizers does: in the first token every replacement character is dropped (not only a leading
             * one); elsewhere each becomes a space. */
            int drop = op->prepend_scheme != PREPEND_NEVER && at_start && k == 0;
            for (size_t i = 0; i < n && !rc;) {
                if (i + op->repl_len <= n && memcmp(s + i, op->repl, op->repl_len) == 0) {
                    if (!drop) rc = moet_pieces_add(&tmp, " ", 1);
                    i += op->repl_len;
                } else {
                    rc = moet_pieces_add(&tmp, s + i, 1);
                    i++;
                }
            }
            break;
        }
        case DEC_REPLACE:
            for (size_t i = 0; i < n && !rc;) {
                if (i + op->alen <= n && memcmp(s + i, op->a, op->alen) == 0) {
                    rc = moet_pieces_add(&tmp, op->b, op->blen);
                    i += op->alen;
                } else {
                    rc = moet_pieces_add(&tmp, s + i, 1);
                    i++;
                }
            }
            break;
        case DEC_BYTEFALLBACK:
            if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' && hexval(s[3]) >= 0 &&
                hexval(s[4]) >= 0) {
                char byte = (char)(hexval(s[3]) * 16 + hexval(s[4]));
                rc = moet_pieces_add(&tmp, &byte, 1);
            } else {
                rc = moet_pieces_add(&tmp, s, n);
            }
            break;
        case DEC_STRIP: {
            size_t b0 = 0, e0 = n;
            for (int c = 0; c < op->strip_start && (at_start || k > 0) && e0 - b0 >= op->alen &&
                            memcmp(s + b0, op->a, op->alen) == 0; c++)
                b0 += op->alen;
            for (int c = 0; c < op->strip_stop && e0 - b0 >= op->alen && memcmp(s + e0 - op->alen, op->a, op->alen) == 0; c++)
                e0 -= op->alen;
            rc = moet_pieces_add(&tmp, s + b0, e0 - b0);
            break;
        }
        }
        if (!rc) rc = moet_pieces_add(b, tmp.buf ? tmp.buf : "", tmp.len);
        moet_pieces_free(&tmp);
        if (rc) return rc;
    }
    return 0;
}

int moet_tok_decode_chain(const moet_tokenizer *t, const int32_t *ids, size_t n, int at_start, char **out,
                          size_t *out_len) {
    moet_pieces a = {0}, b = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->tok_str[ids[i]]) { rc = -2; break; }
        rc = moet_pieces_add(&a, t->tok_str[ids[i]], t->tok_len[ids[i]]);
    }
    for (int d = 0; d < t->n_dec && !rc; d++) {
        moet_pieces_clear(&b);
        rc = apply_dec(t, &t->dec[d], &a, at_start, &b);
        moet_pieces sw = a;
        a = b;
        b = sw;
    }
    if (!rc) rc = moet_pieces_add(&a, "", 1) ? -1 : 0;
    moet_pieces_free(&b);
    if (rc) { moet_pieces_free(&a); return rc; }
    /* Drop the trailing NUL piece from the length; the buffer is contiguous. */
    *out = a.buf;
    *out_len = a.len - 1;
    free(a.off);
    free(a.plen);
    return 0;
}
