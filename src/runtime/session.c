/*
 * session.c — a sequence's state (KV cache, scratch, logits) and the forward pass over a layer plan.
 *
 * The forward is architecture-independent: it walks moet_layer entries that an architecture file bound, and does
 * all compute through the backend ABI. Every buffer is allocated when the session is created, sized by n_ctx and
 * n_batch, so eval() never allocates: decode is a loop over preallocated memory. The KV cache is paged (kv.c): an
 * eval takes the blocks its tokens need from the session's pool (a pop from a free list, and a small upload of the
 * block table) before it computes anything, so a pool that is full fails the eval with nothing changed.
 *
 * Long evals are cut into chunks of n_batch tokens; attention within a chunk is causal over the cache, so chunked
 * prefill, whole prefill and token-by-token decode compute the same function (tests check they agree).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/topk_key.h"
#include "core/util.h"
#include "model/model.h"
#include "runtime/kv_int.h"
#include "runtime/session_int.h"

struct moet_session {
    const moet_model *m;
    moet_backend *be;
    int32_t n_ctx, n_batch, n_logits_cap, pos;
    int32_t ec_cap;                 /* tokens a step at most (<= n_batch): halved while the expert cache's slots
                                       cannot hold the experts one step routes to */
    int ec_short;                   /* the last step_run failed for that reason */
    moet_kv *kv;                    /* the pool its KV blocks come from (NULL: a batch's scratch session) */
    int32_t *blk_host, *blk_dev;    /* the block table [blk_cap]: position p is in pool block blk[p >> kv->shift] */
    int32_t n_blk, blk_cap, blk_sent; /* blocks held; the table's size (n_ctx's blocks); entries on the backend */
    int32_t *toks;                  /* [n_ctx] the tokens at positions 0 .. pos - 1 (the prefix cache's keys) */
    uint64_t *bhash;                /* [blk_cap] prefix hash at the end of block i, for i < n_hashed */
    int32_t n_hashed;
    int kv_mixed;                   /* its KV mixes base and delta steps: kept out of the prefix cache */
    float *x, *h, *q, *k, *v, *att, *mlp_scr, *moe_scr, *att_scr, *topk_w;
    float *mla_cq, *mla_ckv, *mla_kpe, *mla_kvb, *mla_o; /* MLA's intermediates (hp.kv_lora_rank > 0), else NULL */
    int mla_latent;                 /* MLA on the latent cache (backend.h, mla_attn; kv_int.h) */
    int32_t *topk_ids;
    int32_t *tok_dev, *pos_dev;     /* backend memory: the chunk's token ids and positions [n_batch] */
    int32_t *pos_host;              /* [n_batch] staging for pos_dev */
    float *logits_dev;              /* backend memory [n_logits_cap][vocab] */
    float *logits;                  /* host copy [n_logits_cap][vocab] */
    int graphs;                     /* record/replay decode steps */
    uint32_t uid;                   /* owner of this session's graph records (keys are uid << 32 | shape) */
    int32_t n_logit_rows;
    int logits_stale;               /* the last eval left its logit rows on the backend only (candidates on) */
    int32_t n_cand, cand_cap;       /* candidates a row (0: off), rows they are kept for */
    int32_t cand_rows;              /* rows of candidates the last eval kept (0: none) */
    int32_t *cand_dev;              /* backend memory: [rows][n_cand] ids, [rows][n_cand] values (floats), then [rows]
                                       lz (floats: log sum exp(logit - max), the gate's confidence is exp(-lz)) */
    int32_t *cand;                  /* host copy, the same layout */
    int cand_lz;                    /* the topk op computes lz: the model has delta weights (the gate can run) */
    void *cand_scr;                 /* topk scratch */
    void **allocs;
    int n_allocs;
    moet_calib *calib;              /* statistics hook, NULL normally */
    float *route_stats;             /* router statistics hook (moet_session_set_route_stats), NULL normally */
    int use_delta;                  /* experts: base (0) or base + delta (1) */
    float delta_pick;               /* with use_delta: the picks that take it (moet_moe_args.delta_pick); 0: all */
    int64_t *delta_count;           /* moet_session_set_delta_count, NULL normally */
};

/* Blocks that positions [0, end) take. */
static int32_t kv_blocks(const moet_kv *kv, int64_t end) {
    return (int32_t)((end + ((int64_t)1 << kv->shift) - 1) >> kv->shift);
}

void moet_session_use_delta(moet_session *s, int on) {
    if (s->pos > 0 && (on != 0) != (s->use_delta != 0)) s->kv_mixed = 1;
    s->use_delta = on;
}

/* A recorded step bakes the value into its MoE launches, so the session's records go when it changes. */
static void session_set_pick(moet_session *s, float r) {
    r = r > 0.0f ? r : 0.0f;
    if (r == s->delta_pick) return;
    s->delta_pick = r;
    if (s->be) s->be->ops->graph_release(s->be, s->uid);
}

int moet_session_set_delta_pick(moet_session *s, float r, char *err, size_t errlen) {
    if (r != r) return moet_err(err, errlen, MOET_EINVAL, "delta pick: not a number");
    if (r > 0.0f)
        for (int32_t il = 0; il < s->m->hp.n_layers; il++)
            if (s->m->layers[il].dexp_gate)
                return moet_err(err, errlen, MOET_EUNSUP,
                                "the delta on some picks needs the delta as residuals beside the base (a delta pack: "
                                "moet quantize --experts w2+nvfp4); experts requantized in memory hold base + delta "
                                "as one matrix");
    if (s->pos > 0 && (r > 0.0f ? r : 0.0f) != s->delta_pick) s->kv_mixed = 1;
    session_set_pick(s, r);
    return MOET_OK;
}

float moet_gate_top1(const float *l, int32_t V) {
    float mx = l[0];
    for (int32_t k = 1; k < V; k++) mx = l[k] > mx ? l[k] : mx;
    double z = 0;
    for (int32_t k = 0; k < V; k++) z += exp((double)l[k] - mx);
    return expf((float)((double)mx - (mx + log(z))));
}

int moet_session_redo_delta(moet_session *s, int32_t token, char *err, size_t errlen) {
    if (s->pos < 1) return moet_err(err, errlen, MOET_EINVAL, "no step to redo");
    s->pos--;  /* the step again, on base + delta: its KV entries are overwritten */
    s->use_delta = 1;
    s->kv_mixed = 1;
    int rc = moet_session_eval(s, &token, 1, MOET_LOGITS_LAST, err, errlen);
    s->use_delta = 0;
    return rc;
}

int moet_session_eval_gated(moet_session *s, int32_t token, float tau, int *corrected, char *err, size_t errlen) {
    if (corrected) *corrected = 0;
    s->use_delta = 0;
    int rc = moet_session_eval(s, &token, 1, MOET_LOGITS_LAST, err, errlen);
    if (rc) return rc;
    if (!(moet_session_top1(s) < tau)) return MOET_OK;
    rc = moet_session_redo_delta(s, token, err, errlen);
    if (!rc && corrected) *corrected = 1;
    return rc;
}

void moet_session_set_calib(moet_session *s, moet_calib *c) { s->calib = c; }
void moet_session_set_route_stats(moet_session *s, float *buf) { s->route_stats = buf; }
void moet_session_set_delta_count(moet_session *s, int64_t *cnt) { s->delta_count = cnt; }
float moet_session_delta_pick(const moet_session *s) { return s->delta_pick; }

moet_session_options moet_session_default_options(void) {
    moet_session_options o = {.n_ctx = 0, .n_batch = 256, .n_logits = 0, .graphs = 1, .n_candidates = 0,
                              .kv = NULL, .kv_block = 32, .kv_type = MOET_KV_AUTO};
    return o;
}

static void *salloc(moet_session *s, size_t bytes) {
    void *p = s->be->ops->alloc(s->be, bytes);
    if (p) s->allocs[s->n_allocs++] = p;
    return p;
}

void moet_session_free(moet_session *s) {
    if (!s) return;
    if (s->be) s->be->ops->graph_release(s->be, s->uid);
    for (int i = 0; i < s->n_allocs; i++) s->be->ops->release(s->be, s->allocs[i]);
    if (s->kv) {
        while (s->n_blk > 0) moet_kv_give(s->kv, s->blk_host[--s->n_blk]);
        moet_kv_free(s->kv);
    }
    free(s->allocs);
    free(s->blk_host);
    free(s->toks);
    free(s->bhash);
    free(s->pos_host);
    free(s->logits);
    free(s->cand);
    free(s);
}

int moet_session_create(const moet_model *m, const moet_session_options *opt, moet_session **out, char *err,
                        size_t errlen) {
    return moet_session_create_on(m, NULL, opt, out, err, errlen);
}

static int session_create(const moet_model *m, moet_backend *be, const moet_session_options *opt, int with_kv,
                          moet_session **out, char *err, size_t errlen);

int moet_session_create_on(const moet_model *m, moet_backend *be, const moet_session_options *opt, moet_session **out,
                           char *err, size_t errlen) {
    return session_create(m, be, opt, 1, out, err, errlen);
}

/* with_kv = 0: a batch's scratch session, whose rows use their own sessions' caches */
static int session_create(const moet_model *m, moet_backend *be, const moet_session_options *opt, int with_kv,
                          moet_session **out, char *err, size_t errlen) {
    *out = NULL;
    moet_session_options o = opt ? *opt : moet_session_default_options();
    const moet_hparams *hp = &m->hp;
    if (o.n_ctx <= 0) o.n_ctx = hp->max_pos;
    if (o.n_batch <= 0) o.n_batch = 256;
    if (o.n_batch > o.n_ctx) o.n_batch = o.n_ctx;
    if (o.n_logits <= 0) o.n_logits = o.n_batch;
    if (o.n_ctx > hp->max_pos)
        return moet_err(err, errlen, MOET_ERANGE, "n_ctx %d exceeds the model's max_position_embeddings %d", o.n_ctx,
                        hp->max_pos);
    if (o.n_logits > o.n_ctx) o.n_logits = o.n_ctx;
    if (o.n_candidates < 0 || o.n_candidates > MOET_TOPK_MAX)
        return moet_err(err, errlen, MOET_EINVAL, "n_candidates %d outside [0, %d]", o.n_candidates, MOET_TOPK_MAX);
    moet_session *s = calloc(1, sizeof(*s));
    if (!s) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    s->m = m;
    s->be = be ? be : m->be;
    s->n_ctx = o.n_ctx;
    s->n_batch = o.n_batch;
    s->ec_cap = o.n_batch;
    s->n_logits_cap = o.n_logits;
    s->graphs = o.graphs;
    {
        static _Atomic uint32_t next_uid = 1;
        s->uid = next_uid++;
    }
    const size_t B = (size_t)o.n_batch, H = (size_t)hp->hidden, Dq = (size_t)hp->n_heads * hp->head_dim,
                 Dkv = (size_t)hp->n_kv_heads * hp->head_dim;
    s->allocs = calloc(32, sizeof(void *));
    s->pos_host = calloc(B, sizeof(int32_t));
    s->logits = calloc((size_t)o.n_logits * (size_t)hp->vocab, sizeof(float));
    if (!s->allocs || !s->pos_host || !s->logits) goto oom;
    if (with_kv) {
        if (o.kv) {
            if (o.kv->m != m || o.kv->be != s->be) {
                moet_session_free(s);
                return moet_err(err, errlen, MOET_EINVAL, "the KV pool belongs to another model or backend");
            }
            moet_kv_retain(o.kv);
            s->kv = o.kv;
        } else {
            int rc = moet_kv_create_on(m, s->be, o.n_ctx, o.kv_block, 0, o.kv_type, &s->kv, err, errlen);
            if (rc) { moet_session_free(s); return rc; }
        }
        s->blk_cap = kv_blocks(s->kv, o.n_ctx);
        if (!(s->blk_host = calloc((size_t)s->blk_cap, sizeof(int32_t)))) goto oom;
        if (!(s->toks = calloc((size_t)o.n_ctx, sizeof(int32_t)))) goto oom;
        if (!(s->bhash = calloc((size_t)s->blk_cap, sizeof(uint64_t)))) goto oom;
        if (!(s->blk_dev = salloc(s, (size_t)s->blk_cap * sizeof(int32_t)))) goto oom;
    }
    size_t F = (size_t)(hp->dense_ffn > 0 ? hp->dense_ffn : 1);
    if ((size_t)hp->shared_ffn > F) F = (size_t)hp->shared_ffn; /* the shared expert runs through mlp as well */
#define A(ptr, count) do { if (!((ptr) = salloc(s, (size_t)(count) * sizeof(*(ptr))))) goto oom; } while (0)
    /* MLA on the latent cache reads q and writes mla_o: no full keys, values or attention rows to hold */
    s->mla_latent = moet_kv_mla_latent(m, s->be);
    const size_t Dfull = s->mla_latent ? 0 : Dkv, Dout = s->mla_latent ? 0 : Dq;
    A(s->x, B * H);
    A(s->h, B * H);
    A(s->q, B * Dq);
    A(s->k, B * Dfull + 1);
    A(s->v, B * Dfull + 1);
    A(s->att, B * Dout + 1);
    A(s->tok_dev, B);
    A(s->pos_dev, B);
    A(s->mlp_scr, 2 * B * F);
    if (hp->kv_lora_rank > 0) {
        const size_t nh = (size_t)hp->n_heads;
        A(s->mla_cq, B * (size_t)(hp->q_lora_rank > 0 ? hp->q_lora_rank : 1));
        A(s->mla_ckv, B * (size_t)hp->kv_lora_rank);
        A(s->mla_kpe, B * (size_t)hp->rope_dim);
        A(s->mla_kvb, s->mla_latent ? 1 : B * nh * (size_t)(hp->qk_nope_dim + hp->v_head_dim));
        A(s->mla_o, B * nh * (size_t)hp->v_head_dim);
    }
    A(s->logits_dev, (size_t)o.n_logits * (size_t)hp->vocab);
    if (hp->n_experts > 0) {
        A(s->topk_ids, B * (size_t)hp->n_experts_used);
        A(s->topk_w, B * (size_t)hp->n_experts_used);
        size_t mb = s->be->ops->moe_scratch_bytes(s->be, (int64_t)B, hp->hidden, hp->expert_ffn, hp->n_experts,
                                                   hp->n_experts_used);
        if (!(s->moe_scr = salloc(s, mb))) goto oom;
    }
    if (!(s->att_scr = salloc(s, s->be->ops->attn_scratch_bytes(s->be, o.n_ctx)))) goto oom;
    const char *ce = getenv("MOET_CANDIDATES"); /* "0": none, whatever the options say (A/B measurements) */
    if (o.n_candidates > 0 && s->be->ops->topk && !(ce && ce[0] == '0')) {
        /* a session keeps its last row's; a batch (no KV of its own) one a row */
        s->n_cand = o.n_candidates < hp->vocab ? o.n_candidates : hp->vocab;
        for (int il = 0; il < hp->n_layers; il++) /* lz only where the gate can use it (a CPU scan of the row) */
            s->cand_lz |= m->layers[il].is_moe && (m->layers[il].dres_gate || m->layers[il].dexp_gate);
        s->cand_cap = with_kv ? 1 : o.n_batch;
        A(s->cand_dev, (2 * (size_t)s->n_cand + 1) * (size_t)s->cand_cap);
        if (!(s->cand = malloc((2 * (size_t)s->n_cand + 1) * (size_t)s->cand_cap * sizeof(int32_t)))) goto oom;
        if (!(s->cand_scr = salloc(s, s->be->ops->topk_scratch_bytes(s->be, s->cand_cap, hp->vocab, s->n_cand))))
            goto oom;
    }
#undef A
    *out = s;
    return MOET_OK;
oom:
    moet_session_free(s);
    return moet_err(err, errlen, MOET_ENOMEM, "out of memory creating a session (n_ctx %d, n_batch %d)", o.n_ctx,
                    o.n_batch);
}

/* Session s's cache as layer il's ops see it. */
static moet_kv_ref session_kv_ref(const moet_session *s, int il) {
    const moet_kv_ref r = {s->kv->k[il], s->kv->v[il], s->blk_dev, s->kv->shift, s->kv->type};
    return r;
}

/* One chunk of n <= n_batch tokens, whose ids and positions are already in tok_dev / pos_dev. Logits of rows
 * [first_logit, n) go to out (backend memory). Everything it reads that varies between steps is in backend memory,
 * so the CUDA backend can record it once per shape and replay it. */
typedef struct {
    moet_session *s;
    int32_t n, first_logit;
    float *out;
    moet_session *const *rows;  /* batched decode: row i is the next token of rows[i] (its KV cache); NULL: all s's */
    const moet_kv_ref *kvtab;   /* batched decode, backend memory: layer il's row caches at kvtab + il * kv_stride */
    int32_t kv_stride;
    int *declined;              /* set when the backend's attn_rows declined the shape (the rows were composed) */
    int cand;                   /* the logit rows' candidates too (s->n_cand of each, to s->cand_dev) */
} chunk_args;

/* MLA's attention inputs (DeepSeek-V3; hparams.h): the pre-norm with the q bottleneck (or q_proj), the latent kv
 * and the shared rotary key as one fused projection, the bottlenecks' RMSNorms, q_b_proj and kv_b_proj, then
 * mla_prep lays q, k and v out as attn_prep takes them (n_kv = n_heads, head_dim = rope + nope, v zero-padded). */
static void mla_inputs(moet_session *s, const moet_layer *L, int32_t n) {
    const moet_hparams *hp = &s->m->hp;
    const moet_backend_ops *op = s->be->ops;
    moet_backend *be = s->be;
    const int64_t H = hp->hidden;
    const int lora = hp->q_lora_rank > 0;
    const moet_weight *w[3] = {lora ? &L->q_a : &L->wq, &L->kv_a, &L->kv_pe};
    float *y[3] = {lora ? s->mla_cq : s->q, s->mla_ckv, s->mla_kpe};
    op->norm_mul_mat(be, s->x, L->attn_norm, hp->rms_eps, n, H, s->h, 3, w, NULL, y);
    if (lora) {
        op->rms_norm(be, s->mla_cq, L->q_a_norm, n, hp->q_lora_rank, hp->mla_eps, s->mla_cq);
        op->mul_mat(be, &L->wq, s->mla_cq, n, s->q);
    }
    op->rms_norm(be, s->mla_ckv, L->kv_a_norm, n, hp->kv_lora_rank, hp->mla_eps, s->mla_ckv);
    if (s->mla_latent) return; /* mla_attn takes q, the latent and the rotary key as they are */
    op->mul_mat(be, &L->kv_b, s->mla_ckv, n, s->mla_kvb);
    op->mla_prep(be, s->q, s->mla_kvb, s->mla_kpe, n, hp->n_heads, hp->qk_nope_dim, hp->rope_dim, hp->v_head_dim,
                 hp->rope_interleave, s->k, s->v);
}

static void forward_chunk(void *vctx) {
    const chunk_args *ca = vctx;
    moet_session *s = ca->s;
    const int32_t n = ca->n;
    const moet_model *m = s->m;
    const moet_hparams *hp = &m->hp;
    const moet_backend_ops *op = s->be->ops;
    moet_backend *be = s->be;
    const int64_t H = hp->hidden, hd = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads;
    const int64_t Dq = nh * hd, Dkv = nkv * hd;

    op->get_rows(be, &m->tok_embd, s->tok_dev, n, s->x);
    /* Per layer, fused where the ops allow (backend.h): pre-norm + q/k/v projections; q/k norm + RoPE + KV write;
     * attention; o_proj added onto the residual stream; the MoE block with its pre-norm and residual add. */
    for (int il = 0; il < hp->n_layers; il++) {
        const moet_layer *L = &m->layers[il];
        if (hp->kv_lora_rank > 0) {
            mla_inputs(s, L, n);
        } else {
            const moet_weight *qkv_w[3] = {&L->wq, &L->wk, &L->wv};
            float *qkv_y[3] = {s->q, s->k, s->v};
            const float *qkv_b[3] = {L->bq, L->bk, L->bv}; /* GLM-4.5, gpt-oss: added in the products' store */
            op->norm_mul_mat(be, s->x, L->attn_norm, hp->rms_eps, n, H, s->h, 3, qkv_w,
                             L->bq || L->bk || L->bv ? qkv_b : NULL, qkv_y);
        }
        const float ascale = hp->attn_scale > 0 ? hp->attn_scale : (float)(1.0 / sqrt((double)hd));
        /* the only per-sequence work: a row's keys and values go to its own cache, and it attends over that: all
         * rows in one op where the backend takes them (caches from a table in backend memory), else row by row */
        int rows_done = 0;
        if (s->mla_latent) { /* MLA on the latent cache: rows one by one (each its own cache), else the chunk */
            for (int32_t r = 0; r < (ca->rows ? n : 1); r++) {
                const moet_kv_ref kv = session_kv_ref(ca->rows ? ca->rows[r] : s, il);
                op->mla_attn(be, s->q + r * Dq, s->mla_ckv + (size_t)r * (size_t)hp->kv_lora_rank,
                             s->mla_kpe + (size_t)r * (size_t)hp->rope_dim, &L->kv_b, ca->rows ? 1 : n, (int32_t)nh,
                             hp->qk_nope_dim, hp->rope_dim, hp->v_head_dim, hp->kv_lora_rank, hp->rope_interleave,
                             &hp->rope, s->pos_dev + r, &kv, ascale, s->mla_o + (size_t)r * (size_t)(nh * hp->v_head_dim));
            }
            rows_done = 1;
            /* each row's cache went in by value: a recorded step would keep these rows' caches, so a batch of
             * rows runs eagerly (as when attn_rows declines) */
            if (ca->rows && ca->declined) *ca->declined = 1;
        }
        int one_type = 1; /* attn_rows takes rows whose pools share an element type (backend.h) */
        for (int32_t r = 1; ca->rows && r < n; r++) one_type &= ca->rows[r]->kv->type == ca->rows[0]->kv->type;
        if (!rows_done && ca->rows && ca->kvtab && op->attn_rows && one_type) {
            moet_attn_args aa = {.q = s->q, .kv = {.type = ca->rows[0]->kv->type}, .pos = s->pos_dev, .n_tok = n,
                                 .n_heads = (int32_t)nh,
                                 .n_kv = (int32_t)nkv, .head_dim = (int32_t)hd, .n_ctx = s->n_ctx,
                                 .scale = ascale, .sinks = L->sinks, .window = L->window, .out = s->att,
                                 .scratch = s->att_scr};
            rows_done = op->attn_rows(be, s->q, s->k, s->v, L->q_norm, L->k_norm, hp->rms_eps, &hp->rope,
                                      ca->kvtab + (size_t)il * (size_t)ca->kv_stride, &aa) == 0;
            if (!rows_done && ca->declined) *ca->declined = 1;
        }
        if (!rows_done && ca->rows && !one_type && ca->declined) *ca->declined = 1; /* row by row, eagerly */
        for (int32_t r = 0; !rows_done && r < (ca->rows ? n : 1); r++) {
            const moet_session *o = ca->rows ? ca->rows[r] : s;
            const int32_t nr = ca->rows ? 1 : n;
            const moet_kv_ref kv = session_kv_ref(o, il);
            moet_attn_args aa = {.q = s->q + r * Dq, .kv = kv, .pos = s->pos_dev + r, .n_tok = nr,
                                 .n_heads = (int32_t)nh, .n_kv = (int32_t)nkv, .head_dim = (int32_t)hd, .n_ctx = o->n_ctx,
                                 .scale = ascale, .sinks = L->sinks, .window = L->window, .out = s->att + r * Dq,
                                 .scratch = s->att_scr};
            if (op->attn_fused) {
                op->attn_fused(be, s->q + r * Dq, s->k + r * Dkv, s->v + r * Dkv, L->q_norm, L->k_norm, hp->rms_eps,
                               &hp->rope, &aa);
            } else {
                op->attn_prep(be, s->q + r * Dq, s->k + r * Dkv, s->v + r * Dkv, nr, (int32_t)nh, (int32_t)nkv,
                              (int32_t)hd, L->q_norm, L->k_norm, hp->rms_eps, &hp->rope, s->pos_dev + r, &kv);
                op->attention(be, &aa);
            }
        }
        const float *att = s->att;
        if (hp->kv_lora_rank > 0) { /* MLA: each head's output back from the q/k width to v_head_dim (latent: there) */
            if (!s->mla_latent) op->heads_narrow(be, s->att, n, (int32_t)nh, (int32_t)hd, hp->v_head_dim, s->mla_o);
            att = s->mla_o;
        }
        op->mul_mat_acc(be, &L->wo, att, n, L->bo, s->x); /* x += (o + bias) */
        if (L->is_moe) {
            /* delta on: a delta pack's residuals beside the base (fused), else in-memory base + delta (f32) */
            const int dres = s->use_delta && L->dres_gate, dexp = s->use_delta && !dres && L->dexp_gate;
            moet_moe_args ma = {.x = s->x, .n_tok = n, .hidden = H, .ffn = hp->expert_ffn, .router = &L->router,
                                .n_experts = hp->n_experts, .n_used = hp->n_experts_used,
                                .scoring = hp->router_scoring, .norm_topk = hp->norm_topk,
                                .router_bias = L->router_bias, .n_group = hp->n_group,
                                .router_lbias = L->router_lbias, .gate_b = L->exp_gate_b, .up_b = L->exp_up_b,
                                .down_b = L->exp_down_b, .swiglu_limit = hp->swiglu_limit,
                                .topk_group = hp->topk_group, .route_scale = hp->route_scale,
                                .gate = dexp ? L->dexp_gate : L->exp_gate,
                                .up = dexp ? L->dexp_up : L->exp_up,
                                .down = dexp ? L->dexp_down : L->exp_down,
                                .dgate = dres ? L->dres_gate : NULL,
                                .dup = dres ? L->dres_up : NULL,
                                .ddown = dres ? L->dres_down : NULL, .delta_pick = s->delta_pick,
                                .delta_count = s->delta_count,
                                .topk_ids = s->topk_ids, .topk_w = s->topk_w,
                                .y = s->x, .scratch = s->moe_scr,
                                .norm_w = L->ffn_norm, .eps = hp->rms_eps, .h = s->h, .accumulate = 1};
            if (s->calib) {
                ma.calib_in = s->calib->h_in[il];
                ma.calib_down = s->calib->h_down[il];
                ma.calib_count = s->calib->count[il];
            }
            if (s->route_stats) ma.route_stats = s->route_stats + (size_t)il * 2 * (size_t)n;
            for (int jl = il + 1; jl < hp->n_layers; jl++) /* the next MoE layer: the expert cache's prefetch */
                if (m->layers[jl].is_moe) {
                    const moet_layer *N = &m->layers[jl];
                    ma.next_router = &N->router;
                    ma.next_norm_w = N->ffn_norm;
                    ma.next_gate = dexp ? N->dexp_gate : N->exp_gate;
                    ma.next_router_bias = N->router_bias;
                    break;
                }
            op->moe(be, &ma);
            if (hp->shared_ffn > 0) /* the shared expert, on the block's normed input (moe left it in h), onto x */
                op->mlp(be, &L->sh_gate, &L->sh_up, &L->sh_down, s->h, NULL, 0.f, NULL, n, s->mlp_scr, s->x);
        } else { /* a dense layer: its pre-norm into h, the MLP onto x */
            op->mlp(be, &L->gate, &L->up, &L->down, s->x, L->ffn_norm, hp->rms_eps, s->h, n, s->mlp_scr, s->x);
        }
    }
    if (ca->first_logit >= n) return;
    const int32_t nl = n - ca->first_logit;
    const moet_weight *lm = &m->output;
    op->norm_mul_mat(be, s->x + (size_t)ca->first_logit * H, m->out_norm, hp->rms_eps, nl, H, s->h, 1, &lm, NULL,
                     &ca->out);
    if (ca->cand)
        op->topk(be, ca->out, nl, hp->vocab, s->n_cand, s->cand_scr, s->cand_dev,
                 (float *)(s->cand_dev + (size_t)nl * (size_t)s->n_cand),
                 s->cand_lz ? (float *)(s->cand_dev + 2 * (size_t)nl * (size_t)s->n_cand) : NULL);
}

/* Decode-sized chunks are replayed from a record (graph_run); prefill chunks of every other size launch directly. */
#define GRAPH_MAX_TOKENS 64

/* One step: recorded (key != 0) or launched directly; run again while the backend's expert cache reports that it
 * missed experts and has fetched them (backend.h: the replay rewrites the same KV rows, so a step that completes is
 * the resident forward). */
static int step_run(moet_session *s, uint64_t key, chunk_args *ca, int32_t n, char *err, size_t errlen) {
    const moet_backend_ops *op = s->be->ops;
    for (;;) {
        if (key) {
            if (op->graph_run(s->be, key, forward_chunk, ca))
                return moet_err(err, errlen, MOET_EDEVICE, "%s backend: recording or replaying a step failed", op->name);
        } else {
            forward_chunk(ca);
        }
        const int64_t f = op->expert_cache_resolve ? op->expert_cache_resolve(s->be) : 0;
        if (f == 0) return MOET_OK;
        s->ec_short = f < 0;
        if (f < 0)
            return moet_err(err, errlen, MOET_ENOMEM, "expert cache: its slots cannot hold the experts one step of %d "
                            "tokens routes to (more slots, or fewer tokens a step)", n);
    }
}

static int run_chunk(moet_session *s, const int32_t *tokens, int32_t n, int32_t first_logit, float *out, int cand,
                     char *err, size_t errlen) {
    const moet_backend_ops *op = s->be->ops;
    for (int32_t t = 0; t < n; t++) s->pos_host[t] = s->pos + t;
    op->upload(s->be, s->tok_dev, tokens, (size_t)n * sizeof(int32_t));
    op->upload(s->be, s->pos_dev, s->pos_host, (size_t)n * sizeof(int32_t));
    chunk_args ca = {s, n, first_logit, out, NULL, NULL, 0, NULL, cand};
    if (s->graphs && !s->calib && n <= GRAPH_MAX_TOKENS && out == s->logits_dev) {
        /* a record bakes in this session's buffers and the chunk's shape: both are in the key */
        uint64_t key = (uint64_t)s->uid << 32 | (uint64_t)n << 16 | (uint64_t)first_logit << 4 |
                       (uint64_t)(cand != 0) << 1 | (uint64_t)(s->use_delta != 0);
        int rc = step_run(s, key, &ca, n, err, errlen);
        if (rc) return rc;
    } else {
        int rc = step_run(s, 0, &ca, n, err, errlen);
        if (rc) return rc;
    }
    s->pos += n;
    return MOET_OK;
}

/* After a forward of `rows` logit rows: with cand, only their candidates come to the host now (the rows when they
 * are asked for: session_rows); else the rows. */
static void session_keep(moet_session *s, int32_t rows, int cand) {
    s->n_logit_rows = rows;
    s->cand_rows = cand ? rows : 0;
    s->logits_stale = cand;
    if (cand)
        s->be->ops->download(s->be, s->cand, s->cand_dev, (2 * (size_t)s->n_cand + 1) * (size_t)rows * sizeof(int32_t));
    else
        s->be->ops->download(s->be, s->logits, s->logits_dev, (size_t)rows * (size_t)s->m->hp.vocab * sizeof(float));
}

/* ---- KV blocks --------------------------------------------------------------------------------------------- */


/* The prefix hash before block 0: the delta mode is part of the key (base and base + delta make different KV). */
static uint64_t kv_seed(const moet_session *s) {
    uint32_t pb;
    memcpy(&pb, &s->delta_pick, sizeof pb);
    return 0xcbf29ce484222325ull ^ (s->use_delta ? 0x9e3779b97f4a7c15ull ^ (uint64_t)pb * 0x100000001b3ull : 0);
}

/* The block holding position pos is about to be written: a block shared with another session is copied to one of
 * the session's own first (one block taken: the caller counted it), a sealed one of its own unsealed. */
static void session_writable(moet_session *s) {
    moet_kv *kv = s->kv;
    const int32_t i = s->pos >> kv->shift;
    if (i >= s->n_blk) return;
    if (s->n_hashed > i) s->n_hashed = i;
    const int32_t b = s->blk_host[i];
    if (kv->ref[b] > 1) {
        const int32_t nb = moet_kv_take(kv);
        const moet_hparams *hp = &s->m->hp;
        /* bytes a block of each pool */
        const size_t rows = (size_t)1 << kv->shift, kb = rows * kv->kdim * kv->esize, vb = rows * kv->vdim * kv->esize;
        for (int32_t l = 0; l < hp->n_layers; l++) {
            s->be->ops->copy(s->be, (char *)kv->k[l] + (size_t)nb * kb, (char *)kv->k[l] + (size_t)b * kb, kb);
            if (vb) s->be->ops->copy(s->be, (char *)kv->v[l] + (size_t)nb * vb, (char *)kv->v[l] + (size_t)b * vb, vb);
        }
        moet_kv_give(kv, b);
        s->blk_host[i] = nb;
        if (s->blk_sent > i) s->blk_sent = i;
    } else {
        moet_kv_unseal(kv, b);
    }
}

/* Blocks for positions [0, end), end > pos, the one at pos made writable: taken from the pool (all or none: a pool
 * without enough available blocks changes nothing), and the table's new entries sent to the backend. */
static int session_reserve(moet_session *s, int64_t end, char *err, size_t errlen) {
    moet_kv *kv = s->kv;
    const int32_t need = kv_blocks(kv, end), i = s->pos >> kv->shift;
    const int cow = end > s->pos && i < s->n_blk && kv->ref[s->blk_host[i]] > 1;
    const int32_t extra = (need > s->n_blk ? need - s->n_blk : 0) + cow;
    if (extra > moet_kv_available(kv))
        return moet_err(err, errlen, MOET_ENOMEM, "KV pool exhausted: %d more blocks of %d tokens needed, %d free",
                        extra, 1 << kv->shift, moet_kv_available(kv));
    if (end > s->pos) session_writable(s);
    while (s->n_blk < need) s->blk_host[s->n_blk++] = moet_kv_take(kv);
    if (s->blk_sent < s->n_blk) {
        s->be->ops->upload(s->be, s->blk_dev + s->blk_sent, s->blk_host + s->blk_sent,
                           (size_t)(s->n_blk - s->blk_sent) * sizeof(int32_t));
        s->blk_sent = s->n_blk;
    }
    return MOET_OK;
}

/* Gives back the blocks past those positions [0, end) need. */
static void session_release(moet_session *s, int64_t end) {
    const int32_t keep = kv_blocks(s->kv, end);
    while (s->n_blk > keep) moet_kv_give(s->kv, s->blk_host[--s->n_blk]);
    if (s->blk_sent > s->n_blk) s->blk_sent = s->n_blk;
    if (s->n_hashed > (int32_t)(end >> s->kv->shift)) s->n_hashed = (int32_t)(end >> s->kv->shift);
}

/* Prefix cache: the leading full blocks of tokens[0, n) that the pool holds already (hash of the whole prefix, the
 * block's tokens compared), taken by reference instead of computed; at least one token is left to compute (its
 * logits are the eval's). Returns how many tokens it took. */
static int32_t session_match(moet_session *s, const int32_t *tokens, int32_t n) {
    moet_kv *kv = s->kv;
    const int32_t B = 1 << kv->shift;
    int32_t off = 0;
    while (kv->prefix && !s->kv_mixed && !(s->pos & (B - 1)) && n - off > B) {
        const int32_t i = s->pos >> kv->shift;
        if (i != s->n_hashed) break; /* the chain needs every earlier block's hash */
        const uint64_t h = moet_kv_chain(i ? s->bhash[i - 1] : kv_seed(s), tokens + off, B);
        const int32_t b = moet_kv_lookup(kv, h, tokens + off);
        if (b < 0) break;
        moet_kv_hold(kv, b);
        if (i < s->n_blk) moet_kv_give(kv, s->blk_host[i]); /* a block reserved for it, not written yet */
        else s->n_blk++;
        s->blk_host[i] = b;
        if (s->blk_sent > i) s->blk_sent = i;
        s->bhash[i] = h;
        s->n_hashed = i + 1;
        memcpy(s->toks + s->pos, tokens + off, (size_t)B * sizeof(int32_t));
        s->pos += B;
        off += B;
        kv->hit_tokens += (uint64_t)B;
    }
    return off;
}

/* After an eval or a batched step: the blocks it filled are hashed and sealed (kept for later evals to share). */
static void session_seal(moet_session *s) {
    moet_kv *kv = s->kv;
    if (!kv->prefix || s->kv_mixed) return;
    const int32_t full = s->pos >> kv->shift, B = 1 << kv->shift;
    for (int32_t i = s->n_hashed; i < full; i++) {
        const uint64_t h = moet_kv_chain(i ? s->bhash[i - 1] : kv_seed(s), s->toks + (size_t)i * B, B);
        s->bhash[i] = h;
        moet_kv_seal(kv, s->blk_host[i], h, s->toks + (size_t)i * B);
        s->n_hashed = i + 1;
    }
}

int moet_session_reserve(moet_session *s, int32_t n, char *err, size_t errlen) {
    if (n < 0) return moet_err(err, errlen, MOET_EINVAL, "reserve of %d tokens", n);
    if (!s->kv) return moet_err(err, errlen, MOET_EINVAL, "a session without a KV cache");
    if ((int64_t)s->pos + n > s->n_ctx)
        return moet_err(err, errlen, MOET_ERANGE, "context full: %d + %d tokens exceed n_ctx %d", s->pos, n, s->n_ctx);
    return session_reserve(s, (int64_t)s->pos + n, err, errlen);
}

int moet_session_eval(moet_session *s, const int32_t *tokens, int32_t n, int logits_mode, char *err, size_t errlen) {
    const int32_t V = s->m->hp.vocab;
    if (n <= 0) return moet_err(err, errlen, MOET_EINVAL, "eval of %d tokens", n);
    if ((int64_t)s->pos + n > s->n_ctx)
        return moet_err(err, errlen, MOET_ERANGE, "context full: %d + %d tokens exceed n_ctx %d", s->pos, n, s->n_ctx);
    if (logits_mode == MOET_LOGITS_ALL && n > s->n_logits_cap)
        return moet_err(err, errlen, MOET_ERANGE, "%d logit rows requested, the session keeps at most %d", n,
                        s->n_logits_cap);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return moet_err(err, errlen, MOET_EINVAL, "token id %d at %d outside [0, %d)", tokens[i], i, V);
    const int32_t p0 = s->pos;
    if (logits_mode != MOET_LOGITS_ALL && !s->calib) { /* leading blocks computed before, by any session */
        const int32_t took = session_match(s, tokens, n);
        tokens += took;
        n -= took;
    }
    int rc = session_reserve(s, (int64_t)s->pos + n, err, errlen);
    if (rc) {
        s->pos = p0;
        session_release(s, p0);
        return rc;
    }
    memcpy(s->toks + s->pos, tokens, (size_t)n * sizeof(int32_t));
    for (int32_t off = 0; off < n;) {
        int32_t c = n - off < s->ec_cap ? n - off : s->ec_cap;
        int last = off + c == n;
        s->ec_short = 0;
        if (logits_mode == MOET_LOGITS_ALL)
            rc = run_chunk(s, tokens + off, c, 0, s->logits_dev + (size_t)off * V, 0, err, errlen);
        else
            rc = run_chunk(s, tokens + off, c, last ? c - 1 : c, s->logits_dev, last && s->n_cand > 0, err, errlen);
        if (rc && s->ec_short && c > 1) {
            /* the expert cache cannot hold what c tokens route to: the same tokens in smaller steps (the failed
             * step's KV rows are rewritten by them; the cap stays for the session) */
            s->ec_cap = (c + 1) / 2;
            MOET_LOGI("expert cache: a step of %d tokens routes to more experts than its slots hold; steps of %d now",
                      c, s->ec_cap);
            continue;
        }
        if (rc) return rc;
        off += c;
    }
    session_keep(s, logits_mode == MOET_LOGITS_ALL ? n : 1, logits_mode != MOET_LOGITS_ALL && s->n_cand > 0);
    rc = s->be->ops->status(s->be, err, errlen);
    if (!rc) session_seal(s);
    return rc;
}

/* The host copy of the last eval's logit rows, fetched from the backend here when the eval left them there
 * (candidates on). The session is logically const: only its host cache of the rows changes. */
static const float *session_rows(const moet_session *cs) {
    moet_session *s = (moet_session *)cs;
    if (s->logits_stale) {
        s->be->ops->download(s->be, s->logits, s->logits_dev,
                             (size_t)s->n_logit_rows * (size_t)s->m->hp.vocab * sizeof(float));
        s->logits_stale = 0;
    }
    return s->logits;
}

const float *moet_session_logits(const moet_session *s, int32_t *n_rows) {
    if (n_rows) *n_rows = s->n_logit_rows;
    return session_rows(s);
}

/* row r of the last eval's candidates */
static int32_t session_cands(const moet_session *s, int32_t r, const int32_t **ids, const float **vals) {
    if (r < 0 || r >= s->cand_rows) {
        if (ids) *ids = NULL;
        if (vals) *vals = NULL;
        return 0;
    }
    const size_t k = (size_t)s->n_cand, n = (size_t)s->cand_rows;
    if (ids) *ids = s->cand + (size_t)r * k;
    if (vals) *vals = (const float *)(s->cand + n * k) + (size_t)r * k;
    return s->n_cand;
}

int32_t moet_session_candidates(const moet_session *s, const int32_t **ids, const float **vals) {
    return session_cands(s, 0, ids, vals);
}

/* The gate's confidence of row r of the last eval: from the candidates' lz where the eval kept them (the row stays
 * on the backend), else from the row. */
static float session_top1(const moet_session *s, int32_t r) {
    if (r >= 0 && r < s->cand_rows && s->cand_lz)
        return expf(-((const float *)s->cand)[2 * (size_t)s->cand_rows * (size_t)s->n_cand + (size_t)r]);
    return moet_gate_top1(session_rows(s) + (size_t)r * (size_t)s->m->hp.vocab, s->m->hp.vocab);
}

int32_t moet_session_kv_type(const moet_session *s) { return moet_kv_type(s->kv); }

int32_t moet_session_pos(const moet_session *s) { return s->pos; }

int moet_session_truncate(moet_session *s, int32_t pos, char *err, size_t errlen) {
    if (pos < 0 || pos > s->pos)
        return moet_err(err, errlen, MOET_EINVAL, "truncate to %d outside [0, %d]", pos, s->pos);
    s->pos = pos;
    session_release(s, pos);
    if (pos == 0) s->kv_mixed = 0;
    return MOET_OK;
}

/* ---- batched decode -----------------------------------------------------------------------------------------
 * A batch is a session without a KV cache of its own, sized for max_seqs rows: row i of a step is the next token of
 * sessions[i], so the weights are read once for all of them (matmuls and the MoE take the rows together) and only
 * the KV writes and attention run per row, on each session's cache. The rows' caches (pools and block tables) go to
 * the backend as a table in its memory (attn_rows: one op a layer for all rows; uploaded only when the rows change),
 * so everything that differs between steps with the same number of rows is in backend memory and a step of n rows
 * is recorded once and replayed (graph_run) whatever sessions fill it. A backend that declines attn_rows for the model's shape gets the rows one by one, launched
 * directly (their cache pointers would be baked into a record). */
struct moet_batch {
    moet_session *s;     /* scratch and logits for max_seqs rows, no KV cache */
    int32_t max_seqs;
    moet_kv_ref *kvtab_host; /* [n_layers][max_seqs] the rows' caches, staged for kvtab_dev */
    moet_kv_ref *kvtab_dev;  /* backend memory, the same */
    int32_t kvtab_rows;      /* rows of kvtab_dev that hold what kvtab_host holds (0: resend) */
    int rows_ok;         /* attn_rows: -1 not tried yet, 1 takes this model's shape, 0 declines it */
};

int moet_batch_create(const moet_model *m, int32_t max_seqs, int32_t n_ctx, moet_batch **out, char *err, size_t errlen) {
    *out = NULL;
    if (max_seqs < 1) return moet_err(err, errlen, MOET_EINVAL, "a batch of %d sequences", max_seqs);
    moet_batch *b = calloc(1, sizeof *b);
    if (!b) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    /* n_ctx sizes the attention scratch (the longest member context); no KV cache of its own */
    moet_session_options o = {.n_ctx = n_ctx > max_seqs ? n_ctx : max_seqs, .n_batch = max_seqs, .n_logits = max_seqs,
                              .graphs = 1, .n_candidates = MOET_TOPK_MAX};
    int rc = session_create(m, NULL, &o, 0, &b->s, err, errlen);
    if (rc) { free(b); return rc; }
    b->max_seqs = max_seqs;
    b->rows_ok = -1;
    const size_t tab = (size_t)m->hp.n_layers * (size_t)max_seqs * sizeof(moet_kv_ref);
    b->kvtab_host = calloc(1, tab);
    b->kvtab_dev = b->s->be->ops->alloc(b->s->be, tab);
    if (!b->kvtab_host || !b->kvtab_dev) {
        moet_batch_free(b);
        return moet_err(err, errlen, MOET_ENOMEM, "out of memory creating a batch of %d sequences", max_seqs);
    }
    *out = b;
    return MOET_OK;
}

void moet_batch_free(moet_batch *b) {
    if (!b) return;
    if (b->kvtab_dev) b->s->be->ops->release(b->s->be, b->kvtab_dev);
    free(b->kvtab_host);
    moet_session_free(b->s);
    free(b);
}

int moet_batch_decode(moet_batch *b, moet_session *const *seqs, const int32_t *tokens, int32_t n, char *err,
                      size_t errlen) {
    moet_session *s = b->s;
    const int32_t V = s->m->hp.vocab;
    if (n < 1 || n > b->max_seqs) return moet_err(err, errlen, MOET_EINVAL, "batch of %d rows (at most %d)", n, b->max_seqs);
    for (int32_t i = 0; i < n; i++) {
        const moet_session *q = seqs[i];
        if (q->m != s->m || q->be != s->be)
            return moet_err(err, errlen, MOET_EINVAL, "batch row %d: a session of another model or backend", i);
        if (!q->kv) return moet_err(err, errlen, MOET_EINVAL, "batch row %d: a session without a KV cache", i);
        if (q->pos >= q->n_ctx) return moet_err(err, errlen, MOET_ERANGE, "batch row %d: context full (%d)", i, q->n_ctx);
        if (q->n_ctx > s->n_ctx) return moet_err(err, errlen, MOET_ERANGE, "batch row %d: context %d exceeds the batch's %d", i, q->n_ctx, s->n_ctx);
        if (q->use_delta != seqs[0]->use_delta || q->delta_pick != seqs[0]->delta_pick)
            return moet_err(err, errlen, MOET_EINVAL, "batch rows mix delta modes");
        if (tokens[i] < 0 || tokens[i] >= V) return moet_err(err, errlen, MOET_EINVAL, "batch row %d: token id %d outside [0, %d)", i, tokens[i], V);
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == q) return moet_err(err, errlen, MOET_EINVAL, "batch rows %d and %d are one session", j, i);
        s->pos_host[i] = q->pos;
    }
    for (int32_t i = 0; i < n; i++) { /* every row's block for its next token, or none of them */
        int rc = session_reserve(seqs[i], (int64_t)seqs[i]->pos + 1, err, errlen);
        if (rc) {
            for (int32_t j = 0; j < i; j++) session_release(seqs[j], seqs[j]->pos);
            char m2[192];
            snprintf(m2, sizeof m2, "%s", err ? err : "");
            return moet_err(err, errlen, rc, "batch row %d: %s", i, m2);
        }
    }
    const moet_backend_ops *op = s->be->ops;
    op->upload(s->be, s->tok_dev, tokens, (size_t)n * sizeof(int32_t));
    op->upload(s->be, s->pos_dev, s->pos_host, (size_t)n * sizeof(int32_t));
    s->use_delta = seqs[0]->use_delta;
    session_set_pick(s, seqs[0]->delta_pick);
    const int32_t L = s->m->hp.n_layers, stride = b->max_seqs;
    int declined = 0;
    chunk_args ca = {s, n, 0, s->logits_dev, seqs, NULL, stride, &declined, s->n_cand > 0};
    if (b->rows_ok != 0 && op->attn_rows) {
        int same = b->kvtab_rows >= n;
        for (int32_t il = 0; il < L; il++)
            for (int32_t i = 0; i < n; i++) {
                const moet_kv_ref r = session_kv_ref(seqs[i], il);
                moet_kv_ref *h = &b->kvtab_host[(size_t)il * stride + i];
                same = same && !memcmp(h, &r, sizeof r);
                *h = r;
            }
        if (!same) { /* the first step of a new set of rows: a continuing set finds its table on the backend */
            op->upload(s->be, b->kvtab_dev, b->kvtab_host, (size_t)L * (size_t)stride * sizeof(moet_kv_ref));
            b->kvtab_rows = n;
        }
        ca.kvtab = b->kvtab_dev;
    }
    if (b->rows_ok == 1 && s->graphs) {
        /* batch keys: bit 15 set (run_chunk's keys have first_logit < 64 in bits 4..9) */
        uint64_t key = (uint64_t)s->uid << 32 | (uint64_t)n << 16 | 1u << 15 | (uint64_t)(s->use_delta != 0);
        int rc = step_run(s, key, &ca, n, err, errlen);
        if (rc) return rc;
    } else {
        int rc = step_run(s, 0, &ca, n, err, errlen);
        if (rc) return rc;
        if (b->rows_ok < 0) b->rows_ok = op->attn_rows && !declined;
    }
    session_keep(s, n, s->n_cand > 0);
    int rc = op->status(s->be, err, errlen);
    if (rc) { s->n_logit_rows = s->cand_rows = 0; s->logits_stale = 0; return rc; }
    for (int32_t i = 0; i < n; i++) {
        seqs[i]->toks[seqs[i]->pos++] = tokens[i];
        session_seal(seqs[i]);
    }
    return MOET_OK;
}

const float *moet_batch_logits(const moet_batch *b, int32_t i) {
    if (i < 0 || i >= b->s->n_logit_rows) return NULL;
    return session_rows(b->s) + (size_t)i * (size_t)b->s->m->hp.vocab;
}

int32_t moet_batch_candidates(const moet_batch *b, int32_t i, const int32_t **ids, const float **vals) {
    return session_cands(b->s, i, ids, vals);
}

float moet_batch_top1(const moet_batch *b, int32_t i) { return session_top1(b->s, i); }

float moet_session_top1(const moet_session *s) { return session_top1(s, s->n_logit_rows > 0 ? s->n_logit_rows - 1 : 0); }
