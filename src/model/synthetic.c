/*
 * synthetic.c — models of real shapes with random weights, built directly in backend memory (for CUDA: on the GPU,
 * generated there, so a 235B-shaped model is ready in seconds with no file and no host copy).
 *
 * The weights are pseudo-random (backend fill_random: the CPU and CUDA backends generate the same values), the
 * layer plan is the architecture's own (Qwen3-MoE: q/k norm, GQA, every layer MoE; GLM-4.5-Air: a dense first
 * layer, q/k/v biases, half-rotated heads, the sigmoid router and a shared expert), and the routed experts use the
 * requested type with the same per-matrix parameters a pack would carry (W2: rotated, beta, scale base). Speed
 * depends on shapes, bytes and routing spread, not on the values; random routers spread tokens over experts about
 * as evenly as trained ones do at batch 1 (each token reads k distinct experts either way).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/model.h"
#include "model/rope.h"
#include "quant/calib.h"
#include "quant/formats.h"
#include "quant/types.h"

typedef struct {
    const char *name;
    int32_t layers, hidden, heads, kv_heads, head_dim, experts, used, expert_ffn, vocab;
    /* GLM-4.5 (glm: 1): the first dense layers and their FFN, the shared expert's width, a half-rotated head, q/k/v
     * biases, no q/k norm, the sigmoid router (with a choice bias) */
    int32_t glm, first_dense, dense_ffn, shared_ffn;
    /* DeepSeek-V3 (mla: 1, with glm: 1 for its MoE block): MLA's q and kv ranks, nope / rope / v widths (head_dim is
     * nope + rope), YaRN's factor (from a 4096-token pre-training context) */
    int32_t mla, q_lora, kv_lora, nope, rope, v_dim;
    float yarn;
    /* gpt-oss (oss: 1): every other layer (the even ones) slides over `window` keys; sinks, q/k/v/o biases, the
     * router's bias and the top-k softmax, expert biases and the clamped SwiGLU; YaRN x32 from 4096 tokens */
    int32_t oss, window;
} shape_def;

static const shape_def k_shapes[] = {
    {"qwen3-30b-a3b", 48, 2048, 32, 4, 128, 128, 8, 768, 151936, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-235b-a22b", 94, 4096, 64, 4, 128, 128, 8, 1536, 151936, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"glm-4.5-air", 46, 4096, 96, 8, 128, 128, 8, 1408, 151552, 1, 1, 10944, 1408, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* 671B: its W2 experts (183 GB) fit no lent GPU; run a slice of it, deepseek-v3:N (N layers, the first 3 dense) */
    {"deepseek-v3", 61, 7168, 128, 128, 192, 256, 8, 2048, 129280, 1, 3, 18432, 2048, 1, 1536, 512, 128, 64, 128, 40, 0, 0},
    {"mini", 2, 256, 4, 2, 64, 16, 4, 256, 512, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"glm-mini", 3, 256, 4, 2, 64, 16, 4, 256, 512, 1, 1, 512, 256, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"deepseek-mini", 3, 256, 4, 4, 96, 16, 4, 256, 512, 1, 1, 512, 256, 1, 128, 64, 64, 32, 64, 4, 0, 0},
    {"gpt-oss-120b", 36, 2880, 64, 8, 64, 128, 4, 2880, 201088, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 128},
    {"gpt-oss-20b", 24, 2880, 64, 8, 64, 32, 4, 2880, 201088, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 128},
    {"gpt-oss-mini", 2, 256, 4, 2, 64, 8, 2, 256, 512, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 8},
};

static void *buf(moet_model *m, size_t bytes) {
    void *p = m->be->ops->alloc(m->be, bytes);
    if (!p) return NULL;
    void **nb = realloc(m->be_bufs, (m->n_be_bufs + 1) * sizeof(void *));
    if (!nb) { m->be->ops->release(m->be, p); return NULL; }
    m->be_bufs = nb;
    m->be_bufs[m->n_be_bufs++] = p;
    return p;
}

/* Host memory for weights (page-aligned, freed with the model's host vectors). */
static void *host_buf(moet_model *m, size_t bytes) {
    if (m->n_f32_bufs == m->cap_f32_bufs && moet_model_f32_reserve(m, 1)) return NULL;
    void *p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p) m->f32_bufs[m->n_f32_bufs++] = p;
    return p;
}

static int dense(moet_model *m, moet_weight *w, int32_t type, int64_t rows, int64_t cols, uint64_t seed) {
    memset(w, 0, sizeof(*w));
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = moet_type_row_bytes(type, cols);
    w->qscale = 1;
    void *p = buf(m, w->row_bytes * (size_t)rows);
    if (!p) return -1;
    m->be->ops->fill_random(m->be, p, w->type, rows, cols, 0.02f, seed);
    w->data = p;
    m->n_params += rows * cols;
    m->weight_bytes += (int64_t)(w->row_bytes * (size_t)rows);
    return 0;
}

static const float *host_vec(moet_model *m, int64_t n, float v) {
    if (m->n_f32_bufs == m->cap_f32_bufs) {
        size_t nc = m->cap_f32_bufs ? 2 * m->cap_f32_bufs : 16;
        float **nb = realloc(m->f32_bufs, nc * sizeof(*nb));
        if (!nb) return NULL;
        m->f32_bufs = nb;
        m->cap_f32_bufs = nc;
    }
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) return NULL;
    for (int64_t i = 0; i < n; i++) p[i] = v;
    m->f32_bufs[m->n_f32_bufs++] = p;
    return p;
}

int moet_model_synthetic(const char *shape, int32_t expert_type, int delta, int32_t proj_type,
                         const moet_model_options *opt, moet_model **out, char *err, size_t errlen) {
    *out = NULL;
    /* SHAPE or SHAPE:N, the first N layers of it (a slice of a model too big for the device: per-layer costs) */
    shape_def sdl;
    const shape_def *sd = NULL;
    const char *colon = strchr(shape, ':');
    const size_t nl = colon ? (size_t)(colon - shape) : strlen(shape);
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        if (strlen(k_shapes[i].name) == nl && !strncmp(shape, k_shapes[i].name, nl)) sd = &k_shapes[i];
    if (!sd)
        return moet_err(err, errlen, MOET_EINVAL, "unknown synthetic shape '%s' (qwen3-30b-a3b, qwen3-235b-a22b, "
                        "glm-4.5-air, deepseek-v3, gpt-oss-120b, gpt-oss-20b, mini, glm-mini, deepseek-mini, gpt-oss-mini; SHAPE:N "
                        "for its first N layers)", shape);
    if (colon) {
        char *end;
        const long n = strtol(colon + 1, &end, 10);
        if (*end || n < 1 || n > sd->layers)
            return moet_err(err, errlen, MOET_EINVAL, "'%s': the layer count after ':' must be 1 to %d", shape, sd->layers);
        sdl = *sd;
        sdl.layers = (int32_t)n;
        if (sdl.first_dense > sdl.layers) sdl.first_dense = sdl.layers;
        sd = &sdl;
    }
    if (delta && expert_type != MOET_TYPE_W2) return moet_err(err, errlen, MOET_EINVAL, "a delta goes with W2 experts");
    if (proj_type != MOET_TYPE_BF16 && proj_type != MOET_TYPE_Q8_0)
        return moet_err(err, errlen, MOET_EINVAL, "dense projections: bf16 or q8_0");
    const moet_type_traits *tt = moet_type_get(expert_type);
    if (!tt || !moet_type_row_bytes(expert_type, sd->expert_ffn) || !moet_type_row_bytes(expert_type, sd->hidden))
        return moet_err(err, errlen, MOET_EINVAL, "expert type %d cannot hold this shape", expert_type);
    moet_model_options o = opt ? *opt : moet_model_default_options();
    moet_model *m = calloc(1, sizeof(*m));
    if (!m) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    moet_st_init(&m->st);
    int rc = moet_backend_open(o.device, o.n_threads, &m->be, err, errlen);
    if (rc) { free(m); return rc; }
    /* experts beyond the device: built in host memory (filled by a CPU backend), the device caching some (the cache
     * is set up once they exist: a budget in GiB needs their size) */
    moet_backend *hb = NULL;
    if (o.expert_slots == MOET_EXPERT_SLOTS_AUTO) { /* sized from the shape, before anything is built */
        const int64_t H = sd->hidden, F = sd->expert_ffn, Dq = (int64_t)sd->heads * sd->head_dim,
                      Dkv = (int64_t)sd->kv_heads * sd->head_dim;
        const uint64_t pr = moet_type_row_bytes(proj_type, H);
        /* attention's matrices a layer: q, k, v, o, or MLA's q_a, q_b, kv_a, kv_b, o */
        const uint64_t attn_b = !sd->mla ? (uint64_t)(Dq + 2 * Dkv) * pr + (uint64_t)H * moet_type_row_bytes(proj_type, Dq)
            : (uint64_t)(sd->q_lora + sd->kv_lora + sd->rope) * pr + (uint64_t)Dq * moet_type_row_bytes(proj_type, sd->q_lora) +
              (uint64_t)sd->heads * (uint64_t)(sd->nope + sd->v_dim) * moet_type_row_bytes(proj_type, sd->kv_lora) +
              (uint64_t)H * moet_type_row_bytes(proj_type, (int64_t)sd->heads * sd->v_dim);
        const uint64_t dense_b = (uint64_t)sd->vocab * (uint64_t)H * 2 + (uint64_t)sd->vocab * pr +
                                 (uint64_t)sd->layers * (attn_b +
                                                         (uint64_t)sd->experts * (uint64_t)H * 2 +
                                                         3 * (uint64_t)sd->shared_ffn * pr) +
                                 (uint64_t)sd->first_dense * 3 * (uint64_t)sd->dense_ffn * pr;
#define PAD256(b) (((uint64_t)(b) + 255) / 256 * 256)
        uint64_t slot = 2 * PAD256(moet_type_row_bytes(expert_type, H) * (uint64_t)F) + PAD256(moet_type_row_bytes(expert_type, F) * (uint64_t)H);
        if (delta)
            slot += 2 * PAD256(moet_type_row_bytes(MOET_TYPE_NVFP4, H) * (uint64_t)F) + PAD256(moet_type_row_bytes(MOET_TYPE_NVFP4, F) * (uint64_t)H);
#undef PAD256
        if ((rc = moet_expert_slots_auto(m->be, dense_b, slot, (int64_t)sd->layers * sd->experts, sd->used,
                                         o.expert_reserve_gib, &o.expert_slots, err, errlen))) {
            m->be->ops->destroy(m->be);
            free(m);
            return rc;
        }
        o.expert_slots_gib = 0;
    }
    const int cached = o.expert_slots > 0 || o.expert_slots_gib > 0;
    if (cached && strcmp(m->be->ops->name, "cpu") && !(hb = moet_backend_cpu_create(o.n_threads))) {
        m->be->ops->destroy(m->be);
        free(m);
        return moet_err(err, errlen, MOET_ENOMEM, "cannot create the CPU backend");
    }
    moet_hparams *hp = &m->hp;
    snprintf(hp->architecture, sizeof hp->architecture, "%s",
             sd->mla ? "DeepseekV3ForCausalLM" : sd->glm ? "Glm4MoeForCausalLM" : sd->oss ? "GptOssForCausalLM"
                                                                                      : "Qwen3MoeForCausalLM");
    hp->vocab = sd->vocab;
    hp->hidden = sd->hidden;
    hp->n_layers = sd->layers;
    hp->n_heads = sd->heads;
    hp->n_kv_heads = sd->kv_heads;
    hp->head_dim = sd->head_dim;
    hp->dense_ffn = sd->glm ? sd->dense_ffn : sd->expert_ffn;
    hp->expert_ffn = sd->expert_ffn;
    hp->n_experts = sd->experts;
    hp->n_experts_used = sd->used;
    hp->norm_topk = 1;
    hp->router_scoring = sd->glm ? MOET_ROUTER_SIGMOID : MOET_ROUTER_SOFTMAX;
    hp->n_group = hp->topk_group = 1;
    hp->route_scale = 1.0f;
    hp->shared_ffn = sd->shared_ffn;
    hp->rms_eps = 1e-6f;
    hp->rope_theta = 1e6;
    hp->rope_dim = sd->mla ? sd->rope : sd->glm ? sd->head_dim / 2 : sd->head_dim;
    if (sd->mla) { /* DeepSeek-V3's MLA and YaRN (its config: factor 40 from 4096 tokens, mscale 1 = mscale_all_dim) */
        hp->q_lora_rank = sd->q_lora;
        hp->kv_lora_rank = sd->kv_lora;
        hp->qk_nope_dim = sd->nope;
        hp->v_head_dim = sd->v_dim;
        hp->rope_interleave = 1;
        hp->mla_eps = 1e-6f;
        hp->rope_theta = 1e4;
        hp->rope_type = MOET_ROPE_YARN;
        hp->rope_factor = sd->yarn;
        hp->rope_orig_max_pos = 4096;
        hp->rope_beta_fast = 32;
        hp->rope_beta_slow = 1;
        hp->rope_truncate = 1;
        hp->rope_attn_factor = 1.0f;
        const double ms = moet_yarn_mscale(sd->yarn, 1.0);
        hp->attn_scale = (float)(ms * ms / sqrt((double)sd->head_dim));
        hp->route_scale = 2.5f;
    }
    if (sd->oss) { /* gpt-oss's config: theta 150000, YaRN x32 from 4096 tokens, untruncated, attention factor
                    * 0.1 ln 32 + 1 */
        hp->router_scoring = MOET_ROUTER_TOPK_SOFTMAX;
        hp->rms_eps = 1e-5f;
        hp->rope_theta = 150000;
        hp->rope_type = MOET_ROPE_YARN;
        hp->rope_factor = 32;
        hp->rope_orig_max_pos = 4096;
        hp->rope_beta_fast = 32;
        hp->rope_beta_slow = 1;
        hp->rope_truncate = 0;
        hp->rope_attn_factor = (float)(0.1 * log(32.0) + 1.0);
        hp->swiglu_limit = 7.0f;
        hp->sliding_window = sd->window;
        if (!(hp->layer_sliding = calloc((size_t)sd->layers, 1))) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto fail; }
        for (int l = 0; l < sd->layers; l += 2) hp->layer_sliding[l] = 1;
    }
    if ((rc = moet_rope_init(hp, err, errlen))) goto fail;
    hp->max_pos = sd->oss ? 131072 : 40960;
    hp->qk_norm = !sd->glm && !sd->oss;
    hp->attn_bias = (sd->glm && !sd->mla) || sd->oss;
    hp->bos_id = -1;
    hp->layer_moe = calloc((size_t)sd->layers, 1);
    m->layers = calloc((size_t)sd->layers, sizeof(moet_layer));
    if (!hp->layer_moe || !m->layers) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto fail; }
    const int64_t H = sd->hidden, Dq = (int64_t)sd->heads * sd->head_dim, Dkv = (int64_t)sd->kv_heads * sd->head_dim,
                  F = sd->expert_ffn, E = sd->experts;
    const float *ones_h = host_vec(m, H, 1.0f), *ones_d = host_vec(m, sd->head_dim, 1.0f);
    /* GLM: small q/k/v biases and a choice bias (any values: speed does not depend on them) */
    const int biased = sd->glm || sd->oss;
    const float *bias_q = biased ? host_vec(m, Dq, 0.01f) : ones_h, *bias_kv = biased ? host_vec(m, Dkv, 0.01f) : ones_h,
                *bias_e = biased ? host_vec(m, E, 0.001f) : ones_h;
    /* gpt-oss: o_proj's bias, the sinks, the experts' biases (gate / up: E x F, down: E x H) */
    const float *bias_o = sd->oss ? host_vec(m, H, 0.01f) : ones_h, *sinks = sd->oss ? host_vec(m, sd->heads, 0.5f) : ones_h,
                *bias_f = sd->oss ? host_vec(m, E * F, 0.01f) : ones_h, *bias_h = sd->oss ? host_vec(m, E * H, 0.01f) : ones_h;
    if (!ones_h || !ones_d || !bias_q || !bias_kv || !bias_e || !bias_o || !sinks || !bias_f || !bias_h) {
        rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        goto fail;
    }
    uint64_t seed = 1000;
    if (dense(m, &m->tok_embd, MOET_TYPE_BF16, sd->vocab, H, seed++) || dense(m, &m->output, proj_type, sd->vocab, H, seed++))
        goto oom;
    m->out_norm = ones_h;
    const size_t rb_gu = moet_type_row_bytes(expert_type, H), rb_dn = moet_type_row_bytes(expert_type, F);
    const size_t per_expert = rb_gu * (size_t)F * 2 + rb_dn * (size_t)H;
    for (int l = 0; l < sd->layers; l++) {
        moet_layer *L = &m->layers[l];
        hp->layer_moe[l] = l >= sd->first_dense;
        L->is_moe = hp->layer_moe[l];
        L->attn_norm = L->ffn_norm = ones_h;
        if (sd->mla) { /* q_a, q_b, kv_a (latent and rotary key), kv_b, o */
            const int64_t nh = sd->heads;
            if (dense(m, &L->q_a, proj_type, sd->q_lora, H, seed++) || dense(m, &L->wq, proj_type, Dq, sd->q_lora, seed++) ||
                dense(m, &L->kv_a, proj_type, sd->kv_lora, H, seed++) || dense(m, &L->kv_pe, proj_type, sd->rope, H, seed++) ||
                dense(m, &L->kv_b, proj_type, nh * (sd->nope + sd->v_dim), sd->kv_lora, seed++) ||
                dense(m, &L->wo, proj_type, H, nh * sd->v_dim, seed++))
                goto oom;
            L->q_a_norm = L->kv_a_norm = ones_h; /* q_lora, kv_lora <= hidden */
        } else if (dense(m, &L->wq, proj_type, Dq, H, seed++) || dense(m, &L->wk, proj_type, Dkv, H, seed++) ||
                   dense(m, &L->wv, proj_type, Dkv, H, seed++) || dense(m, &L->wo, proj_type, H, Dq, seed++)) {
            goto oom;
        }
        if (sd->mla) {
            /* no q/k norms, no biases */
        } else if (sd->glm || sd->oss) {
            L->bq = bias_q;
            L->bk = L->bv = bias_kv;
            if (sd->oss) {
                L->bo = bias_o;
                L->sinks = sinks;
                L->window = hp->layer_sliding[l] ? sd->window : 0;
            }
        } else {
            L->q_norm = L->k_norm = ones_d;
        }
        if (!L->is_moe) { /* GLM's first layers: a dense SwiGLU MLP */
            if (dense(m, &L->gate, proj_type, sd->dense_ffn, H, seed++) ||
                dense(m, &L->up, proj_type, sd->dense_ffn, H, seed++) ||
                dense(m, &L->down, proj_type, H, sd->dense_ffn, seed++))
                goto oom;
            continue;
        }
        if (dense(m, &L->router, MOET_TYPE_BF16, E, H, seed++)) goto oom;
        if (sd->oss) {
            L->router_lbias = bias_e;
            L->exp_gate_b = L->exp_up_b = bias_f;
            L->exp_down_b = bias_h;
        }
        if (sd->glm) {
            L->router_bias = bias_e;
            if (dense(m, &L->sh_gate, proj_type, sd->shared_ffn, H, seed++) ||
                dense(m, &L->sh_up, proj_type, sd->shared_ffn, H, seed++) ||
                dense(m, &L->sh_down, proj_type, H, sd->shared_ffn, seed++))
                goto oom;
        }
        L->exp_gate = calloc((size_t)E * 3, sizeof(moet_weight));
        if (!L->exp_gate) goto oom;
        L->exp_up = L->exp_gate + E;
        L->exp_down = L->exp_up + E;
        uint8_t *mem = hb ? host_buf(m, per_expert * (size_t)E) : buf(m, per_expert * (size_t)E);
        moet_backend *fb = hb ? hb : m->be; /* what fills the experts */
        if (!mem) goto oom;
        for (int64_t e = 0; e < E; e++) {
            moet_weight *ws[3] = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]};
            uint8_t *base = mem + (size_t)e * per_expert; /* one contiguous record per expert, as in a pack */
            for (int k = 0; k < 3; k++) {
                moet_weight *w = ws[k];
                w->type = expert_type;
                w->rows = k == 2 ? H : F;
                w->cols = k == 2 ? F : H;
                w->row_bytes = k == 2 ? rb_dn : rb_gu;
                w->data = base + (k == 2 ? 2 * rb_gu * (size_t)F : (size_t)k * rb_gu * (size_t)F);
                fb->ops->fill_random(fb, (void *)w->data, expert_type, w->rows, w->cols, 0.02f,
                                     seed * 1000003u + (uint64_t)(e * 3 + k));
                w->qscale = expert_type == MOET_TYPE_NVFP4 ? 0.005f : 0.02f;
                w->qbeta = moet_f16_round(0.3f); /* an f16 value, as the quantizer's betas are */
                if (expert_type == MOET_TYPE_W2) {
                    w->rotated = 1;
                    w->rot_seed = moet_expert_rot_seed(l, k);
                }
            }
        }
        if (delta) { /* the residuals: NVFP4, unrotated (as the quantizer writes them), small */
            const size_t nb_gu = moet_type_row_bytes(MOET_TYPE_NVFP4, H) * (size_t)F, nb_dn = moet_type_row_bytes(MOET_TYPE_NVFP4, F) * (size_t)H;
            uint8_t *dmem = hb ? host_buf(m, (2 * nb_gu + nb_dn) * (size_t)E) : buf(m, (2 * nb_gu + nb_dn) * (size_t)E);
            if (!dmem || !(L->dres_gate = calloc((size_t)E * 3, sizeof(moet_weight)))) goto oom;
            L->dres_up = L->dres_gate + E;
            L->dres_down = L->dres_up + E;
            for (int64_t e = 0; e < E; e++)
                for (int k = 0; k < 3; k++) {
                    moet_weight *w = k == 0 ? &L->dres_gate[e] : k == 1 ? &L->dres_up[e] : &L->dres_down[e];
                    *w = (moet_weight){.type = MOET_TYPE_NVFP4, .rows = k == 2 ? H : F, .cols = k == 2 ? F : H,
                                       .qscale = 0.0005f};
                    w->row_bytes = moet_type_row_bytes(MOET_TYPE_NVFP4, w->cols);
                    w->data = dmem + (size_t)e * (2 * nb_gu + nb_dn) + (size_t)k * nb_gu;
                    fb->ops->fill_random(fb, (void *)w->data, MOET_TYPE_NVFP4, w->rows, w->cols, 0.02f,
                                         seed * 2000003u + (uint64_t)(e * 3 + k));
                }
            m->weight_bytes += (int64_t)((2 * nb_gu + nb_dn) * (size_t)E);
        }
        seed++;
        m->n_params += E * 3 * H * F;
        m->weight_bytes += (int64_t)(per_expert * (size_t)E);
    }
    char sub[256];
    if (m->be->ops->status(m->be, sub, sizeof sub)) { rc = moet_err(err, errlen, MOET_EDEVICE, "%s", sub); goto fail; }
    if ((rc = moet_model_cache_setup(m, &o, err, errlen))) goto fail;
    if (hb) hb->ops->destroy(hb);
    *out = m;
    return MOET_OK;
oom:
    rc = moet_err(err, errlen, MOET_ENOMEM, "out of %s memory building the synthetic %s model", m->be->ops->name, shape);
fail:
    if (hb) hb->ops->destroy(hb);
    moet_model_free(m);
    return rc;
}
