/*
 * tokenizer.c — loading tokenizer.json and running the HF tokenizers pipeline (see tokenizer_int.h).
 *
 * Supported: model BPE (byte-level or SentencePiece-style with byte_fallback, ignore_merges, unk/fuse_unk);
 * normalizers, pre-tokenizers and decoders as listed in pretok.c/decode.c; post-processors ByteLevel (ids
 * unchanged) and TemplateProcessing (single-sequence template). Anything else is refused at load, by name.
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tokenizer/tokenizer_int.h"

#define MAX_TOKEN_ID (1 << 24)

void moet_tokenizer_free(moet_tokenizer *t) {
    if (!t) return;
    moet_strmap_free(&t->vocab);
    for (int32_t i = 0; i < t->n_ids; i++) free(t->tok_str[i]);
    free(t->tok_str);
    free(t->tok_len);
    moet_u64map_free(&t->merges);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->added_first);
    free(t->added_order);
    for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].a); free(t->norm[i].b); pcre2_code_free(t->norm[i].re); }
    for (int i = 0; i < t->n_pretok; i++) pcre2_code_free(t->pretok[i].re);
    for (int i = 0; i < t->n_dec; i++) { free(t->dec[i].a); free(t->dec[i].b); }
    free(t);
}

static int set_tok_str(moet_tokenizer *t, int32_t id, const char *s, size_t len) {
    char *c = malloc(len + 1);
    if (!c) return -1;
    memcpy(c, s, len);
    c[len] = 0;
    free(t->tok_str[id]);
    t->tok_str[id] = c;
    t->tok_len[id] = len;
    return 0;
}

static int parse_post(moet_tokenizer *t, const json_t *j, char *err, size_t errlen) {
    if (!j || json_is_null(j)) return MOET_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return moet_err(err, errlen, MOET_EFORMAT, "post_processor without a type");
    if (strcmp(type, "ByteLevel") == 0) return MOET_OK; /* offsets only */
    if (strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(j, "processors"), i, v) {
            int rc = parse_post(t, v, err, errlen);
            if (rc) return rc;
        }
        return MOET_OK;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        const json_t *single = json_object_get(j, "single"), *sp = json_object_get(j, "special_tokens");
        if (!json_is_array(single)) return moet_err(err, errlen, MOET_EFORMAT, "TemplateProcessing without 'single'");
        int seen_seq = 0;
        size_t i;
        json_t *v;
        json_array_foreach(single, i, v) {
            if (json_object_get(v, "Sequence")) { seen_seq = 1; continue; }
            const char *name = json_string_value(json_object_get(json_object_get(v, "SpecialToken"), "id"));
            const json_t *ids = json_object_get(json_object_get(sp, name ? name : ""), "ids");
            if (!name || !json_is_array(ids))
                return moet_err(err, errlen, MOET_EFORMAT, "TemplateProcessing: bad special token entry %zu", i);
            size_t k;
            json_t *idv;
            json_array_foreach(ids, k, idv) {
                int32_t *dst = seen_seq ? t->post_post : t->post_pre;
                int *cnt = seen_seq ? &t->n_post_post : &t->n_post_pre;
                if (*cnt == 8 || !json_is_integer(idv) || json_integer_value(idv) < 0 ||
                    json_integer_value(idv) >= t->n_ids)
                    return moet_err(err, errlen, MOET_EFORMAT, "TemplateProcessing: bad id for '%s'", name);
                dst[(*cnt)++] = (int32_t)json_integer_value(idv);
            }
        }
        return MOET_OK;
    }
    return moet_err(err, errlen, MOET_EUNSUP,
                    "post_processor '%s' is not supported (supported: ByteLevel, TemplateProcessing, Sequence)", type);
}

static int cmp_added_len(const void *a, const void *b, void *ctx) {
    const moet_added_token *ad = ctx;
    size_t la = ad[*(const int32_t *)a].len, lb = ad[*(const int32_t *)b].len;
    return la < lb ? 1 : la > lb ? -1 : *(const int32_t *)a - *(const int32_t *)b;
}

static int build(moet_tokenizer *t, const json_t *root, char *err, size_t errlen) {
    const json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model)) return moet_err(err, errlen, MOET_EFORMAT, "missing 'model'");
    if (mtype && strcmp(mtype, "BPE") != 0)
        return moet_err(err, errlen, MOET_EUNSUP, "tokenizer model '%s' is not supported (supported: BPE)", mtype);
    const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) return moet_err(err, errlen, MOET_EFORMAT, "model.vocab must be an object");
    if (merges && !json_is_array(merges)) return moet_err(err, errlen, MOET_EFORMAT, "model.merges must be an array");
    if (added && !json_is_null(added) && !json_is_array(added))
        return moet_err(err, errlen, MOET_EFORMAT, "added_tokens must be an array");
    const char *cp = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *ews = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((cp && *cp) || (ews && *ews))
        return moet_err(err, errlen, MOET_EUNSUP, "BPE continuing_subword_prefix/end_of_word_suffix are not supported");
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0)
        return moet_err(err, errlen, MOET_EUNSUP, "BPE dropout is not supported for inference");

    /* Id space: vocab and added tokens. */
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_TOKEN_ID)
            return moet_err(err, errlen, MOET_EFORMAT, "vocab entry '%s' has a bad id", key);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    size_t i;
    json_array_foreach(added, i, val) {
        const json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_TOKEN_ID ||
            !json_is_string(json_object_get(val, "content")) || json_string_length(json_object_get(val, "content")) == 0)
            return moet_err(err, errlen, MOET_EFORMAT, "added_tokens[%zu] needs an id and non-empty content", i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) return moet_err(err, errlen, MOET_EFORMAT, "empty vocabulary");
    t->n_ids = (int32_t)max_id + 1;
    t->tok_str = calloc((size_t)t->n_ids, sizeof(char *));
    t->tok_len = calloc((size_t)t->n_ids, sizeof(size_t));
    if (!t->tok_str || !t->tok_len) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    json_object_foreach((json_t *)vocab, key, val) {
        size_t kl = strlen(key); /* jansson keys with embedded NUL are rejected by json_loadb without ALLOW_NUL */
        int32_t id = (int32_t)json_integer_value(val);
        if (moet_strmap_put(&t->vocab, key, kl, id) < 0 || set_tok_str(t, id, key, kl))
            return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    }
    t->n_added = (int)json_array_size(added);
    if (t->n_added) {
        t->added = calloc((size_t)t->n_added, sizeof(moet_added_token));
        t->added_order = calloc((size_t)t->n_added, sizeof(int32_t));
        if (!t->added || !t->added_order) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    }
    t->added_first = calloc(257, sizeof(int32_t));
    if (!t->added_first) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    json_array_foreach(added, i, val) {
        moet_added_token *a = &t->added[i];
        const json_t *c = json_object_get(val, "content");
        a->id = (int32_t)json_integer_value(json_object_get(val, "id"));
        a->len = json_string_length(c);
        a->content = malloc(a->len + 1);
        if (!a->content) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        memcpy(a->content, json_string_value(c), a->len + 1);
        a->special = json_is_true(json_object_get(val, "special"));
        a->lstrip = json_is_true(json_object_get(val, "lstrip"));
        a->rstrip = json_is_true(json_object_get(val, "rstrip"));
        a->single_word = json_is_true(json_object_get(val, "single_word"));
        if (set_tok_str(t, a->id, a->content, a->len) || moet_strmap_put(&t->vocab, a->content, a->len, a->id) < 0)
            return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        t->added_order[i] = (int32_t)i;
    }
    /* Added tokens grouped by first byte, longest first: leftmost-longest matching with one probe per byte. */
    qsort_r(t->added_order, (size_t)t->n_added, sizeof(int32_t), cmp_added_len, t->added);
    {
        int32_t *tmp = malloc(((size_t)t->n_added + 1) * sizeof(int32_t));
        if (!tmp) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        for (int k = 0; k < t->n_added; k++) t->added_first[(uint8_t)t->added[t->added_order[k]].content[0] + 1]++;
        for (int b = 0; b < 256; b++) t->added_first[b + 1] += t->added_first[b];
        int32_t fill[256];
        memcpy(fill, t->added_first, sizeof fill);
        for (int k = 0; k < t->n_added; k++) tmp[fill[(uint8_t)t->added[t->added_order[k]].content[0]]++] = t->added_order[k];
        memcpy(t->added_order, tmp, (size_t)t->n_added * sizeof(int32_t));
        free(tmp);
    }
    /* Merges: "a b" strings (older files) or ["a", "b"] pairs. */
    json_array_foreach(merges, i, val) {
        const char *a, *b;
        size_t al, bl;
        char *sp = NULL;
        if (json_is_string(val)) {
            a = json_string_value(val);
            sp = strchr(a, ' ');
            if (!sp) return moet_err(err, errlen, MOET_EFORMAT, "merges[%zu] is not 'a b'", i);
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (json_is_array(val) && json_array_size(val) == 2 && json_is_string(json_array_get(val, 0)) &&
                   json_is_string(json_array_get(val, 1))) {
            a = json_string_value(json_array_get(val, 0));
            al = json_string_length(json_array_get(val, 0));
            b = json_string_value(json_array_get(val, 1));
            bl = json_string_length(json_array_get(val, 1));
        } else {
            return moet_err(err, errlen, MOET_EFORMAT, "merges[%zu] is neither a string nor a pair", i);
        }
        char *ab = malloc(al + bl + 1);
        if (!ab) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        memcpy(ab, a, al);
        memcpy(ab + al, b, bl);
        int32_t ia = moet_strmap_get(&t->vocab, a, al), ib = moet_strmap_get(&t->vocab, b, bl),
                im = moet_strmap_get(&t->vocab, ab, al + bl);
        free(ab);
        if (ia < 0 || ib < 0 || im < 0)
            return moet_err(err, errlen, MOET_EFORMAT, "merges[%zu] uses a token missing from the vocabulary", i);
        int r = moet_u64map_put(&t->merges, ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib, ((int64_t)i << 32) | im);
        if (r < 0) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    }
    t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    t->unk_id = unk ? moet_strmap_get(&t->vocab, unk, strlen(unk)) : -1;
    moet_tok_bytelevel_init(t);
    int rc;
    if ((rc = moet_tok_parse_normalizer(t, json_object_get(root, "normalizer"), err, errlen))) return rc;
    if ((rc = moet_tok_parse_pretokenizer(t, json_object_get(root, "pre_tokenizer"), err, errlen))) return rc;
    if ((rc = moet_tok_parse_decoder(t, json_object_get(root, "decoder"), err, errlen))) return rc;
    if ((rc = parse_post(t, json_object_get(root, "post_processor"), err, errlen))) return rc;
    return MOET_OK;
}

int moet_tokenizer_load_buffer(const char *label, const char *txt, size_t len, moet_tokenizer **out, char *err,
                               size_t errlen) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(txt, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return moet_err(err, errlen, MOET_EFORMAT, "%s: invalid JSON (line %d col %d): %s", label, je.line,
                               je.column, je.text);
    moet_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) { json_decref(root); return moet_err(err, errlen, MOET_ENOMEM, "out of memory"); }
    moet_strmap_init(&t->vocab);
    moet_u64map_init(&t->merges);
    char sub[512];
    int rc = json_is_object(root) ? build(t, root, sub, sizeof sub) : moet_err(sub, sizeof sub, MOET_EFORMAT, "not an object");
    json_decref(root);
    if (rc) {
        moet_tokenizer_free(t);
        return moet_err(err, errlen, rc, "%s: %s", label, sub);
    }
    *out = t;
    return MOET_OK;
}

int moet_tokenizer_load(const char *path, moet_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    char *txt;
    size_t len;
    int rc = moet_file_read_all(path, 512u << 20, &txt, &len, err, errlen);
    if (rc) return rc;
    rc = moet_tokenizer_load_buffer(path, txt, len, out, err, errlen);
    free(txt);
    return rc;
}

/* ---- encode ---------------------------------------------------------------------------------------------------- */

static int utf8_valid(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        size_t cl;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xe0) == 0xc0) { cl = 2; cp = c & 0x1f; }
        else if ((c & 0xf0) == 0xe0) { cl = 3; cp = c & 0x0f; }
        else if ((c & 0xf8) == 0xf0) { cl = 4; cp = c & 0x07; }
        else return 0;
        if (i + cl > n) return 0;
        for (size_t k = 1; k < cl; k++) {
            if ((p[i + k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if ((cl == 2 && cp < 0x80) || (cl == 3 && cp < 0x800) || (cl == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += cl;
    }
    return 1;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static int is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || (c & 0x80);
}

/* Index into t->added of a token matching at s+i, or -1. */
static int match_added(const moet_tokenizer *t, const char *s, size_t len, size_t i) {
    uint8_t b = (uint8_t)s[i];
    for (int32_t k = t->added_first[b]; k < t->added_first[b + 1]; k++) {
        const moet_added_token *a = &t->added[t->added_order[k]];
        if (a->len > len - i || memcmp(s + i, a->content, a->len) != 0) continue;
        if (a->single_word && ((i > 0 && is_word(s[i - 1])) || (i + a->len < len && is_word(s[i + a->len])))) continue;
        return t->added_order[k];
    }
    return -1;
}

static int encode_segment(const moet_tokenizer *t, const char *s, size_t len, int first, int32_t **ids, size_t *n,
                          size_t *cap) {
    if (len == 0) return 0;
    char *norm;
    size_t nlen;
    if (moet_tok_normalize(t, s, len, &norm, &nlen)) return -1;
    moet_pieces pieces = {0};
    int rc = moet_tok_pretokenize(t, norm, nlen, first, &pieces);
    for (size_t k = 0; !rc && k < pieces.n; k++)
        rc = moet_tok_bpe(t, pieces.buf + pieces.off[k], pieces.plen[k], ids, n, cap);
    moet_pieces_free(&pieces);
    free(norm);
    return rc;
}

int moet_tokenizer_encode(const moet_tokenizer *t, const char *text, size_t len, int32_t **ids_out, size_t *n_out,
                          char *err, size_t errlen) {
    return moet_tokenizer_encode_special(t, text, len, 1, ids_out, n_out, err, errlen);
}

int moet_tokenizer_encode_special(const moet_tokenizer *t, const char *text, size_t len, int add_special,
                                  int32_t **ids_out, size_t *n_out, char *err, size_t errlen) {
    *ids_out = NULL;
    *n_out = 0;
    if (!utf8_valid(text, len)) return moet_err(err, errlen, MOET_EINVAL, "input text is not valid UTF-8");
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (int k = 0; add_special && k < t->n_post_pre && !rc; k++) rc = moet_tok_push_id(&ids, &n, &cap, t->post_pre[k]);
    size_t seg = 0;
    for (size_t i = 0; i < len && !rc;) {
        int a = t->n_added ? match_added(t, text, len, i) : -1;
        if (a < 0) { i++; continue; }
        const moet_added_token *at = &t->added[a];
        size_t b = i, e = i + at->len;
        if (at->lstrip) while (b > seg && is_ws(text[b - 1])) b--;
        if (at->rstrip) while (e < len && is_ws(text[e])) e++;
        rc = encode_segment(t, text + seg, b - seg, seg == 0, &ids, &n, &cap);
        if (!rc) rc = moet_tok_push_id(&ids, &n, &cap, at->id);
        seg = i = e;
    }
    if (!rc) rc = encode_segment(t, text + seg, len - seg, seg == 0, &ids, &n, &cap);
    for (int k = 0; add_special && k < t->n_post_post && !rc; k++) rc = moet_tok_push_id(&ids, &n, &cap, t->post_post[k]);
    if (rc) { free(ids); return moet_err(err, errlen, MOET_ENOMEM, "out of memory while tokenizing"); }
    if (!ids) ids = malloc(sizeof(int32_t)); /* a valid pointer even for zero tokens */
    if (!ids) return moet_err(err, errlen, MOET_ENOMEM, "out of memory while tokenizing");
    *ids_out = ids;
    *n_out = n;
    return MOET_OK;
}

/* ---- decode ---------------------------------------------------------------------------------------------------- */

int moet_tokenizer_decode(const moet_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len, char *err,
                          size_t errlen) {
    int rc = moet_tok_decode_chain(t, ids, n, 1, text, len);
    if (rc == -2) return moet_err(err, errlen, MOET_EINVAL, "token id outside the vocabulary");
    if (rc) return moet_err(err, errlen, MOET_ENOMEM, "out of memory while decoding");
    return MOET_OK;
}

int moet_tokenizer_token_bytes(const moet_tokenizer *t, int32_t id, int at_start, char *buf, size_t cap) {
    char *s;
    size_t n;
    if (moet_tok_decode_chain(t, &id, 1, at_start, &s, &n)) return -1;
    size_t c = n < cap ? n : cap;
    memcpy(buf, s, c);
    free(s);
    return (int)c;
}

int32_t moet_tokenizer_vocab_size(const moet_tokenizer *t) { return t->n_ids; }

int32_t moet_tokenizer_token_id(const moet_tokenizer *t, const char *token) {
    return moet_strmap_get(&t->vocab, token, strlen(token));
}
