/*
 * tokenizer_int.h — the inside of moet_tokenizer, shared by its files:
 *   tokenizer.c  loading tokenizer.json, added tokens, encode/decode orchestration, post-processor
 *   pretok.c     normalizers (NFC/NFKC/Prepend/Replace) and pre-tokenizers (ByteLevel, Split, Metaspace, Digits)
 *   bpe.c        the byte-level alphabet, BPE merges, byte fallback
 *   decode.c     decoders (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip)
 * The pipeline is Hugging Face tokenizers': added tokens are cut out of the raw text first, each remaining
 * segment is normalized, pre-tokenized into pieces, and each piece is run through the model (BPE).
 */
#ifndef MOET_TOKENIZER_INT_H
#define MOET_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "core/strmap.h"
#include "moet.h"

#define MOET_TOK_MAX_OPS 16

/* A growable list of byte strings in one buffer. */
typedef struct {
    char *buf;
    size_t len, cap;
    size_t *off, *plen;
    size_t n, ncap;
} moet_pieces;

int moet_pieces_add(moet_pieces *p, const char *s, size_t len);
void moet_pieces_clear(moet_pieces *p);
void moet_pieces_free(moet_pieces *p);

enum { NORM_NFC, NORM_NFKC, NORM_NFD, NORM_NFKD, NORM_PREPEND, NORM_REPLACE };
enum { PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_DIGITS };
enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
enum { DEC_BYTELEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP };

typedef struct {
    int kind;
    char *a, *b;        /* Prepend: a; Replace: a (literal) -> b */
    size_t alen, blen;
    pcre2_code *re;     /* Replace with a Regex pattern */
} moet_norm_op;

typedef struct {
    int kind;
    int add_prefix_space, use_regex;      /* ByteLevel */
    pcre2_code *re;                       /* Split (regex or escaped literal), ByteLevel's GPT-2 regex */
    int behavior;                         /* Split */
    char repl[8];                         /* Metaspace replacement (UTF-8) */
    size_t repl_len;
    int prepend_scheme, split;            /* Metaspace */
    int individual_digits;                /* Digits */
} moet_pretok_op;

typedef struct {
    int kind;
    char *a, *b;
    size_t alen, blen;
    int strip_start, strip_stop;          /* Strip: counts of `a` */
    int prepend_scheme;                   /* Metaspace */
    char repl[8];
    size_t repl_len;
} moet_dec_op;

typedef struct {
    int32_t id;
    char *content;
    size_t len;
    int special, lstrip, rstrip, single_word;
} moet_added_token;

struct moet_tokenizer {
    moet_strmap vocab;            /* token string -> id */
    char **tok_str;               /* id -> token string (model vocab or added content) */
    size_t *tok_len;
    int32_t n_ids;                /* max id + 1 */
    moet_u64map merges;           /* (left << 32 | right) -> (rank << 32 | merged) */
    moet_added_token *added;
    int n_added;
    int32_t *added_first;         /* [257] CSR by first byte into added_order */
    int32_t *added_order;         /* indices into added, longest content first */
    moet_norm_op norm[MOET_TOK_MAX_OPS];
    int n_norm;
    moet_pretok_op pretok[MOET_TOK_MAX_OPS];
    int n_pretok;
    moet_dec_op dec[MOET_TOK_MAX_OPS];
    int n_dec;
    int byte_level;               /* a ByteLevel pre-tokenizer maps bytes to the byte alphabet */
    int byte_fallback, ignore_merges, fuse_unk;
    int32_t unk_id;
    int32_t post_pre[8], post_post[8];
    int n_post_pre, n_post_post;
    char bl_enc[256][4];          /* byte -> UTF-8 of its byte-alphabet code point */
    uint8_t bl_enc_len[256];
    int16_t bl_dec[512];          /* code point (< 512) -> byte, or -1 */
};

/* pretok.c */
int moet_tok_parse_normalizer(moet_tokenizer *t, const json_t *j, char *err, size_t errlen);
int moet_tok_parse_pretokenizer(moet_tokenizer *t, const json_t *j, char *err, size_t errlen);
/* Normalizes s into a fresh malloc'd string. */
int moet_tok_normalize(const moet_tokenizer *t, const char *s, size_t len, char **out, size_t *out_len);
/* Splits one normalized segment into pieces (appended to out). first: the segment starts the text. */
int moet_tok_pretokenize(const moet_tokenizer *t, const char *s, size_t len, int first, moet_pieces *out);
pcre2_code *moet_tok_regex(const char *pattern, size_t len, int literal, char *err, size_t errlen);

/* bpe.c */
void moet_tok_bytelevel_init(moet_tokenizer *t);
/* Appends the ids of one piece to *ids (grown with realloc). */
int moet_tok_bpe(const moet_tokenizer *t, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap);
int moet_tok_push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id);

/* decode.c */
int moet_tok_parse_decoder(moet_tokenizer *t, const json_t *j, char *err, size_t errlen);
/* Runs the decoder chain on tokens [ids]; at_start: ids[0] begins the text. Output malloc'd, NUL-terminated. */
int moet_tok_decode_chain(const moet_tokenizer *t, const int32_t *ids, size_t n, int at_start, char **out,
                          size_t *out_len);

#endif
