/*
 * bpe.c — the BPE model: the byte-level alphabet (GPT-2's bytes_to_unicode), initial symbols, and merges applied
 * in rank order exactly as HF tokenizers does (always the lowest-rank adjacent pair, leftmost on ties).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_int.h"

static size_t utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    o[0] = (char)(0xe0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
}

void moet_tok_bytelevel_init(moet_tokenizer *t) {
    /* Printable bytes map to themselves; the other 68 take code points 256.. in byte order. */
    for (int i = 0; i < 512; i++) t->bl_dec[i] = -1;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        uint32_t cp = keep ? (uint32_t)b : next++;
        t->bl_enc_len[b] = (uint8_t)utf8_put(t->bl_enc[b], cp);
        t->bl_dec[cp] = (int16_t)b;
    }
}

int moet_tok_push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        int32_t *ni = realloc(*ids, nc * sizeof(int32_t));
        if (!ni) return -1;
        *ids = ni;
        *cap = nc;
    }
    (*ids)[(*n)++] = id;
    return 0;
}

static size_t utf8_len(uint8_t c) { return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4; }

int moet_tok_bpe(const moet_tokenizer *t, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap) {
    /* The piece in the model's alphabet. */
    char *w = NULL;
    size_t wl = 0;
    if (t->byte_level) {
        w = malloc(len * 2 + 1);
        if (!w) return -1;
        for (size_t i = 0; i < len; i++) {
            uint8_t b = (uint8_t)s[i];
            memcpy(w + wl, t->bl_enc[b], t->bl_enc_len[b]);
            wl += t->bl_enc_len[b];
        }
    } else {
        w = malloc(len + 1);
        if (!w) return -1;
        memcpy(w, s, len);
        wl = len;
    }
    if (t->ignore_merges) {
        int32_t id = moet_strmap_get(&t->vocab, w, wl);
        if (id >= 0) { free(w); return moet_tok_push_id(ids, n, cap, id); }
    }
    /* Initial symbols: one per character of the alphabet. */
    int32_t *sym = malloc((wl + 1) * 4 * sizeof(int32_t));
    if (!sym) { free(w); return -1; }
    size_t ns = 0;
    int prev_unk = 0;
    for (size_t i = 0; i < wl;) {
        size_t cl = utf8_len((uint8_t)w[i]);
        if (i + cl > wl) cl = wl - i;
        int32_t id = moet_strmap_get(&t->vocab, w + i, cl);
        if (id >= 0) {
            sym[ns++] = id;
            prev_unk = 0;
        } else if (t->byte_fallback) {
            for (size_t k = 0; k < cl; k++) {
                char bt[8];
                snprintf(bt, sizeof bt, "<0x%02X>", (uint8_t)w[i + k]);
                int32_t bid = moet_strmap_get(&t->vocab, bt, 6);
                if (bid >= 0) sym[ns++] = bid;
                else if (t->unk_id >= 0) sym[ns++] = t->unk_id;
            }
            prev_unk = 0;
        } else if (t->unk_id >= 0) {
            if (!(t->fuse_unk && prev_unk)) sym[ns++] = t->unk_id;
            prev_unk = 1;
        }
        i += cl;
    }
    free(w);
    /* Merge: lowest rank first, leftmost among equal ranks. */
    while (ns > 1) {
        int64_t best_rank = INT64_MAX;
        size_t best = 0;
        int32_t best_id = -1;
        for (size_t i = 0; i + 1 < ns; i++) {
            int64_t v;
            if (moet_u64map_get(&t->merges, ((uint64_t)(uint32_t)sym[i] << 32) | (uint32_t)sym[i + 1], &v)) {
                int64_t rank = v >> 32;
                if (rank < best_rank) { best_rank = rank; best = i; best_id = (int32_t)(v & 0xffffffff); }
            }
        }
        if (best_id < 0) break;
        sym[best] = best_id;
        memmove(sym + best + 1, sym + best + 2, (ns - best - 2) * sizeof(int32_t));
        ns--;
    }
    int rc = 0;
    for (size_t i = 0; i < ns && !rc; i++) rc = moet_tok_push_id(ids, n, cap, sym[i]);
    free(sym);
    return rc;
}
