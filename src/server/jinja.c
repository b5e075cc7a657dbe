/*
 * jinja.c — a Jinja subset interpreter for chat templates (see jinja.h for what it covers and why).
 *
 * Three stages, each small:
 *   lex     template text -> tokens. Text between tags is cut here, where jinja2 applies its whitespace rules:
 *           `{%-`/`-%}` strip all whitespace on that side, trim_blocks drops the newline after a block or comment
 *           tag, lstrip_blocks drops spaces and tabs between a line's start and a block or comment tag.
 *   parse   tokens -> a tree of statement and expression nodes, with jinja2's operator precedence (parser.py:
 *           or < and < not < compare < + - < ~ < * / // % < ** < unary, filters and tests binding tightest).
 *   render  walks the tree. Values are Python's (None, bool, int, float, str, list, dict, plus namespace and macro)
 *           and print as Python's str() does, since that is what jinja2 outputs.
 *
 * Memory: everything a compile or a render allocates comes from an arena that is freed in one go, so errors can
 * unwind with longjmp from any depth without leaking. The arena has a size cap, evaluation a step cap and the
 * output a byte cap: a template looping over range(10**9) or nesting a million brackets is an error, not a hang.
 */
#include "server/jinja.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ARENA_LIMIT (256u << 20)  /* bytes one compile or render may allocate */
#define STEP_LIMIT 20000000       /* expression evaluations per render */
#define OUT_LIMIT (16u << 20)     /* bytes of rendered output (and of any string built) */
#define DEPTH_LIMIT 200           /* parser and evaluator recursion */
#define RANGE_LIMIT 1000000       /* elements range() may produce */

/* ---- arena and errors ------------------------------------------------------------------------------------ */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct {
    chunk *head;
    size_t total;
    jmp_buf jb;
    char msg[512];
    int depth;
    long steps;
} jctx;

static _Noreturn void jfail(jctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    longjmp(c->jb, 1);
}

static void *jalloc(jctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n > ARENA_LIMIT) jfail(c, "template needs too much memory");
    if (!c->head || c->head->cap - c->head->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        if (c->total + cap > ARENA_LIMIT) jfail(c, "template needs too much memory");
        chunk *k = malloc(sizeof(chunk) + cap);
        if (!k) jfail(c, "out of memory");
        k->next = c->head;
        k->used = 0;
        k->cap = cap;
        c->head = k;
        c->total += cap;
    }
    void *p = (char *)c->head->data + c->head->used;
    c->head->used += n;
    return p;
}

static void arena_free(jctx *c) {
    for (chunk *k = c->head, *n; k; k = n) {
        n = k->next;
        free(k);
    }
    c->head = NULL;
}

/* ---- values ---------------------------------------------------------------------------------------------- */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC };

typedef struct jstr { size_t n; const char *p; } jstr;
struct jlist;
struct jdict;
struct jfunc;
typedef struct jval {
    int t;
    union {
        int64_t i;
        double f;
        const jstr *s;
        struct jlist *l;
        struct jdict *d;
        struct jfunc *fn;
    };
} jval;
typedef struct jlist { size_t n, cap; jval *v; int tup; } jlist;  /* tup: a tuple (prints as (a, b)) */
typedef struct jdict { size_t n, cap; const jstr **k; jval *v; int ns; } jdict;

static const jval UNDEF = {.t = V_UNDEF};
static const jval NONE = {.t = V_NONE};

static jval mk_bool(int b) { jval v = {.t = V_BOOL, .i = !!b}; return v; }
static jval mk_int(int64_t i) { jval v = {.t = V_INT, .i = i}; return v; }
static jval mk_float(double f) { jval v = {.t = V_FLOAT, .f = f}; return v; }

static const jstr *str_new(jctx *c, const char *p, size_t n) {
    if (n > OUT_LIMIT) jfail(c, "string longer than %u bytes", OUT_LIMIT);
    jstr *s = jalloc(c, sizeof *s + n + 1);
    char *d = (char *)(s + 1);
    if (n) memcpy(d, p, n);
    d[n] = 0;
    s->p = d;
    s->n = n;
    return s;
}
static jval mk_str(jctx *c, const char *p, size_t n) { jval v = {.t = V_STR, .s = str_new(c, p, n)}; return v; }

static jlist *list_new(jctx *c, size_t cap) {
    jlist *l = jalloc(c, sizeof *l);
    l->n = 0;
    l->tup = 0;
    l->cap = cap ? cap : 4;
    l->v = jalloc(c, l->cap * sizeof(jval));
    return l;
}
static void list_push(jctx *c, jlist *l, jval v) {
    if (l->n == l->cap) {
        jval *nv = jalloc(c, 2 * l->cap * sizeof(jval));
        memcpy(nv, l->v, l->n * sizeof(jval));
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}
static jval mk_list(jlist *l) { jval v = {.t = V_LIST, .l = l}; return v; }

static jdict *dict_new(jctx *c) {
    jdict *d = jalloc(c, sizeof *d);
    d->n = 0;
    d->cap = 4;
    d->ns = 0;
    d->k = jalloc(c, d->cap * sizeof(*d->k));
    d->v = jalloc(c, d->cap * sizeof(jval));
    return d;
}
static int str_eq(const jstr *a, const char *p, size_t n) { return a->n == n && !memcmp(a->p, p, n); }
static jval *dict_find(const jdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->k[i], k, n)) return &d->v[i];
    return NULL;
}
static void dict_set(jctx *c, jdict *d, const jstr *k, jval v) {
    jval *e = dict_find(d, k->p, k->n);
    if (e) { *e = v; return; }
    if (d->n == d->cap) {
        const jstr **nk = jalloc(c, 2 * d->cap * sizeof(*nk));
        jval *nv = jalloc(c, 2 * d->cap * sizeof(jval));
        memcpy(nk, d->k, d->n * sizeof(*nk));
        memcpy(nv, d->v, d->n * sizeof(jval));
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}
static jval mk_dict(jdict *d) { jval v = {.t = V_DICT, .d = d}; return v; }

/* Growable byte buffer in the arena. */
typedef struct { char *p; size_t n, cap; } jbuf;
static void buf_put(jctx *c, jbuf *b, const char *p, size_t n) {
    if (n > OUT_LIMIT || b->n + n > OUT_LIMIT) jfail(c, "output longer than %u bytes", OUT_LIMIT);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = jalloc(c, cap);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void buf_puts(jctx *c, jbuf *b, const char *s) { buf_put(c, b, s, strlen(s)); }
static jval buf_val(jctx *c, jbuf *b) { return mk_str(c, b->p ? b->p : "", b->n); }

/* ---- tokens ---------------------------------------------------------------------------------------------- */

enum { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct {
    int type, line;
    const jstr *s;  /* text, name, string literal value, operator */
    int64_t i;
    double f;
} jtok;

typedef struct { jtok *v; size_t n, cap; } toks;

static void tok_push(jctx *c, toks *ts, jtok t) {
    if (ts->n == ts->cap) {
        size_t cap = ts->cap ? 2 * ts->cap : 256;
        jtok *nv = jalloc(c, cap * sizeof(jtok));
        if (ts->n) memcpy(nv, ts->v, ts->n * sizeof(jtok));
        ts->v = nv;
        ts->cap = cap;
    }
    ts->v[ts->n++] = t;
}

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }
static int is_ident0(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static int line_of(const char *src, size_t pos) {
    int l = 1;
    for (size_t i = 0; i < pos; i++) l += src[i] == '\n';
    return l;
}

/* Lexes the inside of a {{ }} or {% %} tag from *pos; stops after the closing delimiter (close = '}' or '%').
 * Returns 1 if the closer had a '-' (strip the whitespace that follows). */
static int lex_tag(jctx *c, toks *ts, const char *src, size_t len, size_t *pos, char close) {
    size_t i = *pos;
    int depth = 0;
    for (;;) {
        while (i < len && is_space(src[i])) i++;
        if (i >= len) jfail(c, "line %d: unclosed tag", line_of(src, *pos));
        int line = line_of(src, i);
        char ch = src[i];
        if (depth == 0) {
            if (ch == '-' && i + 2 < len && src[i + 1] == close && src[i + 2] == '}') { *pos = i + 3; return 1; }
            if (ch == close && i + 1 < len && src[i + 1] == '}') { *pos = i + 2; return 0; }
        }
        jtok t = {.line = line};
        if (is_ident0(ch)) {
            size_t s = i;
            while (i < len && (is_ident0(src[i]) || is_digit(src[i]))) i++;
            t.type = T_NAME;
            t.s = str_new(c, src + s, i - s);
        } else if (is_digit(ch)) {
            size_t s = i;
            int fl = 0;
            while (i < len && (is_digit(src[i]) || src[i] == '_')) i++;
            if (i + 1 < len && src[i] == '.' && is_digit(src[i + 1])) {
                fl = 1;
                i++;
                while (i < len && is_digit(src[i])) i++;
            }
            if (i < len && (src[i] == 'e' || src[i] == 'E')) {
                size_t j = i + 1;
                if (j < len && (src[j] == '+' || src[j] == '-')) j++;
                if (j < len && is_digit(src[j])) {
                    fl = 1;
                    i = j;
                    while (i < len && is_digit(src[i])) i++;
                }
            }
            char num[64];
            size_t k = 0;
            for (size_t j = s; j < i && k + 1 < sizeof num; j++)
                if (src[j] != '_') num[k++] = src[j];
            num[k] = 0;
            if (fl) {
                t.type = T_FLOAT;
                t.f = strtod(num, NULL);
            } else {
                t.type = T_INT;
                char *e;
                unsigned long long u = strtoull(num, &e, 10);
                if (k >= 20 || u > INT64_MAX) jfail(c, "line %d: integer literal too large", line);
                t.i = (int64_t)u;
            }
        } else if (ch == '\'' || ch == '"') {
            char q = ch;
            i++;
            jbuf b = {0};
            for (;;) {
                if (i >= len) jfail(c, "line %d: unterminated string", line);
                char d = src[i++];
                if (d == q) break;
                if (d == '\\' && i < len) {
                    char e = src[i++];
                    const char *rep = NULL;
                    char one[2] = {e, 0};
                    switch (e) {
                    case 'n': rep = "\n"; break;
                    case 't': rep = "\t"; break;
                    case 'r': rep = "\r"; break;
                    case '\\': rep = "\\"; break;
                    case '\'': rep = "'"; break;
                    case '"': rep = "\""; break;
                    case '0': rep = ""; buf_put(c, &b, "\0", 1); break;
                    default: buf_put(c, &b, "\\", 1); rep = one; break;
                    }
                    buf_puts(c, &b, rep);
                } else {
                    buf_put(c, &b, &d, 1);
                }
            }
            t.type = T_STR;
            t.s = str_new(c, b.p ? b.p : "", b.n);
        } else {
            static const char *ops2[] = {"==", "!=", "<=", ">=", "//", "**", NULL};
            size_t n = 1;
            for (int k = 0; ops2[k]; k++)
                if (i + 1 < len && src[i] == ops2[k][0] && src[i + 1] == ops2[k][1]) n = 2;
            if (n == 1 && !strchr("+-*/%~|.,:()[]{}<>=", ch)) jfail(c, "line %d: unexpected character '%c'", line, ch);
            if (n == 1 && (ch == '(' || ch == '[' || ch == '{')) depth++;
            if (n == 1 && (ch == ')' || ch == ']' || ch == '}')) {
                if (depth == 0) jfail(c, "line %d: unbalanced '%c'", line, ch);
                depth--;
            }
            t.type = T_OP;
            t.s = str_new(c, src + i, n);
            i += n;
        }
        tok_push(c, ts, t);
    }
}

static size_t find_from(const char *src, size_t len, size_t from, const char *needle) {
    size_t nl = strlen(needle);
    for (size_t i = from; i + nl <= len; i++)
        if (!memcmp(src + i, needle, nl)) return i;
    return len;
}

static void lex(jctx *c, toks *ts, const char *src, size_t len) {
    /* jinja2 drops one trailing newline of the source (keep_trailing_newline=False) */
    if (len && src[len - 1] == '\n') len -= len > 1 && src[len - 2] == '\r' ? 2 : 1;
    size_t pos = 0;
    int strip_lead = 0;  /* the previous tag ended with '-' */
    int trim_nl = 0;     /* the previous tag was a block or comment (trim_blocks) */
    for (;;) {
        /* next tag start */
        size_t t = pos;
        for (; t + 1 < len; t++)
            if (src[t] == '{' && (src[t + 1] == '{' || src[t + 1] == '%' || src[t + 1] == '#')) break;
        if (t + 1 >= len) t = len;
        size_t a = pos, b = t;
        if (strip_lead) {
            while (a < b && is_space(src[a])) a++;
        } else if (trim_nl) {
            if (a < b && src[a] == '\n') a++;
            else if (a + 1 < b && src[a] == '\r' && src[a + 1] == '\n') a += 2;
        }
        char kind = t < len ? src[t + 1] : 0;
        char mod = t + 2 < len ? src[t + 2] : 0;
        if (t < len && mod == '-') {
            while (b > a && is_space(src[b - 1])) b--;
        } else if (t < len && (kind == '%' || kind == '#') && mod != '+') {
            size_t l = b;
            while (l > a && (src[l - 1] == ' ' || src[l - 1] == '\t')) l--;
            int at_line_start = (l > a && src[l - 1] == '\n') || (l == a && (a == 0 || src[a - 1] == '\n'));
            if (at_line_start) b = l;
        }
        if (b > a) {
            jtok tx = {.type = T_TEXT, .line = line_of(src, a), .s = str_new(c, src + a, b - a)};
            tok_push(c, ts, tx);
        }
        if (t >= len) break;
        size_t p = t + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
        if (kind == '#') {
            size_t e = find_from(src, len, p, "#}");
            if (e >= len) jfail(c, "line %d: unclosed comment", line_of(src, t));
            strip_lead = e > p && src[e - 1] == '-';
            trim_nl = 1;
            pos = e + 2;
            continue;
        }
        jtok open = {.type = kind == '{' ? T_VBEGIN : T_BBEGIN, .line = line_of(src, t)};
        /* {% raw %} ... {% endraw %}: the body is text, untouched */
        if (kind == '%') {
            size_t q = p;
            while (q < len && is_space(src[q])) q++;
            if (q + 3 <= len && !memcmp(src + q, "raw", 3) && (q + 3 == len || !is_ident0(src[q + 3]))) {
                size_t r = q + 3;
                while (r < len && is_space(src[r])) r++;
                int m = r < len && src[r] == '-';
                if (m) r++;
                if (r + 1 < len && src[r] == '%' && src[r + 1] == '}') {
                    size_t body = r + 2;
                    size_t e = body;
                    for (;;) {
                        e = find_from(src, len, e, "{%");
                        if (e >= len) jfail(c, "line %d: {%% raw %%} without {%% endraw %%}", open.line);
                        size_t k = e + 2;
                        int em = k < len && src[k] == '-';
                        if (em || (k < len && src[k] == '+')) k++;
                        while (k < len && is_space(src[k])) k++;
                        if (k + 6 <= len && !memcmp(src + k, "endraw", 6)) {
                            size_t z = k + 6;
                            while (z < len && is_space(src[z])) z++;
                            int zm = z < len && src[z] == '-';
                            if (zm) z++;
                            if (z + 1 < len && src[z] == '%' && src[z + 1] == '}') {
                                size_t bs = body, be = e;
                                if (m) while (bs < be && is_space(src[bs])) bs++;
                                else if (bs < be && src[bs] == '\n') bs++;
                                if (em) while (be > bs && is_space(src[be - 1])) be--;
                                if (be > bs) {
                                    jtok tx = {.type = T_TEXT, .line = open.line, .s = str_new(c, src + bs, be - bs)};
                                    tok_push(c, ts, tx);
                                }
                                strip_lead = zm;
                                trim_nl = 1;
                                pos = z + 2;
                                goto next;
                            }
                        }
                        e += 2;
                    }
                }
            }
        }
        tok_push(c, ts, open);
        strip_lead = lex_tag(c, ts, src, len, &p, kind == '{' ? '}' : '%');
        {
            jtok close = {.type = kind == '{' ? T_VEND : T_BEND, .line = open.line};
            tok_push(c, ts, close);
        }
        trim_nl = kind == '%';
        pos = p;
    next:;
    }
    jtok eof = {.type = T_EOF, .line = line_of(src, len)};
    tok_push(c, ts, eof);
}

/* ---- syntax tree ----------------------------------------------------------------------------------------- */

enum {
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETATTR, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE,
    N_LIT, N_NAME, N_LIST, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_BIN, N_AND, N_OR, N_NOT,
    N_NEG, N_COND
};
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE,
       OP_IN, OP_NOTIN };

typedef struct node {
    int kind, op, line, npos;
    struct node *a, *b, *c, *d;
    struct node **kids;
    int nkids;
    const jstr *name;
    const jstr **names;
    int nnames;
    jval lit;
} node;

struct jinja_template {
    jctx c;
    node *root;
};

typedef struct {
    jctx *c;
    jtok *t;
    size_t i, n;
} parser;

static node *nnew(parser *p, int kind) {
    node *n = jalloc(p->c, sizeof *n);
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->line = p->t[p->i < p->n ? p->i : p->n - 1].line;
    return n;
}

typedef struct { node **v; int n, cap; } nvec;
static void nvec_push(jctx *c, nvec *v, node *x) {
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 4;
        node **nv = jalloc(c, (size_t)cap * sizeof(node *));
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof(node *));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static jtok *cur(parser *p) { return &p->t[p->i]; }
static int is_op(parser *p, const char *op) {
    jtok *t = cur(p);
    return t->type == T_OP && str_eq(t->s, op, strlen(op));
}
static int is_name(parser *p, const char *nm) {
    jtok *t = cur(p);
    return t->type == T_NAME && str_eq(t->s, nm, strlen(nm));
}
static _Noreturn void perr(parser *p, const char *what) {
    jtok *t = cur(p);
    const char *got = t->type == T_EOF ? "end of template" : t->type == T_BEND ? "'%}'" : t->type == T_VEND ? "'}}'"
                      : t->type == T_TEXT ? "text" : NULL;
    if (got) jfail(p->c, "line %d: expected %s, got %s", t->line, what, got);
    jfail(p->c, "line %d: expected %s, got '%.*s'", t->line, what, t->s ? (int)(t->s->n > 40 ? 40 : t->s->n) : 0,
          t->s ? t->s->p : "");
}
static void expect_op(parser *p, const char *op) {
    if (!is_op(p, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        perr(p, w);
    }
    p->i++;
}
static const jstr *expect_name(parser *p) {
    if (cur(p)->type != T_NAME) perr(p, "a name");
    return p->t[p->i++].s;
}
static void expect_type(parser *p, int type, const char *what) {
    if (cur(p)->type != type) perr(p, what);
    p->i++;
}

static node *p_expr(parser *p);
static node *p_or(parser *p);
static node *p_unary(parser *p, int with_filter);

static void enter(parser *p) {
    if (++p->c->depth > DEPTH_LIMIT) jfail(p->c, "line %d: expression nested too deeply", cur(p)->line);
}
static void leave(parser *p) { p->c->depth--; }

/* (args, kw=args) after '(' was consumed */
static void p_args(parser *p, node *call) {
    nvec pos = {0}, kw = {0};
    int nkw = 0;
    const jstr **kwn = NULL;
    const jstr *names[64];
    while (!is_op(p, ")")) {
        if (cur(p)->type == T_NAME && p->i + 1 < p->n && p->t[p->i + 1].type == T_OP && str_eq(p->t[p->i + 1].s, "=", 1)) {
            if (nkw >= 64) jfail(p->c, "line %d: too many keyword arguments", cur(p)->line);
            names[nkw++] = p->t[p->i].s;
            p->i += 2;
            nvec_push(p->c, &kw, p_expr(p));
        } else {
            if (nkw) jfail(p->c, "line %d: positional argument after keyword argument", cur(p)->line);
            nvec_push(p->c, &pos, p_expr(p));
        }
        if (!is_op(p, ",")) break;
        p->i++;
    }
    expect_op(p, ")");
    call->npos = pos.n;
    call->nkids = pos.n + kw.n;
    call->kids = jalloc(p->c, (size_t)(call->nkids ? call->nkids : 1) * sizeof(node *));
    for (int i = 0; i < pos.n; i++) call->kids[i] = pos.v[i];
    for (int i = 0; i < kw.n; i++) call->kids[pos.n + i] = kw.v[i];
    if (nkw) {
        kwn = jalloc(p->c, (size_t)nkw * sizeof(*kwn));
        memcpy(kwn, names, (size_t)nkw * sizeof(*kwn));
    }
    call->names = kwn;
    call->nnames = nkw;
}

static node *p_primary(parser *p) {
    jtok *t = cur(p);
    node *n;
    if (t->type == T_NAME) {
        p->i++;
        if (str_eq(t->s, "true", 4) || str_eq(t->s, "True", 4) || str_eq(t->s, "false", 5) || str_eq(t->s, "False", 5)) {
            n = nnew(p, N_LIT);
            n->lit = mk_bool(t->s->p[0] == 't' || t->s->p[0] == 'T');
        } else if (str_eq(t->s, "none", 4) || str_eq(t->s, "None", 4)) {
            n = nnew(p, N_LIT);
            n->lit = NONE;
        } else {
            n = nnew(p, N_NAME);
            n->name = t->s;
        }
        return n;
    }
    if (t->type == T_STR) {
        jbuf b = {0};
        while (cur(p)->type == T_STR) {  /* adjacent literals concatenate */
            buf_put(p->c, &b, cur(p)->s->p, cur(p)->s->n);
            p->i++;
        }
        n = nnew(p, N_LIT);
        n->lit = buf_val(p->c, &b);
        return n;
    }
    if (t->type == T_INT || t->type == T_FLOAT) {
        p->i++;
        n = nnew(p, N_LIT);
        n->lit = t->type == T_INT ? mk_int(t->i) : mk_float(t->f);
        return n;
    }
    if (is_op(p, "(")) {
        p->i++;
        if (is_op(p, ")")) { p->i++; n = nnew(p, N_LIST); n->op = 1; return n; }  /* () : empty tuple */
        node *e = p_expr(p);
        if (is_op(p, ",")) {
            nvec v = {0};
            nvec_push(p->c, &v, e);
            while (is_op(p, ",")) {
                p->i++;
                if (is_op(p, ")")) break;
                nvec_push(p->c, &v, p_expr(p));
            }
            e = nnew(p, N_LIST);
            e->op = 1;
            e->kids = v.v;
            e->nkids = v.n;
        }
        expect_op(p, ")");
        return e;
    }
    if (is_op(p, "[")) {
        p->i++;
        nvec v = {0};
        while (!is_op(p, "]")) {
            nvec_push(p->c, &v, p_expr(p));
            if (!is_op(p, ",")) break;
            p->i++;
        }
        expect_op(p, "]");
        n = nnew(p, N_LIST);
        n->kids = v.v;
        n->nkids = v.n;
        return n;
    }
    if (is_op(p, "{")) {
        p->i++;
        nvec v = {0};
        while (!is_op(p, "}")) {
            nvec_push(p->c, &v, p_expr(p));
            expect_op(p, ":");
            nvec_push(p->c, &v, p_expr(p));
            if (!is_op(p, ",")) break;
            p->i++;
        }
        expect_op(p, "}");
        n = nnew(p, N_DICT);
        n->kids = v.v;
        n->nkids = v.n;
        return n;
    }
    perr(p, "an expression");
}

static node *p_postfix(parser *p, node *n) {
    for (;;) {
        if (is_op(p, ".")) {
            p->i++;
            node *a = nnew(p, N_ATTR);
            a->a = n;
            if (cur(p)->type == T_INT) {  /* x.0 */
                a->kind = N_ITEM;
                a->b = nnew(p, N_LIT);
                a->b->lit = mk_int(cur(p)->i);
                p->i++;
            } else {
                a->name = expect_name(p);
            }
            n = a;
        } else if (is_op(p, "[")) {
            p->i++;
            node *s[3] = {NULL, NULL, NULL};
            int k = 0, slice = 0;
            for (;;) {
                if (is_op(p, ":")) {
                    slice = 1;
                    p->i++;
                    if (++k > 2) perr(p, "']'");
                    continue;
                }
                if (is_op(p, "]")) break;
                if (s[k]) perr(p, "':' or ']'");
                s[k] = p_expr(p);
            }
            expect_op(p, "]");
            node *a = nnew(p, slice ? N_SLICE : N_ITEM);
            a->a = n;
            if (slice) {
                a->b = s[0];
                a->c = s[1];
                a->d = s[2];
            } else {
                if (!s[0]) perr(p, "an index");
                a->b = s[0];
            }
            n = a;
        } else if (is_op(p, "(")) {
            p->i++;
            node *a = nnew(p, N_CALL);
            a->a = n;
            p_args(p, a);
            n = a;
        } else {
            return n;
        }
    }
}

static node *p_filters(parser *p, node *n) {
    for (;;) {
        if (is_op(p, "|")) {
            p->i++;
            node *f = nnew(p, N_FILTER);
            f->a = n;
            f->name = expect_name(p);
            if (is_op(p, "(")) {
                p->i++;
                p_args(p, f);
            }
            n = f;
        } else if (is_name(p, "is")) {
            p->i++;
            node *f = nnew(p, N_TEST);
            if (is_name(p, "not")) { p->i++; f->op = 1; }
            f->a = n;
            f->name = expect_name(p);
            if (is_op(p, "(")) {
                p->i++;
                p_args(p, f);
            } else {
                jtok *t = cur(p);
                int arg = t->type == T_STR || t->type == T_INT || t->type == T_FLOAT || is_op(p, "[") || is_op(p, "{") ||
                          (t->type == T_NAME && !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and") &&
                           !is_name(p, "if") && !is_name(p, "in") && !is_name(p, "not") && !is_name(p, "is"));
                if (arg) {
                    f->kids = jalloc(p->c, sizeof(node *));
                    f->kids[0] = p_postfix(p, p_primary(p));
                    f->nkids = f->npos = 1;
                }
            }
            n = f;
        } else {
            return n;
        }
    }
}

static node *p_unary(parser *p, int with_filter) {
    enter(p);
    node *n;
    if (is_op(p, "-") || is_op(p, "+")) {
        int neg = is_op(p, "-");
        p->i++;
        node *x = p_unary(p, 0);
        if (neg) {
            n = nnew(p, N_NEG);
            n->a = x;
        } else {
            n = x;
        }
    } else {
        n = p_postfix(p, p_primary(p));
    }
    if (with_filter) n = p_filters(p, n);
    leave(p);
    return n;
}

static node *bin(parser *p, int op, node *a, node *b) {
    node *n = nnew(p, N_BIN);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static node *p_pow(parser *p) {
    node *n = p_unary(p, 1);
    while (is_op(p, "**")) {
        p->i++;
        n = bin(p, OP_POW, n, p_unary(p, 1));
    }
    return n;
}
static node *p_math2(parser *p) {
    node *n = p_pow(p);
    for (;;) {
        int op = is_op(p, "*") ? OP_MUL : is_op(p, "/") ? OP_DIV : is_op(p, "//") ? OP_FDIV : is_op(p, "%") ? OP_MOD : -1;
        if (op < 0) return n;
        p->i++;
        n = bin(p, op, n, p_pow(p));
    }
}
static node *p_concat(parser *p) {
    node *n = p_math2(p);
    while (is_op(p, "~")) {
        p->i++;
        n = bin(p, OP_CAT, n, p_math2(p));
    }
    return n;
}
static node *p_math1(parser *p) {
    node *n = p_concat(p);
    for (;;) {
        int op = is_op(p, "+") ? OP_ADD : is_op(p, "-") ? OP_SUB : -1;
        if (op < 0) return n;
        p->i++;
        n = bin(p, op, n, p_concat(p));
    }
}
static node *p_compare(parser *p) {
    node *n = p_math1(p);
    for (;;) {
        int op = is_op(p, "==") ? OP_EQ : is_op(p, "!=") ? OP_NE : is_op(p, "<") ? OP_LT : is_op(p, ">") ? OP_GT
                 : is_op(p, "<=") ? OP_LE : is_op(p, ">=") ? OP_GE : is_name(p, "in") ? OP_IN : -1;
        if (op < 0 && is_name(p, "not") && p->i + 1 < p->n && p->t[p->i + 1].type == T_NAME &&
            str_eq(p->t[p->i + 1].s, "in", 2)) {
            p->i++;
            op = OP_NOTIN;
        }
        if (op < 0) return n;
        p->i++;
        n = bin(p, op, n, p_math1(p));
    }
}
static node *p_not(parser *p) {
    if (is_name(p, "not")) {
        p->i++;
        enter(p);
        node *n = nnew(p, N_NOT);
        n->a = p_not(p);
        leave(p);
        return n;
    }
    return p_compare(p);
}
static node *p_and(parser *p) {
    node *n = p_not(p);
    while (is_name(p, "and")) {
        p->i++;
        node *x = nnew(p, N_AND);
        x->a = n;
        x->b = p_not(p);
        n = x;
    }
    return n;
}
static node *p_or(parser *p) {
    node *n = p_and(p);
    while (is_name(p, "or")) {
        p->i++;
        node *x = nnew(p, N_OR);
        x->a = n;
        x->b = p_and(p);
        n = x;
    }
    return n;
}
static node *p_expr(parser *p) {
    enter(p);
    node *n = p_or(p);
    while (is_name(p, "if")) {
        p->i++;
        node *x = nnew(p, N_COND);
        x->b = n;
        x->a = p_or(p);
        if (is_name(p, "else")) {
            p->i++;
            x->c = p_expr(p);
        }
        n = x;
    }
    leave(p);
    return n;
}

/* Statements. p_body parses until a {% NAME %} whose name is in ends (not consumed) or EOF (ends == NULL). */
static node *p_body(parser *p, const char *const *ends);

static int at_block(parser *p, const char *const *ends) {
    if (cur(p)->type != T_BBEGIN || p->i + 1 >= p->n || p->t[p->i + 1].type != T_NAME) return 0;
    for (int k = 0; ends && ends[k]; k++)
        if (str_eq(p->t[p->i + 1].s, ends[k], strlen(ends[k]))) return 1;
    return 0;
}

static void end_tag(parser *p, const char *name) {
    expect_type(p, T_BBEGIN, "'{%'");
    if (!is_name(p, name)) {
        char w[48];
        snprintf(w, sizeof w, "'%s'", name);
        perr(p, w);
    }
    p->i++;
    expect_type(p, T_BEND, "'%}'");
}

static node *p_if(parser *p) {
    node *n = nnew(p, N_IF);
    n->a = p_expr(p);
    expect_type(p, T_BEND, "'%}'");
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    n->b = p_body(p, ends);
    expect_type(p, T_BBEGIN, "'{%'");
    if (is_name(p, "elif")) {
        p->i++;
        n->c = p_if(p);  /* consumes through endif */
        return n;
    }
    if (is_name(p, "else")) {
        p->i++;
        expect_type(p, T_BEND, "'%}'");
        static const char *const e2[] = {"endif", NULL};
        n->c = p_body(p, e2);
        end_tag(p, "endif");
        return n;
    }
    if (!is_name(p, "endif")) perr(p, "'endif'");
    p->i++;
    expect_type(p, T_BEND, "'%}'");
    return n;
}

static node *p_stmt(parser *p) {
    /* at T_BBEGIN */
    int line = cur(p)->line;
    p->i++;
    const jstr *kw = expect_name(p);
    node *n;
    if (str_eq(kw, "if", 2)) return p_if(p);
    if (str_eq(kw, "for", 3)) {
        n = nnew(p, N_FOR);
        const jstr *nm[8];
        int k = 0;
        if (is_op(p, "(")) p->i++;
        for (;;) {
            if (k == 8) jfail(p->c, "line %d: too many loop variables", line);
            nm[k++] = expect_name(p);
            if (!is_op(p, ",")) break;
            p->i++;
        }
        if (is_op(p, ")")) p->i++;
        n->names = jalloc(p->c, (size_t)k * sizeof(*n->names));
        memcpy(n->names, nm, (size_t)k * sizeof(*nm));
        n->nnames = k;
        if (!is_name(p, "in")) perr(p, "'in'");
        p->i++;
        n->a = p_or(p);
        if (is_name(p, "if")) {
            p->i++;
            n->d = p_or(p);
        }
        if (is_name(p, "recursive")) jfail(p->c, "line %d: recursive loops are not supported", line);
        expect_type(p, T_BEND, "'%}'");
        static const char *const ends[] = {"else", "endfor", NULL};
        n->b = p_body(p, ends);
        expect_type(p, T_BBEGIN, "'{%'");
        if (is_name(p, "else")) {
            p->i++;
            expect_type(p, T_BEND, "'%}'");
            static const char *const e2[] = {"endfor", NULL};
            n->c = p_body(p, e2);
            end_tag(p, "endfor");
            return n;
        }
        if (!is_name(p, "endfor")) perr(p, "'endfor'");
        p->i++;
        expect_type(p, T_BEND, "'%}'");
        return n;
    }
    if (str_eq(kw, "set", 3)) {
        const jstr *target = expect_name(p);
        if (is_op(p, ".")) {
            p->i++;
            n = nnew(p, N_SETATTR);
            n->names = jalloc(p->c, sizeof(*n->names));
            n->names[0] = target;
            n->nnames = 1;
            n->name = expect_name(p);
            expect_op(p, "=");
            n->a = p_expr(p);
            expect_type(p, T_BEND, "'%}'");
            return n;
        }
        if (cur(p)->type == T_BEND) {  /* block set */
            p->i++;
            n = nnew(p, N_SETBLOCK);
            n->name = target;
            static const char *const ends[] = {"endset", NULL};
            n->b = p_body(p, ends);
            end_tag(p, "endset");
            return n;
        }
        n = nnew(p, N_SET);
        n->name = target;
        expect_op(p, "=");
        n->a = p_expr(p);
        if (is_op(p, ",")) {  /* set x = a, b  (a tuple) */
            node *l = nnew(p, N_LIST);
            nvec v = {0};
            nvec_push(p->c, &v, n->a);
            while (is_op(p, ",")) {
                p->i++;
                nvec_push(p->c, &v, p_expr(p));
            }
            l->kids = v.v;
            l->nkids = v.n;
            n->a = l;
        }
        expect_type(p, T_BEND, "'%}'");
        return n;
    }
    if (str_eq(kw, "macro", 5)) {
        n = nnew(p, N_MACRO);
        n->name = expect_name(p);
        expect_op(p, "(");
        const jstr *nm[32];
        node *def[32];
        int k = 0;
        while (!is_op(p, ")")) {
            if (k == 32) jfail(p->c, "line %d: too many macro parameters", line);
            nm[k] = expect_name(p);
            def[k] = NULL;
            if (is_op(p, "=")) {
                p->i++;
                def[k] = p_expr(p);
            }
            k++;
            if (!is_op(p, ",")) break;
            p->i++;
        }
        expect_op(p, ")");
        expect_type(p, T_BEND, "'%}'");
        n->names = jalloc(p->c, (size_t)(k ? k : 1) * sizeof(*n->names));
        n->kids = jalloc(p->c, (size_t)(k ? k : 1) * sizeof(node *));
        memcpy(n->names, nm, (size_t)k * sizeof(*nm));
        memcpy(n->kids, def, (size_t)k * sizeof(*def));
        n->nnames = n->nkids = k;
        static const char *const ends[] = {"endmacro", NULL};
        n->b = p_body(p, ends);
        end_tag(p, "endmacro");
        return n;
    }
    if (str_eq(kw, "break", 5) || str_eq(kw, "continue", 8)) {
        n = nnew(p, kw->p[0] == 'b' ? N_BREAK : N_CONTINUE);
        expect_type(p, T_BEND, "'%}'");
        return n;
    }
    if (str_eq(kw, "generation", 10)) {  /* transformers' assistant-mask marker: renders its body */
        expect_type(p, T_BEND, "'%}'");
        static const char *const ends[] = {"endgeneration", NULL};
        n = p_body(p, ends);
        end_tag(p, "endgeneration");
        return n;
    }
    jfail(p->c, "line %d: unknown or unsupported tag '%.*s'", line, (int)(kw->n > 40 ? 40 : kw->n), kw->p);
}

static node *p_body(parser *p, const char *const *ends) {
    enter(p);
    node *body = nnew(p, N_BODY);
    nvec v = {0};
    for (;;) {
        jtok *t = cur(p);
        if (t->type == T_EOF) {
            if (ends) {
                char w[64];
                snprintf(w, sizeof w, "'{%% %s %%}'", ends[ends[1] ? 1 : 0]);
                perr(p, w);
            }
            break;
        }
        if (at_block(p, ends)) break;
        if (t->type == T_TEXT) {
            node *x = nnew(p, N_TEXT);
            x->lit.t = V_STR;
            x->lit.s = t->s;
            p->i++;
            nvec_push(p->c, &v, x);
        } else if (t->type == T_VBEGIN) {
            p->i++;
            node *x = nnew(p, N_OUT);
            x->a = p_expr(p);
            expect_type(p, T_VEND, "'}}'");
            nvec_push(p->c, &v, x);
        } else if (t->type == T_BBEGIN) {
            if (p->i + 1 < p->n && p->t[p->i + 1].type == T_NAME) {
                const jstr *k = p->t[p->i + 1].s;
                static const char *const stray[] = {"endif", "endfor", "else", "elif", "endset", "endmacro",
                                                    "endgeneration", NULL};
                for (int s = 0; stray[s]; s++)
                    if (str_eq(k, stray[s], strlen(stray[s])))
                        jfail(p->c, "line %d: unexpected '{%% %s %%}'", t->line, stray[s]);
            }
            nvec_push(p->c, &v, p_stmt(p));
        } else {
            perr(p, "text or a tag");
        }
    }
    body->kids = v.v;
    body->nkids = v.n;
    leave(p);
    return body;
}

/* The setjmp lives here so that nothing it returns to is a local modified after it (longjmp clobbering). */
static int compile_into(jinja_template *t, const char *src, size_t len) {
    if (setjmp(t->c.jb)) return -1;
    toks ts = {0};
    lex(&t->c, &ts, src, len);
    parser p = {.c = &t->c, .t = ts.v, .i = 0, .n = ts.n};
    t->root = p_body(&p, NULL);
    return 0;
}

jinja_template *jinja_compile(const char *src, size_t len, char *err, size_t errlen) {
    jinja_template *t = calloc(1, sizeof *t);
    if (!t) {
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (compile_into(t, src, len)) {
        if (err && errlen) snprintf(err, errlen, "chat template: %s", t->c.msg);
        arena_free(&t->c);
        free(t);
        return NULL;
    }
    return t;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    arena_free(&t->c);
    free(t);
}

/* ---- rendering ------------------------------------------------------------------------------------------- */

enum { F_BUILTIN, F_METHOD, F_MACRO };
enum { B_RANGE, B_NAMESPACE, B_DICT, B_RAISE, B_STRFTIME };

typedef struct jfunc {
    int kind, id;
    const jstr *name;  /* method name */
    jval self;
    const node *macro;
} jfunc;

typedef struct frame {
    struct frame *parent;
    jdict *vars;
} frame;

typedef struct {
    jctx *c;         /* the render's arena */
    frame *root;
    int ctl;         /* 1 break, 2 continue */
} rstate;

static jval fn_val(jctx *c, int kind, int id, const jstr *name, jval self, const node *macro) {
    jfunc *f = jalloc(c, sizeof *f);
    f->kind = kind;
    f->id = id;
    f->name = name;
    f->self = self;
    f->macro = macro;
    jval v = {.t = V_FUNC, .fn = f};
    return v;
}

static jval lookup(frame *f, const jstr *name) {
    for (; f; f = f->parent) {
        jval *v = dict_find(f->vars, name->p, name->n);
        if (v) return *v;
    }
    return UNDEF;
}

static int truthy(jval v) {
    switch (v.t) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0.0;
    case V_STR: return v.s->n != 0;
    case V_LIST: return v.l->n != 0;
    case V_DICT: return v.d->n != 0;
    default: return 1;
    }
}

static const char *type_name(jval v) {
    static const char *n[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "function"};
    return n[v.t];
}

static void fmt_float(double f, char *out, size_t cap) {
    if (isnan(f)) { snprintf(out, cap, "nan"); return; }
    if (isinf(f)) { snprintf(out, cap, f < 0 ? "-inf" : "inf"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, f);
        if (strtod(out, NULL) == f) break;
    }
    if (!strpbrk(out, ".en")) {
        size_t l = strlen(out);
        if (l + 3 <= cap) memcpy(out + l, ".0", 3);
    }
}

/* Python's repr() of a str: single quotes unless the text has ' and no ". */
static void repr_str(jctx *c, jbuf *b, const jstr *s) {
    char q = memchr(s->p, '\'', s->n) && !memchr(s->p, '"', s->n) ? '"' : '\'';
    buf_put(c, b, &q, 1);
    for (size_t i = 0; i < s->n; i++) {
        unsigned char ch = (unsigned char)s->p[i];
        char e[8];
        if (ch == (unsigned char)q || ch == '\\') { e[0] = '\\'; e[1] = (char)ch; buf_put(c, b, e, 2); }
        else if (ch == '\n') buf_put(c, b, "\\n", 2);
        else if (ch == '\r') buf_put(c, b, "\\r", 2);
        else if (ch == '\t') buf_put(c, b, "\\t", 2);
        else if (ch < 0x20 || ch == 0x7f) { snprintf(e, sizeof e, "\\x%02x", ch); buf_put(c, b, e, 4); }
        else buf_put(c, b, (const char *)&ch, 1);
    }
    buf_put(c, b, &q, 1);
}

static void to_str(jctx *c, jbuf *b, jval v, int repr) {
    char num[64];
    switch (v.t) {
    case V_UNDEF: break;
    case V_NONE: buf_puts(c, b, "None"); break;
    case V_BOOL: buf_puts(c, b, v.i ? "True" : "False"); break;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v.i); buf_puts(c, b, num); break;
    case V_FLOAT: fmt_float(v.f, num, sizeof num); buf_puts(c, b, num); break;
    case V_STR: if (repr) repr_str(c, b, v.s); else buf_put(c, b, v.s->p, v.s->n); break;
    case V_LIST:
        buf_puts(c, b, v.l->tup ? "(" : "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) buf_puts(c, b, ", ");
            to_str(c, b, v.l->v[i], 1);
        }
        buf_puts(c, b, v.l->tup ? (v.l->n == 1 ? ",)" : ")") : "]");
        break;
    case V_DICT:
        if (v.d->ns) { buf_puts(c, b, "<Namespace>"); break; }
        buf_puts(c, b, "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) buf_puts(c, b, ", ");
            repr_str(c, b, v.d->k[i]);
            buf_puts(c, b, ": ");
            to_str(c, b, v.d->v[i], 1);
        }
        buf_puts(c, b, "}");
        break;
    case V_FUNC: buf_puts(c, b, "<function>"); break;
    }
}

static const jstr *as_str(jctx *c, jval v) {
    if (v.t == V_STR) return v.s;
    jbuf b = {0};
    to_str(c, &b, v, 0);
    return str_new(c, b.p ? b.p : "", b.n);
}

/* JSON as transformers' tojson writes it: json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=...). */
static void json_str(jctx *c, jbuf *b, const char *p, size_t n) {
    buf_puts(c, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        char e[8];
        switch (ch) {
        case '"': buf_puts(c, b, "\\\""); break;
        case '\\': buf_puts(c, b, "\\\\"); break;
        case '\n': buf_puts(c, b, "\\n"); break;
        case '\r': buf_puts(c, b, "\\r"); break;
        case '\t': buf_puts(c, b, "\\t"); break;
        case '\b': buf_puts(c, b, "\\b"); break;
        case '\f': buf_puts(c, b, "\\f"); break;
        default:
            if (ch < 0x20) { snprintf(e, sizeof e, "\\u%04x", ch); buf_puts(c, b, e); }
            else buf_put(c, b, (const char *)&ch, 1);
        }
    }
    buf_puts(c, b, "\"");
}

static int key_cmp(const void *x, const void *y) {
    const jstr *a = *(const jstr *const *)x, *b = *(const jstr *const *)y;
    size_t n = a->n < b->n ? a->n : b->n;
    int r = memcmp(a->p, b->p, n);
    return r ? r : (a->n > b->n) - (a->n < b->n);
}

static void to_json(jctx *c, jbuf *b, jval v, int indent, int level, int sort) {
    char num[64];
    if (level > DEPTH_LIMIT) jfail(c, "tojson: value nested too deeply");
    switch (v.t) {
    case V_UNDEF: case V_NONE: buf_puts(c, b, "null"); return;
    case V_BOOL: buf_puts(c, b, v.i ? "true" : "false"); return;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v.i); buf_puts(c, b, num); return;
    case V_FLOAT:
        if (isnan(v.f)) buf_puts(c, b, "NaN");
        else if (isinf(v.f)) buf_puts(c, b, v.f < 0 ? "-Infinity" : "Infinity");
        else { fmt_float(v.f, num, sizeof num); buf_puts(c, b, num); }
        return;
    case V_STR: json_str(c, b, v.s->p, v.s->n); return;
    case V_FUNC: jfail(c, "tojson: a function is not JSON serializable");
    default: break;
    }
    int is_list = v.t == V_LIST;
    size_t n = is_list ? v.l->n : v.d->n;
    buf_puts(c, b, is_list ? "[" : "{");
    if (n == 0) { buf_puts(c, b, is_list ? "]" : "}"); return; }
    size_t *order = NULL;
    if (!is_list && sort) {
        const jstr **ks = jalloc(c, n * sizeof(*ks));
        memcpy(ks, v.d->k, n * sizeof(*ks));
        qsort(ks, n, sizeof(*ks), key_cmp);
        order = jalloc(c, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                if (v.d->k[j] == ks[i]) order[i] = j;
    }
    for (size_t i = 0; i < n; i++) {
        if (i) buf_puts(c, b, indent >= 0 ? "," : ", ");
        if (indent >= 0) {
            buf_puts(c, b, "\n");
            for (int k = 0; k < indent * (level + 1); k++) buf_puts(c, b, " ");
        }
        if (is_list) {
            to_json(c, b, v.l->v[i], indent, level + 1, sort);
        } else {
            size_t j = order ? order[i] : i;
            json_str(c, b, v.d->k[j]->p, v.d->k[j]->n);
            buf_puts(c, b, ": ");
            to_json(c, b, v.d->v[j], indent, level + 1, sort);
        }
    }
    if (indent >= 0) {
        buf_puts(c, b, "\n");
        for (int k = 0; k < indent * level; k++) buf_puts(c, b, " ");
    }
    buf_puts(c, b, is_list ? "]" : "}");
}

static int vequal(jval a, jval b) {
    if ((a.t == V_INT || a.t == V_BOOL || a.t == V_FLOAT) && (b.t == V_INT || b.t == V_BOOL || b.t == V_FLOAT)) {
        if (a.t == V_FLOAT || b.t == V_FLOAT)
            return (a.t == V_FLOAT ? a.f : (double)a.i) == (b.t == V_FLOAT ? b.f : (double)b.i);
        return a.i == b.i;
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return a.s->n == b.s->n && !memcmp(a.s->p, b.s->p, a.s->n);
    case V_LIST:
        if (a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++)
            if (!vequal(a.l->v[i], b.l->v[i])) return 0;
        return 1;
    case V_DICT:
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            jval *o = dict_find(b.d, a.d->k[i]->p, a.d->k[i]->n);
            if (!o || !vequal(a.d->v[i], *o)) return 0;
        }
        return 1;
    default: return a.fn == b.fn;
    }
}

static int is_num(jval v) { return v.t == V_INT || v.t == V_BOOL || v.t == V_FLOAT; }
static double num_f(jval v) { return v.t == V_FLOAT ? v.f : (double)v.i; }

static int vcompare(jctx *c, jval a, jval b, int line) {
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return (a.i > b.i) - (a.i < b.i);
        double x = num_f(a), y = num_f(b);
        return (x > y) - (x < y);
    }
    if (a.t == V_STR && b.t == V_STR) return key_cmp(&a.s, &b.s);
    jfail(c, "line %d: '<' not supported between '%s' and '%s'", line, type_name(a), type_name(b));
}

static int vcontains(jctx *c, jval hay, jval needle, int line) {
    switch (hay.t) {
    case V_STR:
        if (needle.t != V_STR) jfail(c, "line %d: 'in <string>' requires a string", line);
        if (needle.s->n == 0) return 1;
        for (size_t i = 0; i + needle.s->n <= hay.s->n; i++)
            if (!memcmp(hay.s->p + i, needle.s->p, needle.s->n)) return 1;
        return 0;
    case V_LIST:
        for (size_t i = 0; i < hay.l->n; i++)
            if (vequal(hay.l->v[i], needle)) return 1;
        return 0;
    case V_DICT:
        return needle.t == V_STR && dict_find(hay.d, needle.s->p, needle.s->n) != NULL;
    case V_UNDEF:
        return 0;
    default:
        jfail(c, "line %d: argument of type '%s' is not iterable", line, type_name(hay));
    }
}

/* UTF-8 code point boundaries of a string (Python indexes and iterates str by code point). */
static size_t *cp_offsets(jctx *c, const jstr *s, size_t *n) {
    size_t *o = jalloc(c, (s->n + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        if (((unsigned char)s->p[i] & 0xC0) != 0x80) o[k++] = i;
    o[k] = s->n;
    *n = k;
    return o;
}

/* Elements of an iterable as a list: list items, dict keys, string code points. */
static jlist *iter_list(jctx *c, jval v, int line) {
    switch (v.t) {
    case V_LIST: return v.l;
    case V_UNDEF: case V_NONE:
        if (v.t == V_NONE) jfail(c, "line %d: 'NoneType' object is not iterable", line);
        return list_new(c, 1);
    case V_DICT: {
        jlist *l = list_new(c, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) {
            jval k = {.t = V_STR, .s = v.d->k[i]};
            list_push(c, l, k);
        }
        return l;
    }
    case V_STR: {
        size_t n;
        size_t *o = cp_offsets(c, v.s, &n);
        jlist *l = list_new(c, n);
        for (size_t i = 0; i < n; i++) list_push(c, l, mk_str(c, v.s->p + o[i], o[i + 1] - o[i]));
        return l;
    }
    default: jfail(c, "line %d: '%s' object is not iterable", line, type_name(v));
    }
}

static jval eval(rstate *r, const node *n, frame *f);
static void render(rstate *r, const node *n, frame *f, jbuf *out);

static int64_t want_int(jctx *c, jval v, const char *what, int line) {
    if (v.t == V_INT || v.t == V_BOOL) return v.i;
    jfail(c, "line %d: %s must be an integer, not '%s'", line, what, type_name(v));
}

static jval getitem(jctx *c, jval obj, jval key, int line) {
    if (obj.t == V_DICT) {
        if (key.t != V_STR) return UNDEF;
        jval *v = dict_find(obj.d, key.s->p, key.s->n);
        return v ? *v : UNDEF;
    }
    if (obj.t == V_LIST || obj.t == V_STR) {
        if (key.t != V_INT && key.t != V_BOOL) return UNDEF;
        int64_t i = key.i;
        size_t n, *o = NULL;
        if (obj.t == V_LIST) n = obj.l->n;
        else o = cp_offsets(c, obj.s, &n);
        if (i < 0) i += (int64_t)n;
        if (i < 0 || (uint64_t)i >= n) return UNDEF;
        return obj.t == V_LIST ? obj.l->v[i] : mk_str(c, obj.s->p + o[i], o[i + 1] - o[i]);
    }
    if (obj.t == V_UNDEF) jfail(c, "line %d: cannot index an undefined value", line);
    return UNDEF;
}

static const char *const str_methods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                                          "upper", "lower", "title", "capitalize", "replace", "find", "rfind", "count",
                                          "join", "splitlines", "isdigit", "isalpha", "isspace", "format", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

static int in_names(const jstr *s, const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (str_eq(s, names[i], strlen(names[i]))) return 1;
    return 0;
}

static jval getattr(jctx *c, jval obj, const jstr *name, int line) {
    if (obj.t == V_DICT) {
        jval *v = dict_find(obj.d, name->p, name->n);
        if (v) return *v;
        if (!obj.d->ns && in_names(name, dict_methods)) return fn_val(c, F_METHOD, 0, name, obj, NULL);
        return UNDEF;
    }
    if (obj.t == V_STR && in_names(name, str_methods)) return fn_val(c, F_METHOD, 0, name, obj, NULL);
    if (obj.t == V_UNDEF)
        jfail(c, "line %d: '%.*s' of an undefined value", line, (int)(name->n > 40 ? 40 : name->n), name->p);
    return UNDEF;
}

/* Arguments of a call or filter, evaluated. */
typedef struct {
    int npos, nkw;
    jval pos[16];
    const jstr **kwn;
    jval kw[16];
} jargs;

static void eval_args(rstate *r, const node *n, frame *f, jargs *a) {
    a->npos = n->npos;
    a->nkw = n->nkids - n->npos;
    if (a->npos > 16 || a->nkw > 16) jfail(r->c, "line %d: too many arguments", n->line);
    for (int i = 0; i < a->npos; i++) a->pos[i] = eval(r, n->kids[i], f);
    a->kwn = n->names;
    for (int i = 0; i < a->nkw; i++) a->kw[i] = eval(r, n->kids[n->npos + i], f);
}

/* Argument i by position or by keyword name, else UNDEF. */
static jval arg(const jargs *a, int i, const char *kw) {
    if (i >= 0 && i < a->npos) return a->pos[i];
    for (int k = 0; k < a->nkw; k++)
        if (kw && str_eq(a->kwn[k], kw, strlen(kw))) return a->kw[k];
    return UNDEF;
}

static const jstr *want_str(jctx *c, jval v, const char *what, int line) {
    if (v.t == V_STR) return v.s;
    jfail(c, "line %d: %s must be a string, not '%s'", line, what, type_name(v));
}

static int strip_has(const jstr *chars, char ch) {
    if (!chars) return is_space(ch);
    return memchr(chars->p, ch, chars->n) != NULL;
}

static jval do_strip(jctx *c, const jstr *s, jval chars_v, int left, int right) {
    const jstr *chars = chars_v.t == V_STR ? chars_v.s : NULL;
    size_t a = 0, b = s->n;
    if (left) while (a < b && strip_has(chars, s->p[a])) a++;
    if (right) while (b > a && strip_has(chars, s->p[b - 1])) b--;
    return mk_str(c, s->p + a, b - a);
}

static jval do_split(jctx *c, const jstr *s, jval sep_v, int64_t maxsplit, int from_right, int line) {
    jlist *l = list_new(c, 4);
    if (sep_v.t == V_UNDEF || sep_v.t == V_NONE) {  /* runs of whitespace, no empty pieces */
        if (from_right && maxsplit >= 0) jfail(c, "line %d: rsplit() with maxsplit on whitespace is not supported", line);
        size_t i = 0;
        while (i < s->n) {
            while (i < s->n && is_space(s->p[i])) i++;
            if (i >= s->n) break;
            size_t st = i;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                size_t e = s->n;
                while (e > st && is_space(s->p[e - 1])) e--;
                list_push(c, l, mk_str(c, s->p + st, e - st));
                break;
            }
            while (i < s->n && !is_space(s->p[i])) i++;
            list_push(c, l, mk_str(c, s->p + st, i - st));
        }
        return mk_list(l);
    }
    const jstr *sep = want_str(c, sep_v, "split separator", line);
    if (sep->n == 0) jfail(c, "line %d: empty separator", line);
    if (!from_right) {
        size_t st = 0;
        for (size_t i = 0; i + sep->n <= s->n;) {
            if ((maxsplit < 0 || (int64_t)l->n < maxsplit) && !memcmp(s->p + i, sep->p, sep->n)) {
                list_push(c, l, mk_str(c, s->p + st, i - st));
                i += sep->n;
                st = i;
            } else {
                i++;
            }
        }
        list_push(c, l, mk_str(c, s->p + st, s->n - st));
        return mk_list(l);
    }
    /* rsplit: collect from the right, then reverse */
    size_t end = s->n;
    int64_t done = 0;
    jlist *rev = list_new(c, 4);
    for (size_t i = s->n; i >= sep->n;) {
        if ((maxsplit < 0 || done < maxsplit) && !memcmp(s->p + i - sep->n, sep->p, sep->n)) {
            list_push(c, rev, mk_str(c, s->p + i, end - i));
            i -= sep->n;
            end = i;
            done++;
        } else {
            i--;
        }
    }
    list_push(c, rev, mk_str(c, s->p, end));
    for (size_t i = rev->n; i-- > 0;) list_push(c, l, rev->v[i]);
    return mk_list(l);
}

static jval do_replace(jctx *c, const jstr *s, const jstr *old, const jstr *new_, int64_t count) {
    jbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) {  /* Python inserts new_ between every code point */
        size_t n, *o = cp_offsets(c, s, &n);
        for (size_t k = 0; k <= n; k++) {
            if (count < 0 || done < count) { buf_put(c, &b, new_->p, new_->n); done++; }
            if (k < n) buf_put(c, &b, s->p + o[k], o[k + 1] - o[k]);
        }
        return buf_val(c, &b);
    }
    while (i < s->n) {
        if ((count < 0 || done < count) && i + old->n <= s->n && !memcmp(s->p + i, old->p, old->n)) {
            buf_put(c, &b, new_->p, new_->n);
            i += old->n;
            done++;
        } else {
            buf_put(c, &b, s->p + i, 1);
            i++;
        }
    }
    return buf_val(c, &b);
}

static jval do_case(jctx *c, const jstr *s, int mode /* 0 upper, 1 lower, 2 title, 3 capitalize */) {
    char *d = jalloc(c, s->n + 1);
    int start = 1;
    for (size_t i = 0; i < s->n; i++) {
        char ch = s->p[i];
        int up = mode == 0 || ((mode == 2 || mode == 3) && start);
        if (mode == 3 && !start) up = 0;
        if (up && ch >= 'a' && ch <= 'z') ch = (char)(ch - 32);
        else if (!up && ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
        d[i] = ch;
        if (mode == 2) start = !((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || is_digit(ch) || ch == '\'');
        else if (mode == 3) start = 0;
    }
    return mk_str(c, d, s->n);
}

static int64_t find_sub(const jstr *s, const jstr *sub, int from_right) {
    if (sub->n > s->n) return -1;
    if (!from_right) {
        for (size_t i = 0; i + sub->n <= s->n; i++)
            if (!memcmp(s->p + i, sub->p, sub->n)) return (int64_t)i;
    } else {
        for (size_t i = s->n - sub->n + 1; i-- > 0;)
            if (!memcmp(s->p + i, sub->p, sub->n)) return (int64_t)i;
    }
    return -1;
}

static int affix(const jstr *s, const jstr *a, int end) {
    if (a->n > s->n) return 0;
    return !memcmp(s->p + (end ? s->n - a->n : 0), a->p, a->n);
}

static jval call_method(rstate *r, jfunc *fn, const jargs *a, int line) {
    jctx *c = r->c;
    const jstr *m = fn->name;
    jval self = fn->self;
#define M(x) str_eq(m, x, strlen(x))
    if (self.t == V_DICT) {
        jdict *d = self.d;
        if (M("get")) {
            jval k = arg(a, 0, "key");
            jval *v = k.t == V_STR ? dict_find(d, k.s->p, k.s->n) : NULL;
            if (v) return *v;
            jval dflt = arg(a, 1, "default");
            return dflt.t == V_UNDEF ? NONE : dflt;
        }
        jlist *l = list_new(c, d->n);
        for (size_t i = 0; i < d->n; i++) {
            jval k = {.t = V_STR, .s = d->k[i]};
            if (M("keys")) list_push(c, l, k);
            else if (M("values")) list_push(c, l, d->v[i]);
            else {
                jlist *pair = list_new(c, 2);
                pair->tup = 1;
                list_push(c, pair, k);
                list_push(c, pair, d->v[i]);
                list_push(c, l, mk_list(pair));
            }
        }
        return mk_list(l);
    }
    const jstr *s = self.s;
    if (M("startswith") || M("endswith")) {
        jval x = arg(a, 0, NULL);
        int end = M("endswith");
        if (x.t == V_LIST) {
            for (size_t i = 0; i < x.l->n; i++)
                if (affix(s, want_str(c, x.l->v[i], "prefix", line), end)) return mk_bool(1);
            return mk_bool(0);
        }
        return mk_bool(affix(s, want_str(c, x, end ? "suffix" : "prefix", line), end));
    }
    if (M("strip")) return do_strip(c, s, arg(a, 0, "chars"), 1, 1);
    if (M("lstrip")) return do_strip(c, s, arg(a, 0, "chars"), 1, 0);
    if (M("rstrip")) return do_strip(c, s, arg(a, 0, "chars"), 0, 1);
    if (M("split") || M("rsplit")) {
        jval ms = arg(a, 1, "maxsplit");
        return do_split(c, s, arg(a, 0, "sep"), ms.t == V_UNDEF ? -1 : want_int(c, ms, "maxsplit", line), M("rsplit"), line);
    }
    if (M("upper")) return do_case(c, s, 0);
    if (M("lower")) return do_case(c, s, 1);
    if (M("title")) return do_case(c, s, 2);
    if (M("capitalize")) return do_case(c, s, 3);
    if (M("replace")) {
        jval cnt = arg(a, 2, "count");
        return do_replace(c, s, want_str(c, arg(a, 0, NULL), "old", line), want_str(c, arg(a, 1, NULL), "new", line),
                          cnt.t == V_UNDEF ? -1 : want_int(c, cnt, "count", line));
    }
    if (M("find") || M("rfind")) return mk_int(find_sub(s, want_str(c, arg(a, 0, NULL), "substring", line), M("rfind")));
    if (M("count")) {
        const jstr *sub = want_str(c, arg(a, 0, NULL), "substring", line);
        int64_t k = 0;
        if (sub->n == 0) return mk_int((int64_t)s->n + 1);
        for (size_t i = 0; i + sub->n <= s->n;) {
            if (!memcmp(s->p + i, sub->p, sub->n)) { k++; i += sub->n; } else i++;
        }
        return mk_int(k);
    }
    if (M("join")) {
        jlist *l = iter_list(c, arg(a, 0, NULL), line);
        jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) buf_put(c, &b, s->p, s->n);
            const jstr *e = want_str(c, l->v[i], "join item", line);
            buf_put(c, &b, e->p, e->n);
        }
        return buf_val(c, &b);
    }
    if (M("splitlines")) {
        jlist *l = list_new(c, 4);
        size_t st = 0;
        for (size_t i = 0; i < s->n; i++) {
            if (s->p[i] == '\n' || s->p[i] == '\r') {
                list_push(c, l, mk_str(c, s->p + st, i - st));
                if (s->p[i] == '\r' && i + 1 < s->n && s->p[i + 1] == '\n') i++;
                st = i + 1;
            }
        }
        if (st < s->n) list_push(c, l, mk_str(c, s->p + st, s->n - st));
        return mk_list(l);
    }
    if (M("isdigit") || M("isalpha") || M("isspace")) {
        if (s->n == 0) return mk_bool(0);
        for (size_t i = 0; i < s->n; i++) {
            char ch = s->p[i];
            int ok = M("isdigit") ? is_digit(ch) : M("isspace") ? is_space(ch)
                                                                : ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'));
            if (!ok) return mk_bool(0);
        }
        return mk_bool(1);
    }
    if (M("format")) {  /* "{}" and "{0}" placeholders */
        jbuf b = {0};
        int next = 0;
        for (size_t i = 0; i < s->n; i++) {
            if (s->p[i] == '{' && i + 1 < s->n && s->p[i + 1] == '{') { buf_puts(c, &b, "{"); i++; continue; }
            if (s->p[i] == '}' && i + 1 < s->n && s->p[i + 1] == '}') { buf_puts(c, &b, "}"); i++; continue; }
            if (s->p[i] == '{') {
                size_t e = i + 1;
                int idx = -1;
                if (e < s->n && is_digit(s->p[e])) idx = s->p[e++] - '0';
                if (e >= s->n || s->p[e] != '}') jfail(c, "line %d: format(): only {} and {N} are supported", line);
                if (idx < 0) idx = next++;
                if (idx >= a->npos) jfail(c, "line %d: format(): missing argument %d", line, idx);
                to_str(c, &b, a->pos[idx], 0);
                i = e;
                continue;
            }
            buf_put(c, &b, s->p + i, 1);
        }
        return buf_val(c, &b);
    }
#undef M
    jfail(c, "line %d: unknown method '%.*s'", line, (int)m->n, m->p);
}

static jval call_macro(rstate *r, const node *mac, const jargs *a, int line) {
    jctx *c = r->c;
    if (a->npos > mac->nnames) jfail(c, "line %d: macro '%s' takes %d arguments", line, mac->name->p, mac->nnames);
    frame fr = {.parent = r->root, .vars = dict_new(c)};
    for (int i = 0; i < mac->nnames; i++) {
        jval v = arg(a, i, mac->names[i]->p);
        if (v.t == V_UNDEF && mac->kids[i]) v = eval(r, mac->kids[i], &fr);
        dict_set(c, fr.vars, mac->names[i], v);
    }
    if (++c->depth > DEPTH_LIMIT) jfail(c, "line %d: macro calls nested too deeply", line);
    jbuf b = {0};
    render(r, mac->b, &fr, &b);
    c->depth--;
    return buf_val(c, &b);
}

static jval call_builtin(rstate *r, jfunc *fn, const jargs *a, int line) {
    jctx *c = r->c;
    switch (fn->id) {
    case B_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (a->npos == 1) stop = want_int(c, a->pos[0], "range()", line);
        else if (a->npos == 2 || a->npos == 3) {
            start = want_int(c, a->pos[0], "range()", line);
            stop = want_int(c, a->pos[1], "range()", line);
            if (a->npos == 3) step = want_int(c, a->pos[2], "range()", line);
        } else jfail(c, "line %d: range() takes 1 to 3 arguments", line);
        if (step == 0) jfail(c, "line %d: range() step must not be zero", line);
        jlist *l = list_new(c, 8);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (l->n >= RANGE_LIMIT) jfail(c, "line %d: range() longer than %d", line, RANGE_LIMIT);
            list_push(c, l, mk_int(i));
            if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
        }
        return mk_list(l);
    }
    case B_NAMESPACE: case B_DICT: {
        jdict *d = dict_new(c);
        d->ns = fn->id == B_NAMESPACE;
        for (int i = 0; i < a->npos; i++) {  /* namespace({'a': 1}) / dict(other) */
            if (a->pos[i].t != V_DICT) jfail(c, "line %d: %s() takes keyword arguments or a dict", line, d->ns ? "namespace" : "dict");
            for (size_t k = 0; k < a->pos[i].d->n; k++) dict_set(c, d, a->pos[i].d->k[k], a->pos[i].d->v[k]);
        }
        for (int i = 0; i < a->nkw; i++) dict_set(c, d, a->kwn[i], a->kw[i]);
        return mk_dict(d);
    }
    case B_RAISE: {
        const jstr *m = as_str(c, arg(a, 0, NULL));
        jfail(c, "%.*s", (int)(m->n > 400 ? 400 : m->n), m->p);
    }
    case B_STRFTIME: {
        const jstr *f = want_str(c, arg(a, 0, NULL), "strftime_now() format", line);
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char out[256];
        size_t n = strftime(out, sizeof out, f->p, &tmv);
        return mk_str(c, out, n);
    }
    default: jfail(c, "line %d: bad builtin", line);
    }
}

static jval call_value(rstate *r, jval fv, const jargs *a, int line) {
    if (fv.t != V_FUNC) jfail(r->c, "line %d: '%s' object is not callable", line, type_name(fv));
    if (fv.fn->kind == F_BUILTIN) return call_builtin(r, fv.fn, a, line);
    if (fv.fn->kind == F_METHOD) return call_method(r, fv.fn, a, line);
    return call_macro(r, fv.fn->macro, a, line);
}

static jval slice(jctx *c, jval obj, jval a, jval b, jval s, int line) {
    size_t n, *o = NULL;
    if (obj.t == V_LIST) n = obj.l->n;
    else if (obj.t == V_STR) o = cp_offsets(c, obj.s, &n);
    else jfail(c, "line %d: '%s' object cannot be sliced", line, type_name(obj));
    int64_t step = s.t == V_UNDEF || s.t == V_NONE ? 1 : want_int(c, s, "slice step", line);
    if (step == 0) jfail(c, "line %d: slice step cannot be zero", line);
    int64_t len = (int64_t)n, lo, hi;
    int64_t dlo = step > 0 ? 0 : len - 1, dhi = step > 0 ? len : -1;
    if (a.t == V_UNDEF || a.t == V_NONE) lo = dlo;
    else {
        lo = want_int(c, a, "slice start", line);
        if (lo < 0) lo += len;
        if (step > 0) lo = lo < 0 ? 0 : lo > len ? len : lo;
        else lo = lo < -1 ? -1 : lo > len - 1 ? len - 1 : lo;
    }
    if (b.t == V_UNDEF || b.t == V_NONE) hi = dhi;
    else {
        hi = want_int(c, b, "slice stop", line);
        if (hi < 0) hi += len;
        if (step > 0) hi = hi < 0 ? 0 : hi > len ? len : hi;
        else hi = hi < -1 ? -1 : hi > len - 1 ? len - 1 : hi;
    }
    jlist *l = obj.t == V_LIST ? list_new(c, 4) : NULL;
    jbuf sb = {0};
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
        if (l) list_push(c, l, obj.l->v[i]);
        else buf_put(c, &sb, obj.s->p + o[i], o[i + 1] - o[i]);
    }
    return l ? mk_list(l) : buf_val(c, &sb);
}

static jval arith(jctx *c, int op, jval a, jval b, int line) {
    if (op == OP_CAT) {
        jbuf s = {0};
        to_str(c, &s, a, 0);
        to_str(c, &s, b, 0);
        return buf_val(c, &s);
    }
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        jbuf s = {0};
        buf_put(c, &s, a.s->p, a.s->n);
        buf_put(c, &s, b.s->p, b.s->n);
        return buf_val(c, &s);
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        jlist *l = list_new(c, a.l->n + b.l->n);
        for (size_t i = 0; i < a.l->n; i++) list_push(c, l, a.l->v[i]);
        for (size_t i = 0; i < b.l->n; i++) list_push(c, l, b.l->v[i]);
        return mk_list(l);
    }
    if (op == OP_MUL && ((a.t == V_STR && (b.t == V_INT)) || (b.t == V_STR && a.t == V_INT))) {
        const jstr *s = a.t == V_STR ? a.s : b.s;
        int64_t k = a.t == V_STR ? b.i : a.i;
        jbuf o = {0};
        if (k > 0 && s->n && (uint64_t)k > OUT_LIMIT / s->n) jfail(c, "line %d: string repeat too long", line);
        for (int64_t i = 0; i < k; i++) buf_put(c, &o, s->p, s->n);
        return buf_val(c, &o);
    }
    if (op == OP_MOD && a.t == V_STR) {  /* "%s" % x */
        jbuf o = {0};
        size_t ai = 0;
        jlist *args = b.t == V_LIST ? b.l : NULL;
        for (size_t i = 0; i < a.s->n; i++) {
            if (a.s->p[i] == '%' && i + 1 < a.s->n) {
                char f = a.s->p[++i];
                if (f == '%') { buf_puts(c, &o, "%"); continue; }
                if (f != 's' && f != 'd') jfail(c, "line %d: only %%s and %%d formatting is supported", line);
                jval x = args ? (ai < args->n ? args->v[ai++] : UNDEF) : (ai++ == 0 ? b : UNDEF);
                if (x.t == V_UNDEF) jfail(c, "line %d: not enough arguments for format string", line);
                to_str(c, &o, x, 0);
            } else {
                buf_put(c, &o, a.s->p + i, 1);
            }
        }
        return buf_val(c, &o);
    }
    if (!is_num(a) || !is_num(b))
        jfail(c, "line %d: unsupported operand types '%s' and '%s'", line, type_name(a), type_name(b));
    if (a.t != V_FLOAT && b.t != V_FLOAT && op != OP_DIV && op != OP_POW) {
        int64_t x = a.i, y = b.i, z;
        switch (op) {
        case OP_ADD: if (__builtin_add_overflow(x, y, &z)) jfail(c, "line %d: integer overflow", line); return mk_int(z);
        case OP_SUB: if (__builtin_sub_overflow(x, y, &z)) jfail(c, "line %d: integer overflow", line); return mk_int(z);
        case OP_MUL: if (__builtin_mul_overflow(x, y, &z)) jfail(c, "line %d: integer overflow", line); return mk_int(z);
        case OP_FDIV: case OP_MOD: {
            if (y == 0) jfail(c, "line %d: division by zero", line);
            if (x == INT64_MIN && y == -1) jfail(c, "line %d: integer overflow", line);
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
            return mk_int(op == OP_FDIV ? q : m);
        }
        }
    }
    if (op == OP_POW && a.t != V_FLOAT && b.t != V_FLOAT && b.i >= 0) {
        int64_t z = 1;
        for (int64_t i = 0; i < b.i; i++) {
            if (__builtin_mul_overflow(z, a.i, &z)) jfail(c, "line %d: integer overflow", line);
            if (z == 0 || z == 1) break;
        }
        return mk_int(z);
    }
    double x = num_f(a), y = num_f(b);
    switch (op) {
    case OP_ADD: return mk_float(x + y);
    case OP_SUB: return mk_float(x - y);
    case OP_MUL: return mk_float(x * y);
    case OP_POW: return mk_float(pow(x, y));
    case OP_DIV: case OP_FDIV: case OP_MOD:
        if (y == 0) jfail(c, "line %d: division by zero", line);
        if (op == OP_DIV) return mk_float(x / y);
        if (op == OP_FDIV) return mk_float(floor(x / y));
        { double m = fmod(x, y); if (m != 0 && ((m < 0) != (y < 0))) m += y; return mk_float(m); }
    }
    jfail(c, "line %d: bad operator", line);
}

static int run_test(rstate *r, const jstr *name, jval v, const jargs *a, int line);

/* Filters: jinja2's builtin filters that chat templates use. */
static jval apply_filter(rstate *r, const jstr *name, jval v, const jargs *a, int line);

static jval attr_path(jctx *c, jval v, const jstr *path, int line) {
    /* "a.b" attribute paths of map/selectattr/sort/join */
    size_t st = 0;
    for (size_t i = 0; i <= path->n; i++) {
        if (i == path->n || path->p[i] == '.') {
            const jstr *k = str_new(c, path->p + st, i - st);
            if (v.t == V_UNDEF) return UNDEF;
            v = v.t == V_DICT ? getattr(c, v, k, line) : getitem(c, v, mk_str(c, k->p, k->n), line);
            st = i + 1;
        }
    }
    return v;
}

static jval select_impl(rstate *r, jval v, const jargs *a, int line, int attr, int keep) {
    jctx *c = r->c;
    jlist *in = iter_list(c, v, line), *out = list_new(c, in->n);
    const jstr *path = attr ? want_str(c, arg(a, 0, NULL), "attribute", line) : NULL;
    int t0 = attr ? 1 : 0;
    jval tname = arg(a, t0, NULL);
    jargs ta = {0};
    for (int i = t0 + 1; i < a->npos && ta.npos < 16; i++) ta.pos[ta.npos++] = a->pos[i];
    for (size_t i = 0; i < in->n; i++) {
        jval x = path ? attr_path(c, in->v[i], path, line) : in->v[i];
        int ok = tname.t == V_UNDEF ? truthy(x) : run_test(r, want_str(c, tname, "test name", line), x, &ta, line);
        if (ok == keep) list_push(c, out, in->v[i]);
    }
    return mk_list(out);
}

typedef struct { jval key; jval item; } sort_pair;
static _Thread_local jctx *t_sort_ctx;  /* qsort has no context argument */
static int sort_cmp(const void *x, const void *y) {
    const sort_pair *a = x, *b = y;
    return vcompare(t_sort_ctx, a->key, b->key, 0);
}

static jval apply_filter(rstate *r, const jstr *name, jval v, const jargs *a, int line) {
    jctx *c = r->c;
#define F(x) str_eq(name, x, strlen(x))
    if (F("length") || F("count")) {
        if (v.t == V_STR) { size_t n; cp_offsets(c, v.s, &n); return mk_int((int64_t)n); }
        if (v.t == V_LIST) return mk_int((int64_t)v.l->n);
        if (v.t == V_DICT) return mk_int((int64_t)v.d->n);
        if (v.t == V_UNDEF) return mk_int(0);
        jfail(c, "line %d: object of type '%s' has no len()", line, type_name(v));
    }
    if (F("tojson")) {
        jval ind = arg(a, 0, "indent"), sk = arg(a, 1, "sort_keys");
        jbuf b = {0};
        to_json(c, &b, v, ind.t == V_INT ? (int)(ind.i < 0 ? 0 : ind.i > 16 ? 16 : ind.i) : -1, 0, truthy(sk));
        return buf_val(c, &b);
    }
    if (F("string")) return mk_str(c, as_str(c, v)->p, as_str(c, v)->n);
    if (F("trim")) return do_strip(c, want_str(c, v, "trim input", line), arg(a, 0, "chars"), 1, 1);
    if (F("upper") || F("lower") || F("title") || F("capitalize")) {
        const jstr *s = as_str(c, v);
        return do_case(c, s, F("upper") ? 0 : F("lower") ? 1 : F("title") ? 2 : 3);
    }
    if (F("default") || F("d")) {
        jval dflt = arg(a, 0, "default_value");
        int boolean = truthy(arg(a, 1, "boolean"));
        if (v.t == V_UNDEF || (boolean && !truthy(v))) return dflt.t == V_UNDEF ? mk_str(c, "", 0) : dflt;
        return v;
    }
    if (F("safe") || F("e") || F("escape")) {
        if (F("safe")) return v;
        const jstr *s = as_str(c, v);
        jbuf b = {0};
        for (size_t i = 0; i < s->n; i++) {
            switch (s->p[i]) {
            case '&': buf_puts(c, &b, "&amp;"); break;
            case '<': buf_puts(c, &b, "&lt;"); break;
            case '>': buf_puts(c, &b, "&gt;"); break;
            case '"': buf_puts(c, &b, "&#34;"); break;
            case '\'': buf_puts(c, &b, "&#39;"); break;
            default: buf_put(c, &b, s->p + i, 1);
            }
        }
        return buf_val(c, &b);
    }
    if (F("first") || F("last")) {
        jlist *l = iter_list(c, v, line);
        if (!l->n) return UNDEF;
        return F("first") ? l->v[0] : l->v[l->n - 1];
    }
    if (F("list")) return mk_list(iter_list(c, v, line));
    if (F("items")) {
        if (v.t == V_UNDEF) return mk_list(list_new(c, 1));
        if (v.t != V_DICT) jfail(c, "line %d: items filter needs a mapping", line);
        jfunc fn = {.kind = F_METHOD, .name = str_new(c, "items", 5), .self = v};
        jargs none = {0};
        return call_method(r, &fn, &none, line);
    }
    if (F("join")) {
        jlist *l = iter_list(c, v, line);
        jval sep = arg(a, 0, "d"), at = arg(a, 1, "attribute");
        const jstr *s = sep.t == V_UNDEF ? str_new(c, "", 0) : as_str(c, sep);
        jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) buf_put(c, &b, s->p, s->n);
            jval x = at.t == V_STR ? attr_path(c, l->v[i], at.s, line) : l->v[i];
            to_str(c, &b, x, 0);
        }
        return buf_val(c, &b);
    }
    if (F("reverse")) {
        if (v.t == V_STR) { jval none = UNDEF; return slice(c, v, none, none, mk_int(-1), line); }
        jlist *l = iter_list(c, v, line), *o = list_new(c, l->n);
        for (size_t i = l->n; i-- > 0;) list_push(c, o, l->v[i]);
        return mk_list(o);
    }
    if (F("replace")) {
        jval cnt = arg(a, 2, "count");
        return do_replace(c, as_str(c, v), want_str(c, arg(a, 0, "old"), "old", line), want_str(c, arg(a, 1, "new"), "new", line),
                          cnt.t == V_UNDEF ? -1 : want_int(c, cnt, "count", line));
    }
    if (F("int")) {
        if (v.t == V_INT || v.t == V_BOOL) return mk_int(v.i);
        if (v.t == V_FLOAT) return mk_int(isfinite(v.f) && fabs(v.f) < 9e18 ? (int64_t)v.f : 0);
        if (v.t == V_STR) { char *e; long long x = strtoll(v.s->p, &e, 10); return mk_int(*e ? 0 : x); }
        jval dflt = arg(a, 0, "default");
        return dflt.t == V_UNDEF ? mk_int(0) : dflt;
    }
    if (F("float")) {
        if (is_num(v)) return mk_float(num_f(v));
        if (v.t == V_STR) { char *e; double x = strtod(v.s->p, &e); return mk_float(*e ? 0.0 : x); }
        return mk_float(0.0);
    }
    if (F("abs")) {
        if (v.t == V_FLOAT) return mk_float(fabs(v.f));
        if (v.t == V_INT || v.t == V_BOOL) {
            if (v.i == INT64_MIN) jfail(c, "line %d: integer overflow", line);
            return mk_int(v.i < 0 ? -v.i : v.i);
        }
        jfail(c, "line %d: bad operand for abs(): '%s'", line, type_name(v));
    }
    if (F("round")) {
        jval pr = arg(a, 0, "precision"), me = arg(a, 1, "method");
        double x = num_f(is_num(v) ? v : mk_float(0)), sc = pow(10, pr.t == V_INT ? (double)pr.i : 0);
        const jstr *m = me.t == V_STR ? me.s : NULL;
        double y = m && str_eq(m, "floor", 5) ? floor(x * sc) / sc : m && str_eq(m, "ceil", 4) ? ceil(x * sc) / sc
                                                                                        : round(x * sc) / sc;
        return mk_float(y);
    }
    if (F("select") || F("reject")) return select_impl(r, v, a, line, 0, F("select"));
    if (F("selectattr") || F("rejectattr")) return select_impl(r, v, a, line, 1, F("selectattr"));
    if (F("map")) {
        jlist *in = iter_list(c, v, line), *out = list_new(c, in->n);
        jval at = arg(a, -1, "attribute");
        if (at.t == V_STR) {
            jval dflt = arg(a, -1, "default");
            for (size_t i = 0; i < in->n; i++) {
                jval x = attr_path(c, in->v[i], at.s, line);
                list_push(c, out, x.t == V_UNDEF && dflt.t != V_UNDEF ? dflt : x);
            }
            return mk_list(out);
        }
        const jstr *fname = want_str(c, arg(a, 0, NULL), "filter name", line);
        jargs fa = {0};
        for (int i = 1; i < a->npos; i++) fa.pos[fa.npos++] = a->pos[i];
        fa.kwn = a->kwn;
        fa.nkw = a->nkw;
        for (int i = 0; i < a->nkw; i++) fa.kw[i] = a->kw[i];
        for (size_t i = 0; i < in->n; i++) list_push(c, out, apply_filter(r, fname, in->v[i], &fa, line));
        return mk_list(out);
    }
    if (F("unique")) {
        jlist *in = iter_list(c, v, line), *out = list_new(c, in->n);
        for (size_t i = 0; i < in->n; i++) {
            int seen = 0;
            for (size_t j = 0; j < out->n && !seen; j++) seen = vequal(out->v[j], in->v[i]);
            if (!seen) list_push(c, out, in->v[i]);
        }
        return mk_list(out);
    }
    if (F("sort") || F("dictsort")) {
        int dictsort = F("dictsort");
        jlist *in;
        if (dictsort) {
            if (v.t != V_DICT) jfail(c, "line %d: dictsort needs a mapping", line);
            jfunc fn = {.kind = F_METHOD, .name = str_new(c, "items", 5), .self = v};
            jargs none = {0};
            in = call_method(r, &fn, &none, line).l;
        } else {
            in = iter_list(c, v, line);
        }
        jval rev = arg(a, dictsort ? 2 : 0, "reverse"), at = arg(a, dictsort ? -1 : 2, "attribute");
        sort_pair *ps = jalloc(c, (in->n + 1) * sizeof *ps);
        for (size_t i = 0; i < in->n; i++) {
            ps[i].item = in->v[i];
            ps[i].key = dictsort ? in->v[i].l->v[0] : at.t == V_STR ? attr_path(c, in->v[i], at.s, line) : in->v[i];
        }
        t_sort_ctx = c;
        /* a comparison error longjmps out of qsort: safe, qsort holds no resources */
        qsort(ps, in->n, sizeof *ps, sort_cmp);
        jlist *out = list_new(c, in->n);
        for (size_t i = 0; i < in->n; i++) list_push(c, out, ps[truthy(rev) ? in->n - 1 - i : i].item);
        return mk_list(out);
    }
    if (F("max") || F("min")) {
        jlist *in = iter_list(c, v, line);
        if (!in->n) return UNDEF;
        jval best = in->v[0];
        for (size_t i = 1; i < in->n; i++) {
            int cmp = vcompare(c, in->v[i], best, line);
            if (F("max") ? cmp > 0 : cmp < 0) best = in->v[i];
        }
        return best;
    }
    if (F("sum")) {
        jlist *in = iter_list(c, v, line);
        jval acc = mk_int(0);
        for (size_t i = 0; i < in->n; i++) acc = arith(c, OP_ADD, acc, in->v[i], line);
        return acc;
    }
    if (F("indent")) {
        const jstr *s = as_str(c, v);
        jval w = arg(a, 0, "width"), first = arg(a, 1, "first"), blank = arg(a, 2, "blank");
        jbuf pad = {0};
        if (w.t == V_STR) buf_put(c, &pad, w.s->p, w.s->n);
        else for (int64_t i = 0; i < (w.t == V_INT ? (w.i > 64 ? 64 : w.i) : 4); i++) buf_puts(c, &pad, " ");
        jbuf b = {0};
        int at_start = 1, is_first = 1;
        for (size_t i = 0; i < s->n; i++) {
            if (at_start) {
                size_t e = i;
                while (e < s->n && s->p[e] != '\n') e++;
                int empty = e == i;
                if ((!is_first || truthy(first)) && (!empty || truthy(blank)) && pad.n) buf_put(c, &b, pad.p, pad.n);
                at_start = 0;
                is_first = 0;
            }
            buf_put(c, &b, s->p + i, 1);
            if (s->p[i] == '\n') at_start = 1;
        }
        return buf_val(c, &b);
    }
    if (F("wordcount")) {
        jval sp = mk_list(list_new(c, 1));
        sp = do_split(c, as_str(c, v), UNDEF, -1, 0, line);
        return mk_int((int64_t)sp.l->n);
    }
    if (F("attr")) return getattr(c, v, want_str(c, arg(a, 0, NULL), "attribute name", line), line);
#undef F
    jfail(c, "line %d: unknown filter '%.*s'", line, (int)(name->n > 40 ? 40 : name->n), name->p);
}

static int run_test(rstate *r, const jstr *name, jval v, const jargs *a, int line) {
    jctx *c = r->c;
    jval x = arg(a, 0, NULL);
#define T(s) str_eq(name, s, strlen(s))
    if (T("defined")) return v.t != V_UNDEF;
    if (T("undefined")) return v.t == V_UNDEF;
    if (T("none")) return v.t == V_NONE;
    if (T("boolean")) return v.t == V_BOOL;
    if (T("true")) return v.t == V_BOOL && v.i;
    if (T("false")) return v.t == V_BOOL && !v.i;
    if (T("integer")) return v.t == V_INT;
    if (T("float")) return v.t == V_FLOAT;
    if (T("number")) return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL;
    if (T("string")) return v.t == V_STR;
    if (T("mapping")) return v.t == V_DICT;
    if (T("sequence")) return v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
    if (T("iterable")) return v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
    if (T("callable")) return v.t == V_FUNC;
    if (T("odd") || T("even")) {
        int64_t i = want_int(c, v, "odd/even operand", line);
        return T("odd") ? (i & 1) != 0 : (i & 1) == 0;
    }
    if (T("divisibleby")) {
        int64_t d = want_int(c, x, "divisibleby argument", line);
        if (d == 0) jfail(c, "line %d: division by zero", line);
        return d == -1 || want_int(c, v, "divisibleby operand", line) % d == 0;
    }
    if (T("eq") || T("equalto") || T("==")) return vequal(v, x);
    if (T("ne") || T("!=")) return !vequal(v, x);
    if (T("lt") || T("lessthan")) return vcompare(c, v, x, line) < 0;
    if (T("gt") || T("greaterthan")) return vcompare(c, v, x, line) > 0;
    if (T("le")) return vcompare(c, v, x, line) <= 0;
    if (T("ge")) return vcompare(c, v, x, line) >= 0;
    if (T("in")) return vcontains(c, x, v, line);
    if (T("sameas")) return v.t == x.t && (v.t == V_NONE || v.t == V_UNDEF || vequal(v, x));
    if (T("lower") || T("upper")) {
        if (v.t != V_STR) return 0;
        for (size_t i = 0; i < v.s->n; i++) {
            char ch = v.s->p[i];
            if (T("lower") ? (ch >= 'A' && ch <= 'Z') : (ch >= 'a' && ch <= 'z')) return 0;
        }
        return 1;
    }
#undef T
    jfail(c, "line %d: unknown test '%.*s'", line, (int)(name->n > 40 ? 40 : name->n), name->p);
}

static jval eval(rstate *r, const node *n, frame *f) {
    jctx *c = r->c;
    if (++c->steps > STEP_LIMIT) jfail(c, "template evaluation exceeded %d steps", STEP_LIMIT);
    if (++c->depth > DEPTH_LIMIT) jfail(c, "line %d: evaluation nested too deeply", n->line);
    jval v;
    switch (n->kind) {
    case N_LIT: v = n->lit; break;
    case N_NAME: v = lookup(f, n->name); break;
    case N_LIST: {
        jlist *l = list_new(c, (size_t)n->nkids);
        l->tup = n->op;
        for (int i = 0; i < n->nkids; i++) list_push(c, l, eval(r, n->kids[i], f));
        v = mk_list(l);
        break;
    }
    case N_DICT: {
        jdict *d = dict_new(c);
        for (int i = 0; i + 1 < n->nkids; i += 2) {
            jval k = eval(r, n->kids[i], f);
            dict_set(c, d, as_str(c, k), eval(r, n->kids[i + 1], f));
        }
        v = mk_dict(d);
        break;
    }
    case N_ATTR: v = getattr(c, eval(r, n->a, f), n->name, n->line); break;
    case N_ITEM: {
        jval o = eval(r, n->a, f), k = eval(r, n->b, f);
        v = getitem(c, o, k, n->line);
        if (v.t == V_UNDEF && o.t == V_DICT && k.t == V_STR && !o.d->ns && in_names(k.s, dict_methods))
            v = getattr(c, o, k.s, n->line);
        break;
    }
    case N_SLICE: {
        jval o = eval(r, n->a, f);
        v = slice(c, o, n->b ? eval(r, n->b, f) : UNDEF, n->c ? eval(r, n->c, f) : UNDEF,
                  n->d ? eval(r, n->d, f) : UNDEF, n->line);
        break;
    }
    case N_CALL: {
        jval fv = eval(r, n->a, f);
        jargs a;
        eval_args(r, n, f, &a);
        if (fv.t == V_UNDEF && n->a->kind == N_NAME)
            jfail(c, "line %d: '%.*s' is undefined", n->line, (int)n->a->name->n, n->a->name->p);
        v = call_value(r, fv, &a, n->line);
        break;
    }
    case N_FILTER: {
        jval x = eval(r, n->a, f);
        jargs a;
        eval_args(r, n, f, &a);
        v = apply_filter(r, n->name, x, &a, n->line);
        break;
    }
    case N_TEST: {
        jval x = eval(r, n->a, f);
        jargs a;
        eval_args(r, n, f, &a);
        v = mk_bool(run_test(r, n->name, x, &a, n->line) != n->op);
        break;
    }
    case N_BIN: {
        jval a = eval(r, n->a, f), b = eval(r, n->b, f);
        switch (n->op) {
        case OP_EQ: v = mk_bool(vequal(a, b)); break;
        case OP_NE: v = mk_bool(!vequal(a, b)); break;
        case OP_LT: v = mk_bool(vcompare(c, a, b, n->line) < 0); break;
        case OP_GT: v = mk_bool(vcompare(c, a, b, n->line) > 0); break;
        case OP_LE: v = mk_bool(vcompare(c, a, b, n->line) <= 0); break;
        case OP_GE: v = mk_bool(vcompare(c, a, b, n->line) >= 0); break;
        case OP_IN: v = mk_bool(vcontains(c, b, a, n->line)); break;
        case OP_NOTIN: v = mk_bool(!vcontains(c, b, a, n->line)); break;
        default: v = arith(c, n->op, a, b, n->line);
        }
        break;
    }
    case N_AND: { jval a = eval(r, n->a, f); v = truthy(a) ? eval(r, n->b, f) : a; break; }
    case N_OR: { jval a = eval(r, n->a, f); v = truthy(a) ? a : eval(r, n->b, f); break; }
    case N_NOT: v = mk_bool(!truthy(eval(r, n->a, f))); break;
    case N_NEG: {
        jval a = eval(r, n->a, f);
        if (a.t == V_FLOAT) v = mk_float(-a.f);
        else if ((a.t == V_INT || a.t == V_BOOL) && a.i != INT64_MIN) v = mk_int(-a.i);
        else jfail(c, "line %d: bad operand type for unary -: '%s'", n->line, type_name(a));
        break;
    }
    case N_COND: v = truthy(eval(r, n->a, f)) ? eval(r, n->b, f) : n->c ? eval(r, n->c, f) : UNDEF; break;
    default: jfail(c, "line %d: not an expression", n->line);
    }
    c->depth--;
    return v;
}

static void assign_targets(rstate *r, const node *n, frame *f, jval item) {
    if (n->nnames == 1) {
        dict_set(r->c, f->vars, n->names[0], item);
        return;
    }
    jlist *l = iter_list(r->c, item, n->line);
    if ((int)l->n != n->nnames)
        jfail(r->c, "line %d: cannot unpack %zu values into %d loop variables", n->line, l->n, n->nnames);
    for (int i = 0; i < n->nnames; i++) dict_set(r->c, f->vars, n->names[i], l->v[i]);
}

static void render(rstate *r, const node *n, frame *f, jbuf *out) {
    jctx *c = r->c;
    if (++c->depth > DEPTH_LIMIT) jfail(c, "line %d: blocks nested too deeply", n->line);
    switch (n->kind) {
    case N_BODY:
        for (int i = 0; i < n->nkids && !r->ctl; i++) render(r, n->kids[i], f, out);
        break;
    case N_TEXT: buf_put(c, out, n->lit.s->p, n->lit.s->n); break;
    case N_OUT: to_str(c, out, eval(r, n->a, f), 0); break;
    case N_IF:
        if (truthy(eval(r, n->a, f))) render(r, n->b, f, out);
        else if (n->c) render(r, n->c, f, out);
        break;
    case N_FOR: {
        jlist *all = iter_list(c, eval(r, n->a, f), n->line), *items = all;
        frame body = {.parent = f, .vars = dict_new(c)};
        if (n->d) {  /* {% for x in xs if cond %}: loop.* counts the filtered items */
            items = list_new(c, all->n);
            for (size_t i = 0; i < all->n; i++) {
                assign_targets(r, n, &body, all->v[i]);
                if (truthy(eval(r, n->d, &body))) list_push(c, items, all->v[i]);
            }
        }
        static const jstr k_loop = {4, "loop"};
        for (size_t i = 0; i < items->n; i++) {
            body.vars = dict_new(c);
            assign_targets(r, n, &body, items->v[i]);
            jdict *lp = dict_new(c);
            size_t len = items->n;
#define LS(k, v) dict_set(c, lp, str_new(c, k, strlen(k)), v)
            LS("index", mk_int((int64_t)i + 1));
            LS("index0", mk_int((int64_t)i));
            LS("revindex", mk_int((int64_t)(len - i)));
            LS("revindex0", mk_int((int64_t)(len - i - 1)));
            LS("first", mk_bool(i == 0));
            LS("last", mk_bool(i + 1 == len));
            LS("length", mk_int((int64_t)len));
            LS("previtem", i > 0 ? items->v[i - 1] : UNDEF);
            LS("nextitem", i + 1 < len ? items->v[i + 1] : UNDEF);
#undef LS
            dict_set(c, body.vars, &k_loop, mk_dict(lp));
            render(r, n->b, &body, out);
            if (r->ctl == 1) { r->ctl = 0; break; }
            r->ctl = 0;
        }
        if (items->n == 0 && n->c) render(r, n->c, f, out);
        break;
    }
    case N_SET: dict_set(c, f->vars, n->name, eval(r, n->a, f)); break;
    case N_SETATTR: {
        jval ns = lookup(f, n->names[0]);
        if (ns.t != V_DICT || !ns.d->ns)
            jfail(c, "line %d: cannot assign attribute on a non-namespace object", n->line);
        dict_set(c, ns.d, n->name, eval(r, n->a, f));
        break;
    }
    case N_SETBLOCK: {
        jbuf b = {0};
        render(r, n->b, f, &b);
        dict_set(c, f->vars, n->name, buf_val(c, &b));
        break;
    }
    case N_MACRO: dict_set(c, f->vars, n->name, fn_val(c, F_MACRO, 0, n->name, UNDEF, n)); break;
    case N_BREAK: r->ctl = 1; break;
    case N_CONTINUE: r->ctl = 2; break;
    default: jfail(c, "line %d: not a statement", n->line);
    }
    c->depth--;
}

/* JSON -> values (jansson keeps object keys in insertion order, as Python's dicts do). */
static jval from_json(jctx *c, json_t *j, int depth) {
    if (depth > DEPTH_LIMIT) jfail(c, "variables nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: return NONE;
    case JSON_TRUE: return mk_bool(1);
    case JSON_FALSE: return mk_bool(0);
    case JSON_INTEGER: return mk_int((int64_t)json_integer_value(j));
    case JSON_REAL: return mk_float(json_real_value(j));
    case JSON_STRING: return mk_str(c, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        jlist *l = list_new(c, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) list_push(c, l, from_json(c, json_array_get(j, i), depth + 1));
        return mk_list(l);
    }
    case JSON_OBJECT: {
        jdict *d = dict_new(c);
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) dict_set(c, d, str_new(c, k, strlen(k)), from_json(c, v, depth + 1));
        return mk_dict(d);
    }
    }
    return UNDEF;
}

int jinja_render(const jinja_template *t, json_t *vars, char **out, size_t *out_len, char *err, size_t errlen) {
    jctx c = {0};
    *out = NULL;
    if (out_len) *out_len = 0;
    if (setjmp(c.jb)) {
        if (err && errlen) snprintf(err, errlen, "%s", c.msg);
        arena_free(&c);
        return -1;
    }
    rstate r = {.c = &c};
    frame globals = {.parent = NULL, .vars = dict_new(&c)};
    static const struct { const char *name; int id; } builtins[] = {
        {"range", B_RANGE}, {"namespace", B_NAMESPACE}, {"dict", B_DICT}, {"raise_exception", B_RAISE},
        {"strftime_now", B_STRFTIME}};
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++) {
        const jstr *nm = str_new(&c, builtins[i].name, strlen(builtins[i].name));
        dict_set(&c, globals.vars, nm, fn_val(&c, F_BUILTIN, builtins[i].id, nm, UNDEF, NULL));
    }
    if (vars && json_is_object(vars)) {
        const char *k;
        json_t *v;
        json_object_foreach(vars, k, v) dict_set(&c, globals.vars, str_new(&c, k, strlen(k)), from_json(&c, v, 0));
    }
    frame top = {.parent = &globals, .vars = dict_new(&c)};
    r.root = &top;
    jbuf b = {0};
    render(&r, t->root, &top, &b);
    char *res = malloc(b.n + 1);
    if (!res) {
        arena_free(&c);
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (b.n) memcpy(res, b.p, b.n);
    res[b.n] = 0;
    *out = res;
    if (out_len) *out_len = b.n;
    arena_free(&c);
    return 0;
}
