/*
 * test_arch.c — MixtralForCausalLM without transformers: a small random Mixtral written in the three tensor layouts
 * the architecture binds (the hub's block_sparse_moe.experts.E.w1/w3/w2, transformers 5's fused
 * mlp.experts.gate_up_proj / down_proj, and the per-expert gate/up/down_proj names moet packs store) must load and
 * give the same logits bit for bit, finite and not all alike; and its config's refusals name what they refuse.
 * The numbers against transformers come from tools/make_fixtures.py --only-mixtral (logits_mixtral_mini).
 * Then the same for Glm4MoeForCausalLM (glm_section: two layouts, a W2 pack, refusals), and DeepseekV3ForCausalLM
 * (ds_section: MLA with and without the q bottleneck, YaRN, a W2 pack, refusals; logits_deepseek_mini has the
 * numbers against transformers), and GptOssForCausalLM (oss_section: transformers' expert layout and the hub's
 * MXFP4 one give the same logits, the sliding window matters, a W2 pack keeps the biases, the device equals the CPU).
 *
 * usage: test_arch TOKENIZER_DIR (a model directory whose tokenizer.json has a vocabulary of 4096); MOET_DEVICE picks
 * the device (default cpu)
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf.h"
#include "model/model.h"
#include "model/pack.h"
#include "quant/formats.h"
#include "quant/types.h"
#include "quant/requant.h"
#include "test_util.h"

enum { V = 4096, H = 64, L = 2, NH = 4, NKV = 2, HD = 16, E = 4, K = 2, F = 32 };

static char g_dir[256];
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float rnd(float scale) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return scale * ((float)(g_rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
}

/* one checkpoint's tensors: name, shape, data (f32), appended in order */
/* u8: data holds bytes (1: U8, 2: F8_E4M3) */
typedef struct { char name[128]; int nd; int64_t shape[4]; float *data; int u8; } tensor;
typedef struct { tensor t[256]; int n; } ckpt;

static void add(ckpt *c, const char *name, int nd, int64_t a, int64_t b, int64_t d, const float *src) {
    REQUIRE(c->n < 256, "too many tensors");
    tensor *t = &c->t[c->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd;
    t->shape[0] = a; t->shape[1] = b; t->shape[2] = d;
    const size_t n = (size_t)a * (nd > 1 ? b : 1) * (nd > 2 ? d : 1);
    t->data = malloc(n * sizeof(float));
    memcpy(t->data, src, n * sizeof(float));
}

/* A U8 tensor (gpt-oss's MXFP4 blocks and scales) of nd <= 4 dims. */
static void add_u8(ckpt *c, const char *name, int nd, const int64_t *shape, const uint8_t *src) {
    REQUIRE(c->n < 256 && nd <= 4, "too many tensors");
    tensor *t = &c->t[c->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd;
    size_t n = 1;
    for (int d = 0; d < nd; d++) { t->shape[d] = shape[d]; n *= (size_t)shape[d]; }
    t->u8 = 1;
    t->data = malloc(n);
    memcpy(t->data, src, n);
}

/* pad: the header padded with spaces to 8 bytes, as Hugging Face's writers do; else to 2 bytes past, so every tensor
 * is misaligned (what a writer that does not pad may produce) */
static void write_ckpt_p(const char *dir, const ckpt *c, const char *config, int pad) {
    mkdir(dir, 0755);
    char p[1024], hdr[65536];
    size_t off = 0, hl = 0;
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "{");
    for (int i = 0; i < c->n; i++) {
        const tensor *t = &c->t[i];
        size_t n = 1;
        for (int d = 0; d < t->nd; d++) n *= (size_t)t->shape[d];
        const size_t es = t->u8 ? 1 : 4;
        hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t->name,
                               t->u8 == 2 ? "F8_E4M3" : t->u8 ? "U8" : "F32");
        for (int d = 0; d < t->nd; d++) hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "],\"data_offsets\":[%zu,%zu]}", off, off + es * n);
        off += es * n;
        REQUIRE(hl < sizeof hdr - 256, "header too long");
    }
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "}");
    while ((8 + hl) % 8 != (pad ? 0u : 2u)) hdr[hl++] = ' '; /* unpadded: every tensor 2 bytes off */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "wb");
    REQUIRE(f, "cannot write %s", p);
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    fwrite(b, 1, 8, f);
    fwrite(hdr, 1, hl, f);
    for (int i = 0; i < c->n; i++) {
        const tensor *t = &c->t[i];
        size_t n = 1;
        for (int d = 0; d < t->nd; d++) n *= (size_t)t->shape[d];
        fwrite(t->data, t->u8 ? 1 : sizeof(float), n, f);
    }
    REQUIRE(fclose(f) == 0, "writing %s", p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    f = fopen(p, "w");
    REQUIRE(f, "cannot write %s", p);
    fputs(config, f);
    fclose(f);
}

static void write_ckpt(const char *dir, const ckpt *c, const char *config) { write_ckpt_p(dir, c, config, 1); }

static void copy_tokenizer(const char *src, const char *dir) {
    char p[512], q[512], buf[65536];
    snprintf(p, sizeof p, "%s/tokenizer.json", src);
    snprintf(q, sizeof q, "%s/tokenizer.json", dir);
    FILE *a = fopen(p, "rb"), *b = fopen(q, "wb");
    REQUIRE(a && b, "copying %s", p);
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    fclose(a);
    fclose(b);
}

/* The tensors every architecture here shares: the embedding, lm_head and final norm (layer -1), or layer l's two
 * norms and attention (with per-head q/k norms, with q/k/v biases), random, appended to c. */
static void add_common(ckpt *c, int l, int qk_norm, int qkv_bias) {
    static float buf[V * H];
    char n[128];
    if (l < 0) {
        for (int i = 0; i < V * H; i++) buf[i] = rnd(0.5f);
        add(c, "model.embed_tokens.weight", 2, V, H, 0, buf);
        for (int i = 0; i < V * H; i++) buf[i] = rnd(0.2f);
        add(c, "lm_head.weight", 2, V, H, 0, buf);
        for (int i = 0; i < H; i++) buf[i] = 1.0f + rnd(0.3f);
        add(c, "model.norm.weight", 1, H, 0, 0, buf);
        return;
    }
    static const char *const vec[2] = {"input_layernorm", "post_attention_layernorm"};
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < H; i++) buf[i] = 1.0f + rnd(0.3f);
        snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, vec[v]);
        add(c, n, 1, H, 0, 0, buf);
    }
    static const char *const qk[2] = {"q_norm", "k_norm"};
    for (int v = 0; qk_norm && v < 2; v++) {
        for (int i = 0; i < HD; i++) buf[i] = 1.0f + rnd(0.3f);
        snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.weight", l, qk[v]);
        add(c, n, 1, HD, 0, 0, buf);
    }
    static const char *const pr[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    const int64_t rows[4] = {NH * HD, NKV * HD, NKV * HD, H}, cols[4] = {H, H, H, NH * HD};
    for (int p = 0; p < 4; p++) {
        for (int64_t i = 0; i < rows[p] * cols[p]; i++) buf[i] = rnd(0.3f);
        snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.weight", l, pr[p]);
        add(c, n, 2, rows[p], cols[p], 0, buf);
        if (qkv_bias && p < 3) { /* q/k/v biases (o_proj has none in GLM) */
            for (int64_t i = 0; i < rows[p]; i++) buf[i] = rnd(0.3f);
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.bias", l, pr[p]);
            add(c, n, 1, rows[p], 0, 0, buf);
        }
    }
}

/* Layer l's ne experts (gate, up, down: ne matrices each, back to back) as transformers 5's fused pair. */
static void add_fused(ckpt *c, int l, int ne, const float *gw, const float *uw, const float *dw) {
    static float gu[16 * 2 * F * H], dn[16 * H * F];
    REQUIRE(ne <= 16, "test setup");
    char n[128];
    for (int e = 0; e < ne; e++) {
        memcpy(gu + (size_t)e * 2 * F * H, gw + (size_t)e * F * H, sizeof(float) * F * H);
        memcpy(gu + (size_t)e * 2 * F * H + F * H, uw + (size_t)e * F * H, sizeof(float) * F * H);
        memcpy(dn + (size_t)e * H * F, dw + (size_t)e * H * F, sizeof(float) * H * F);
    }
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l);
    add(c, n, 3, ne, 2 * F, H, gu);
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l);
    add(c, n, 3, ne, H, F, dn);
}

static const char *config(int sliding_window) {
    static char c[2048];
    snprintf(c, sizeof c,
             "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": %d, "
             "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
             "\"num_key_value_heads\": %d, \"head_dim\": null, \"hidden_act\": \"silu\", \"max_position_embeddings\": 512, "
             "\"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0, \"num_local_experts\": %d, \"num_experts_per_tok\": %d, "
             "\"sliding_window\": %s, \"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2}",
             V, H, F, L, NH, NKV, E, K, sliding_window ? "128" : "null");
    return c;
}

/* where the models run: MOET_DEVICE (gpu_check runs this on CUDA), else the CPU */
static const char *device(void) {
    const char *d = getenv("MOET_DEVICE");
    return d && *d ? d : "cpu";
}

static float *run_on(const char *dev, const char *dir, int32_t n_tok, char *err, size_t errlen, int *rc);
static float *run(const char *dir, int32_t n_tok, char *err, size_t errlen, int *rc) {
    return run_on(device(), dir, n_tok, err, errlen, rc);
}

/* logits of every position of a fixed prompt */
static float *run_on(const char *dev, const char *dir, int32_t n_tok, char *err, size_t errlen, int *rc) {
    moet_model_options mo = moet_model_default_options();
    mo.device = dev;
    moet_model *m = NULL;
    if ((*rc = moet_model_load(dir, &mo, &m, err, errlen))) return NULL;
    moet_session_options so = moet_session_default_options();
    so.kv_type = MOET_KV_F32; /* the architectures' numerics against fp32 references (CUDA's auto is f16) */
    so.n_ctx = 64;
    so.n_logits = n_tok;
    moet_session *s = NULL;
    REQUIRE(moet_session_create(m, &so, &s, err, errlen) == 0, "session: %s", err);
    int32_t toks[16];
    for (int i = 0; i < n_tok; i++) toks[i] = (int32_t)((37 * i + 11) % V);
    REQUIRE(moet_session_eval(s, toks, n_tok, MOET_LOGITS_ALL, err, errlen) == 0, "eval: %s", err);
    int32_t rows = 0;
    const float *lg = moet_session_logits(s, &rows);
    REQUIRE(lg && rows == n_tok, "logits rows %d", rows);
    float *out = malloc(sizeof(float) * (size_t)n_tok * V);
    memcpy(out, lg, sizeof(float) * (size_t)n_tok * V);
    moet_session_free(s);
    moet_model_free(m);
    return out;
}

/* The same T tokens through a pack pm and through the checkpoint's model m with its experts requantized in memory as
 * the pack was written (po): max |diff| / max |logit|; with ref (m's logits before requantizing), *w2_vs = the W2
 * logits' distance from ref on the same scale. */
static double pack_vs_memory(moet_model *m, moet_model *pm, const moet_pack_options *po, int T, const float *ref,
                             double *w2_vs) {
    char err[1024];
    REQUIRE(moet_model_requant_experts(m, &po->q, NULL, 2, NULL, err, sizeof err) == 0, "%s", err);
    moet_session_options so = moet_session_default_options();
    so.kv_type = MOET_KV_F32; /* the architectures' numerics against fp32 references (CUDA's auto is f16) */
    so.n_ctx = 64;
    so.n_logits = T;
    moet_session *a, *b;
    REQUIRE(moet_session_create(pm, &so, &a, err, sizeof err) == 0 && moet_session_create(m, &so, &b, err, sizeof err) == 0,
            "%s", err);
    int32_t toks[16];
    REQUIRE(T <= 16, "test setup");
    for (int i = 0; i < T; i++) toks[i] = (int32_t)((37 * i + 11) % V);
    REQUIRE(moet_session_eval(a, toks, T, MOET_LOGITS_ALL, err, sizeof err) == 0 &&
            moet_session_eval(b, toks, T, MOET_LOGITS_ALL, err, sizeof err) == 0, "%s", err);
    const float *la = moet_session_logits(a, NULL), *lb = moet_session_logits(b, NULL);
    double md = 0, mr = 0, mw = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        md = fmax(md, fabs((double)la[i] - lb[i]));
        mr = fmax(mr, fabs((double)lb[i]));
        if (ref) mw = fmax(mw, fabs((double)lb[i] - ref[i]));
    }
    if (w2_vs) *w2_vs = mw / mr;
    moet_session_free(a);
    moet_session_free(b);
    return md / mr;
}

/* ---- Glm4MoeForCausalLM ---------------------------------------------------------------------------------------
 * A random GLM-4.5-shaped model: layer 0 dense, layers 1-2 MoE with the sigmoid router (a choice bias, 4 groups of 2
 * experts, 2 kept, x 2.5), a shared expert, q/k/v biases, q/k norm, half of each head rotated. Written per expert
 * and fused (the same logits bit for bit); a W2 pack of it must keep the router's hyperparameters, the bias and the
 * shared expert (its logits = the in-memory W2 model's); bad router groups are refused by name. */
enum { GE = 8, GK = 2, GL = 3, GFD = 96 }; /* widths multiples of 32, as the CUDA kernels take them */

static const char *glm_config(int n_group, int topk_group) {
    static char c[2048];
    snprintf(c, sizeof c,
             "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"vocab_size\": %d, "
             "\"hidden_size\": %d, \"intermediate_size\": %d, \"moe_intermediate_size\": %d, \"num_hidden_layers\": %d, "
             "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"hidden_act\": \"silu\", "
             "\"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-05, \"partial_rotary_factor\": 0.5, "
             "\"rope_theta\": 1000000.0, \"attention_bias\": true, \"use_qk_norm\": true, \"n_routed_experts\": %d, "
             "\"num_experts_per_tok\": %d, \"n_shared_experts\": 1, \"routed_scaling_factor\": 2.5, \"n_group\": %d, "
             "\"topk_group\": %d, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"tie_word_embeddings\": false, "
             "\"bos_token_id\": 1, \"eos_token_id\": 2}",
             V, H, GFD, F, GL, NH, NKV, HD, GE, GK, n_group, topk_group);
    return c;
}

static void glm_section(const char *tokdir) {
    static float buf[V * H];
    ckpt per = {0}, fused = {0};
    char n[128], err[1024];
    add_common(&per, -1, 0, 0);
    static float gw[GE][F * H], uw[GE][F * H], dw[GE][H * F];
    for (int l = 0; l < GL; l++) {
        add_common(&per, l, 1, 1);
        static const char *const ck[3] = {"gate_proj", "up_proj", "down_proj"};
        if (l == 0) { /* first_k_dense_replace = 1 */
            for (int k = 0; k < 3; k++) {
                for (int i = 0; i < GFD * H; i++) buf[i] = rnd(0.3f);
                snprintf(n, sizeof n, "model.layers.0.mlp.%s.weight", ck[k]);
                add(&per, n, 2, k == 2 ? H : GFD, k == 2 ? GFD : H, 0, buf);
            }
            continue;
        }
        for (int i = 0; i < GE * H; i++) buf[i] = rnd(1.0f);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
        add(&per, n, 2, GE, H, 0, buf);
        for (int i = 0; i < GE; i++) buf[i] = rnd(0.3f);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        add(&per, n, 1, GE, 0, 0, buf);
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < F * H; i++) buf[i] = rnd(0.3f);
            snprintf(n, sizeof n, "model.layers.%d.mlp.shared_experts.%s.weight", l, ck[k]);
            add(&per, n, 2, k == 2 ? H : F, k == 2 ? F : H, 0, buf);
        }
        for (int e = 0; e < GE; e++) {
            for (int i = 0; i < F * H; i++) { gw[e][i] = rnd(0.3f); uw[e][i] = rnd(0.3f); dw[e][i] = rnd(0.3f); }
            const float *m3[3] = {gw[e], uw[e], dw[e]};
            for (int k = 0; k < 3; k++) {
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, ck[k]);
                add(&per, n, 2, k == 2 ? H : F, k == 2 ? F : H, 0, m3[k]);
            }
        }
        add_fused(&fused, l, GE, gw[0], uw[0], dw[0]);
    }
    /* a multi-token-prediction layer past num_hidden_layers, as GLM-4.5's checkpoints carry: not used, not packed */
    for (int i = 0; i < 2 * H * H; i++) buf[i] = rnd(0.1f);
    snprintf(n, sizeof n, "model.layers.%d.eh_proj.weight", GL);
    add(&per, n, 2, H, 2 * H, 0, buf);
    for (int i = 0; i < per.n; i++)
        if (!strstr(per.t[i].name, ".mlp.experts.")) {
            const tensor *t = &per.t[i];
            add(&fused, t->name, t->nd, t->shape[0], t->shape[1], t->shape[2], t->data);
        }
    const int T = 7;
    char dp[512], df[512];
    snprintf(dp, sizeof dp, "%s/glm", g_dir);
    snprintf(df, sizeof df, "%s/glm_fused", g_dir);
    write_ckpt(dp, &per, glm_config(4, 2));
    copy_tokenizer(tokdir, dp);
    write_ckpt(df, &fused, glm_config(4, 2));
    copy_tokenizer(tokdir, df);
    int rc;
    float *lp = run(dp, T, err, sizeof err, &rc);
    REQUIRE(lp, "glm: load: %s", err);
    float *lf = run(df, T, err, sizeof err, &rc);
    REQUIRE(lf, "glm fused: load: %s", err);
    int finite = 1;
    double spread = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        finite &= isfinite(lp[i]);
        spread = fmax(spread, fabs((double)lp[i] - lp[i % V]));
    }
    CHECK(finite && spread > 1e-3, "glm: logits not finite or all alike (spread %g)", spread);
    CHECK(!memcmp(lp, lf, sizeof(float) * (size_t)T * V), "glm: the fused layout's logits differ from per-expert");
    fprintf(stderr, "glm4moe: per-expert and fused layouts, %d positions: identical logits, spread %.3g\n", T, spread);
    if (strcmp(device(), "cpu") != 0) { /* the device against the CPU reference (the partial RoPE, biases, sigmoid
                                          * router, shared expert through its kernels) */
        float *lc = run_on("cpu", dp, T, err, sizeof err, &rc);
        REQUIRE(lc, "glm on the cpu: %s", err);
        double md = 0, mr = 0;
        for (size_t i = 0; i < (size_t)T * V; i++) {
            md = fmax(md, fabs((double)lp[i] - lc[i]));
            mr = fmax(mr, fabs((double)lc[i]));
        }
        fprintf(stderr, "glm4moe: %s vs cpu: max |diff| / max |logit| = %.3g\n", device(), md / mr);
        CHECK(md / mr < 1e-5, "glm: %s differs from the cpu by %.3g", device(), md / mr);
        free(lc);
    }
    { /* a W2 pack: the router's groups, scale and bias and the shared expert survive it */
        char path[600];
        snprintf(path, sizeof path, "%s/glm.pack", g_dir);
        moet_model_options mo = moet_model_default_options();
        mo.device = device();
        moet_model *m, *pm;
        REQUIRE(moet_model_load(dp, &mo, &m, err, sizeof err) == 0, "%s", err);
        moet_pack_options po = {.q = moet_matq_default_options(MOET_QF_W2), .calib = NULL, .n_threads = 2};
        REQUIRE(moet_pack_write(m, dp, path, &po, err, sizeof err) == 0, "pack: %s", err);
        moet_gguf g;
        REQUIRE(moet_gguf_open(path, &g, err, sizeof err) == 0, "read: %s", err);
        CHECK(!moet_gguf_find_tensor(&g, "model.layers.3.eh_proj.weight") &&
              moet_gguf_find_tensor(&g, "model.layers.1.mlp.gate.e_score_correction_bias") &&
              moet_gguf_find_tensor(&g, "model.layers.2.mlp.shared_experts.down_proj.weight"),
              "glm pack: the unused MTP tensor was packed, or the router bias / shared expert was not");
        moet_gguf_close(&g);
        REQUIRE(moet_model_load(path, &mo, &pm, err, sizeof err) == 0, "load pack: %s", err);
        CHECK(pm->hp.router_scoring == MOET_ROUTER_SIGMOID && pm->hp.n_group == 4 && pm->hp.topk_group == 2 &&
              pm->hp.route_scale == 2.5f && pm->hp.shared_ffn == F && pm->hp.rope_dim == HD / 2 &&
              pm->layers[1].router_bias && pm->layers[2].sh_down.data && !pm->layers[0].is_moe,
              "glm pack: hyperparameters or tensors lost (scoring %d, groups %d/%d, scale %g, shared %d, rope %d)",
              pm->hp.router_scoring, pm->hp.n_group, pm->hp.topk_group, pm->hp.route_scale, pm->hp.shared_ffn,
              pm->hp.rope_dim);
        double mw;
        const double d = pack_vs_memory(m, pm, &po, T, lp, &mw);
        fprintf(stderr, "glm4moe: W2 pack vs in-memory W2: max |diff| / max |logit| = %.3g (W2 vs bf16: %.3g)\n", d, mw);
        CHECK(d < 1e-5, "glm: the pack's logits differ from the in-memory W2 model's by %.3g", d);
        CHECK(mw > 1e-4, "glm: W2 experts gave the logits of the unquantized ones (%.3g)", mw);
        moet_model_free(pm); moet_model_free(m);
    }
    { /* refusals: groups that do not divide the experts; no group kept */
        static const char *const want[2] = {"n_group", "topk_group"};
        for (int i = 0; i < 2; i++) {
            char d[512];
            snprintf(d, sizeof d, "%s/glm_bad%d", g_dir, i);
            write_ckpt(d, &per, i == 0 ? glm_config(3, 1) : glm_config(8, 0));
            copy_tokenizer(tokdir, d);
            float *x = run(d, T, err, sizeof err, &rc);
            CHECK(!x && rc != 0 && strstr(err, want[i]), "glm bad groups %d: '%s'", i, x ? "(loaded)" : err);
            free(x);
        }
    }
    free(lp);
    free(lf);
    for (int i = 0; i < per.n; i++) free(per.t[i].data);
    for (int i = 0; i < fused.n; i++) free(fused.t[i].data);
}

/* ---- DeepseekV3ForCausalLM -----------------------------------------------------------------------------------
 * A random DeepSeek-V3-shaped model: MLA (q bottleneck DQ or q_proj, latent DKV, DN + DR dims a q/k head with the
 * rope pairs interleaved, DV a v head), YaRN x4 with an attention factor, layer 0 dense, layers 1-2 GLM's MoE block.
 * It must load and give finite, varied logits (and the CPU's on a device); without the q bottleneck too; a W2 pack
 * must keep MLA's and YaRN's hyperparameters and equal the in-memory W2 model; an unknown quantization_config and
 * softmax scoring are refused by name. */
enum { DQ = 32, DKV = 32, DN = 16, DR = 8, DV = 16 };

static const char *ds_config(int q_lora, const char *extra) {
    static char c[3072];
    char ql[16];
    snprintf(ql, sizeof ql, "%d", DQ);
    snprintf(c, sizeof c,
             "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": %d, "
             "\"hidden_size\": %d, \"intermediate_size\": %d, \"moe_intermediate_size\": %d, \"num_hidden_layers\": %d, "
             "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"hidden_act\": \"silu\", "
             "\"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-05, \"q_lora_rank\": %s, \"kv_lora_rank\": %d, "
             "\"qk_nope_head_dim\": %d, \"qk_rope_head_dim\": %d, \"v_head_dim\": %d, \"rope_interleave\": true, "
             "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128, "
             "\"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 1.0, \"mscale_all_dim\": 0.8}, \"rope_theta\": 10000, "
             "\"n_routed_experts\": %d, \"num_experts_per_tok\": %d, \"n_shared_experts\": 1, "
             "\"routed_scaling_factor\": 2.5, \"n_group\": 4, \"topk_group\": 2, \"first_k_dense_replace\": 1, "
             "\"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", "
             "\"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2%s}",
             V, H, GFD, F, GL, NH, NH, q_lora ? ql : "null", DKV, DN, DR, DV, GE, GK, extra);
    return c;
}

/* c[0] with the q bottleneck, c[1] with q_proj (each its own random values) */
static void ds_build(ckpt c[2]) {
    static float buf[V * H];
    char n[128];
    static const char *const ck[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int v = 0; v < 2; v++) add_common(&c[v], -1, 0, 0);
    for (int l = 0; l < GL; l++) {
        for (int v = 0; v < 2; v++) { /* the norms, then MLA's projections */
            static const char *const vec[2] = {"input_layernorm", "post_attention_layernorm"};
            for (int k = 0; k < 2; k++) {
                for (int i = 0; i < H; i++) buf[i] = 1.0f + rnd(0.3f);
                snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, vec[k]);
                add(&c[v], n, 1, H, 0, 0, buf);
            }
            const int64_t qd = NH * (DN + DR);
            struct { const char *nm; int64_t r, cc; int vec; } pr[7] = {
                {v ? "q_proj.weight" : "q_a_proj.weight", v ? qd : DQ, H, 0},
                {v ? NULL : "q_a_layernorm.weight", DQ, 0, 1},
                {v ? NULL : "q_b_proj.weight", qd, DQ, 0},
                {"kv_a_proj_with_mqa.weight", DKV + DR, H, 0},
                {"kv_a_layernorm.weight", DKV, 0, 1},
                {"kv_b_proj.weight", NH * (DN + DV), DKV, 0},
                {"o_proj.weight", H, NH * DV, 0}};
            for (int p = 0; p < 7; p++) {
                if (!pr[p].nm) continue;
                const int64_t cnt = pr[p].vec ? pr[p].r : pr[p].r * pr[p].cc;
                for (int64_t i = 0; i < cnt; i++) buf[i] = pr[p].vec ? 1.0f + rnd(0.3f) : rnd(0.3f);
                snprintf(n, sizeof n, "model.layers.%d.self_attn.%s", l, pr[p].nm);
                add(&c[v], n, pr[p].vec ? 1 : 2, pr[p].r, pr[p].cc, 0, buf);
            }
        }
        if (l == 0) {
            for (int k = 0; k < 3; k++) {
                for (int i = 0; i < GFD * H; i++) buf[i] = rnd(0.3f);
                snprintf(n, sizeof n, "model.layers.0.mlp.%s.weight", ck[k]);
                for (int v = 0; v < 2; v++) add(&c[v], n, 2, k == 2 ? H : GFD, k == 2 ? GFD : H, 0, buf);
            }
            continue;
        }
        for (int i = 0; i < GE * H; i++) buf[i] = rnd(1.0f);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
        for (int v = 0; v < 2; v++) add(&c[v], n, 2, GE, H, 0, buf);
        for (int i = 0; i < GE; i++) buf[i] = rnd(0.3f);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        for (int v = 0; v < 2; v++) add(&c[v], n, 1, GE, 0, 0, buf);
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < F * H; i++) buf[i] = rnd(0.3f);
            snprintf(n, sizeof n, "model.layers.%d.mlp.shared_experts.%s.weight", l, ck[k]);
            for (int v = 0; v < 2; v++) add(&c[v], n, 2, k == 2 ? H : F, k == 2 ? F : H, 0, buf);
        }
        for (int e = 0; e < GE; e++)
            for (int k = 0; k < 3; k++) {
                for (int i = 0; i < F * H; i++) buf[i] = rnd(0.3f);
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, ck[k]);
                for (int v = 0; v < 2; v++) add(&c[v], n, 2, k == 2 ? H : F, k == 2 ? F : H, 0, buf);
            }
    }
}

static void ds_section(const char *tokdir) {
    static ckpt c[2]; /* with the q bottleneck, with q_proj */
    char err[1024];
    ds_build(c);
    const int T = 7;
    char d[2][512];
    float *lg[2];
    int rc;
    for (int v = 0; v < 2; v++) {
        snprintf(d[v], sizeof d[v], "%s/ds%d", g_dir, v);
        write_ckpt(d[v], &c[v], ds_config(!v, ""));
        copy_tokenizer(tokdir, d[v]);
        lg[v] = run(d[v], T, err, sizeof err, &rc);
        REQUIRE(lg[v], "deepseek %d: load: %s", v, err);
        int finite = 1;
        double spread = 0;
        for (size_t i = 0; i < (size_t)T * V; i++) {
            finite &= isfinite(lg[v][i]);
            spread = fmax(spread, fabs((double)lg[v][i] - lg[v][i % V]));
        }
        CHECK(finite && spread > 1e-3, "deepseek %d: logits not finite or all alike (spread %g)", v, spread);
        fprintf(stderr, "deepseek_v3 (%s): %d positions, logits spread %.3g\n", v ? "q_proj" : "q bottleneck", T, spread);
        if (strcmp(device(), "cpu") != 0) { /* MLA's layout ops, the YaRN table, the head width 24 on the device */
            float *lc = run_on("cpu", d[v], T, err, sizeof err, &rc);
            REQUIRE(lc, "deepseek on the cpu: %s", err);
            double md = 0, mr = 0;
            for (size_t i = 0; i < (size_t)T * V; i++) {
                md = fmax(md, fabs((double)lg[v][i] - lc[i]));
                mr = fmax(mr, fabs((double)lc[i]));
            }
            fprintf(stderr, "deepseek_v3: %s vs cpu: max |diff| / max |logit| = %.3g\n", device(), md / mr);
            CHECK(md / mr < 1e-5, "deepseek: %s differs from the cpu by %.3g", device(), md / mr);
            free(lc);
        }
    }
    { /* the latent cache (mla_attn: the CPU's, CUDA's mla.cu) against full keys and values (MOET_MLA_NAIVE=1), on
       * the test's device, in one prefill and token by token (the latent rows written, then read back by later
       * steps); then two sequences in one batch (each row's own latent cache) against them alone */
        float *ln = NULL, *lt = NULL;
        for (int naive = 0; naive < 2; naive++) {
            if (naive) setenv("MOET_MLA_NAIVE", "1", 1);
            float *l = run_on(device(), d[0], T, err, sizeof err, &rc);
            REQUIRE(l, "deepseek (naive %d): %s", naive, err);
            if (naive) { ln = l; unsetenv("MOET_MLA_NAIVE"); } else lt = l;
        }
        moet_model_options mo = moet_model_default_options();
        mo.device = device();
        moet_model *m;
        REQUIRE(moet_model_load(d[0], &mo, &m, err, sizeof err) == 0, "%s", err);
        moet_session_options so = moet_session_default_options();
        so.kv_type = MOET_KV_F32; /* the architectures' numerics against fp32 references (CUDA's auto is f16) */
        so.n_ctx = 64;
        moet_session *s, *s2;
        REQUIRE(moet_session_create(m, &so, &s, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_create(m, &so, &s2, err, sizeof err) == 0, "%s", err);
        double md = 0, mi = 0, mr = 0, mb = 0;
        for (int i = 0; i < T; i++) {
            const int32_t tok = (int32_t)((37 * i + 11) % V);
            REQUIRE(moet_session_eval(s, &tok, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            const float *row = moet_session_logits(s, NULL);
            for (int j = 0; j < V; j++) {
                mi = fmax(mi, fabs((double)row[j] - lt[(size_t)i * V + j]));
                mr = fmax(mr, fabs((double)lt[(size_t)i * V + j]));
            }
        }
        for (size_t i = 0; i < (size_t)T * V; i++) md = fmax(md, fabs((double)lt[i] - ln[i]));
        /* batched: s (T tokens in) and s2 (none yet) step together; s2 replays the window, s goes on, each row
         * against the same tokens run alone (s2's rows are lt's; s's continuation through a third session) */
        moet_batch *bt;
        moet_session *s3;
        REQUIRE(moet_batch_create(m, 2, 64, &bt, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_create(m, &so, &s3, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < T; i++) {
            const int32_t tok = (int32_t)((37 * i + 11) % V);
            REQUIRE(moet_session_eval(s3, &tok, 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
        }
        for (int i = 0; i < 4; i++) {
            const int32_t toks[2] = {(int32_t)((53 * i + 5) % V), (int32_t)((37 * i + 11) % V)};
            moet_session *const rows[2] = {s, s2};
            REQUIRE(moet_batch_decode(bt, rows, toks, 2, err, sizeof err) == 0, "batch: %s", err);
            REQUIRE(moet_session_eval(s3, &toks[0], 1, MOET_LOGITS_LAST, err, sizeof err) == 0, "%s", err);
            const float *b0 = moet_batch_logits(bt, 0), *b1 = moet_batch_logits(bt, 1), *r3 = moet_session_logits(s3, NULL);
            REQUIRE(b0 && b1 && r3, "batch logits missing");
            for (int j = 0; j < V; j++) {
                mb = fmax(mb, fabs((double)b0[j] - r3[j]));
                mb = fmax(mb, fabs((double)b1[j] - lt[(size_t)i * V + j]));
            }
        }
        fprintf(stderr, "deepseek_v3 (%s): latent cache vs full keys and values: max |diff| / max |logit| = %.3g; "
                "token by token vs prefill: %.3g; two rows batched vs alone: %.3g\n", device(), md / mr, mi / mr,
                mb / mr);
        CHECK(md / mr < 1e-5 && mi / mr < 1e-5 && mb / mr < 1e-5,
              "deepseek: the latent cache differs (%.3g vs full, %.3g by token, %.3g batched)", md / mr, mi / mr,
              mb / mr);
        moet_batch_free(bt);
        moet_session_free(s3);
        moet_session_free(s2);
        moet_session_free(s);
        moet_model_free(m);
        free(ln); free(lt);
    }
    { /* a W2 pack keeps MLA's widths, the interleave, YaRN's table and the softmax scale */
        char path[600];
        snprintf(path, sizeof path, "%s/ds.pack", g_dir);
        moet_model_options mo = moet_model_default_options();
        mo.device = device();
        moet_model *m, *pm;
        REQUIRE(moet_model_load(d[0], &mo, &m, err, sizeof err) == 0, "%s", err);
        moet_pack_options po = {.q = moet_matq_default_options(MOET_QF_W2), .calib = NULL, .n_threads = 2};
        REQUIRE(moet_pack_write(m, d[0], path, &po, err, sizeof err) == 0, "pack: %s", err);
        REQUIRE(moet_model_load(path, &mo, &pm, err, sizeof err) == 0, "load pack: %s", err);
        const moet_hparams *a = &m->hp, *b = &pm->hp;
        CHECK(b->q_lora_rank == DQ && b->kv_lora_rank == DKV && b->qk_nope_dim == DN && b->v_head_dim == DV &&
              b->rope_dim == DR && b->head_dim == DN + DR && b->rope_interleave == 1 && b->n_kv_heads == NH &&
              b->rope_type == a->rope_type && b->attn_scale == a->attn_scale && b->mla_eps == a->mla_eps &&
              !memcmp(&b->rope, &a->rope, sizeof a->rope) && a->rope.attn_factor != 1.0f &&
              a->attn_scale != (float)(1.0 / sqrt((double)(DN + DR))),
              "deepseek pack: MLA / YaRN hyperparameters lost (q %d kv %d nope %d v %d rope %d interleave %d, "
              "attn factor %g / %g, scale %g / %g)", b->q_lora_rank, b->kv_lora_rank, b->qk_nope_dim, b->v_head_dim,
              b->rope_dim, b->rope_interleave, b->rope.attn_factor, a->rope.attn_factor, b->attn_scale, a->attn_scale);
        double mw;
        const double dd = pack_vs_memory(m, pm, &po, T, lg[0], &mw);
        fprintf(stderr, "deepseek_v3: W2 pack vs in-memory W2: max |diff| / max |logit| = %.3g (W2 vs bf16: %.3g)\n",
                dd, mw);
        CHECK(dd < 1e-5, "deepseek: the pack's logits differ from the in-memory W2 model's by %.3g", dd);
        CHECK(mw > 1e-4, "deepseek: W2 experts gave the logits of the unquantized ones (%.3g)", mw);
        moet_model_free(pm); moet_model_free(m);
    }
    { /* refusals: a quantization_config moet does not read (bitsandbytes), softmax scoring */
        static const char *const bnb = ", \"quantization_config\": {\"quant_method\": \"bitsandbytes\"}";
        static const char *const want[2] = {"quantization_config", "scoring_func"};
        for (int i = 0; i < 2; i++) {
            char dd[512], cfg[4096];
            snprintf(dd, sizeof dd, "%s/ds_bad%d", g_dir, i);
            snprintf(cfg, sizeof cfg, "%s", ds_config(1, i == 0 ? bnb : ""));
            if (i == 1) { /* the second spelling of scoring_func wins in jansson: replace the first */
                char *p = strstr(cfg, "\"scoring_func\": \"sigmoid\"");
                REQUIRE(p, "test setup");
                memcpy(p, "\"scoring_func\": \"softmax\"", strlen("\"scoring_func\": \"softmax\""));
            }
            write_ckpt(dd, &c[0], cfg);
            copy_tokenizer(tokdir, dd);
            float *x = run(dd, T, err, sizeof err, &rc);
            CHECK(!x && rc != 0 && strstr(err, want[i]), "deepseek refusal %d: '%s'", i, x ? "(loaded)" : err);
            free(x);
        }
    }
    for (int v = 0; v < 2; v++) {
        free(lg[v]);
        for (int i = 0; i < c[v].n; i++) free(c[v].t[i].data);
    }
}

/* ---- FP8 checkpoints (DeepSeek-V3's, Kimi-K2's, Qwen3-FP8's) -------------------------------------------------
 * A random DeepSeek whose projections and experts (not kv_a_proj_with_mqa: its latent / rotary split at row 32 is
 * not a 128-row block edge) are e4m3 with 128 x 128 block scales (weight_scale_inv), beside the same values in f32:
 * the logits must be the same bits; a W2 pack of it holds the dense FP8 matrices as BF16 (each the dequantized value
 * rounded) and no scales; other block sizes are refused by name. CPU only: the CUDA backend refuses FP8 weights. */
static void fp8_section(const char *tokdir) {
    static ckpt c[2], f8, f32;
    char n[600], err[1024];
    ds_build(c);
    static uint8_t q[V * H];
    static float dq[V * H], sc[64];
    int n_f8 = 0;
    for (int i = 0; i < c[0].n; i++) {
        const tensor *t = &c[0].t[i];
        const size_t ln = strlen(t->name);
        const int is8 = t->nd == 2 && ln > 12 && !strcmp(t->name + ln - 12, "_proj.weight") && !strstr(t->name, "kv_a_proj");
        if (!is8) {
            add(&f8, t->name, t->nd, t->shape[0], t->shape[1], t->shape[2], t->data);
            add(&f32, t->name, t->nd, t->shape[0], t->shape[1], t->shape[2], t->data);
            continue;
        }
        const int64_t R = t->shape[0], C = t->shape[1], sr = (R + 127) / 128, scn = (C + 127) / 128;
        REQUIRE(sr * scn <= 64, "test setup");
        for (int64_t b = 0; b < sr * scn; b++) { /* amax / 448 a block, as DeepSeek's quantizer */
            float amax = 0;
            for (int64_t r = (b / scn) * 128; r < R && r < (b / scn + 1) * 128; r++)
                for (int64_t cc = (b % scn) * 128; cc < C && cc < (b % scn + 1) * 128; cc++)
                    amax = fmaxf(amax, fabsf(t->data[r * C + cc]));
            sc[b] = amax > 0 ? amax / 448.0f : 1.0f;
        }
        for (int64_t r = 0; r < R; r++)
            for (int64_t cc = 0; cc < C; cc++) {
                const float s = sc[(r / 128) * scn + cc / 128];
                q[r * C + cc] = moet_f32_to_e4m3(t->data[r * C + cc] / s);
                dq[r * C + cc] = moet_e4m3_to_f32(q[r * C + cc]) * s;
            }
        const int64_t shp[2] = {R, C};
        add_u8(&f8, t->name, 2, shp, q);
        f8.t[f8.n - 1].u8 = 2;
        snprintf(n, sizeof n, "%s_scale_inv", t->name);
        add(&f8, n, 2, sr, scn, 0, sc);
        add(&f32, t->name, 2, R, C, 0, dq);
        n_f8++;
    }
    static const char *const qc = ", \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
                                  "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}";
    char d8[512], d32[512];
    snprintf(d8, sizeof d8, "%s/fp8", g_dir);
    snprintf(d32, sizeof d32, "%s/fp8_f32", g_dir);
    write_ckpt(d8, &f8, ds_config(1, qc));
    copy_tokenizer(tokdir, d8);
    write_ckpt(d32, &f32, ds_config(1, ""));
    copy_tokenizer(tokdir, d32);
    const int T = 7;
    int rc;
    float *l8 = run_on("cpu", d8, T, err, sizeof err, &rc);
    REQUIRE(l8, "fp8: load: %s", err);
    float *l32 = run_on("cpu", d32, T, err, sizeof err, &rc);
    REQUIRE(l32, "fp8 twin: load: %s", err);
    CHECK(n_f8 > 20 && !memcmp(l8, l32, sizeof(float) * (size_t)T * V),
          "fp8: the e4m3 checkpoint's logits differ from its dequantized twin's (%d FP8 matrices)", n_f8);
    fprintf(stderr, "fp8: %d block-scaled e4m3 matrices: logits identical to the dequantized f32 twin\n", n_f8);
    { /* a W2 pack: dense FP8 as BF16, no scales */
        char path[600];
        snprintf(path, sizeof path, "%s/fp8.pack", g_dir);
        moet_model_options mo = moet_model_default_options();
        mo.device = "cpu";
        moet_model *m, *pm;
        REQUIRE(moet_model_load(d8, &mo, &m, err, sizeof err) == 0, "%s", err);
        moet_pack_options po = {.q = moet_matq_default_options(MOET_QF_W2), .calib = NULL, .n_threads = 2};
        REQUIRE(moet_pack_write(m, d8, path, &po, err, sizeof err) == 0, "pack: %s", err);
        moet_gguf g;
        REQUIRE(moet_gguf_open(path, &g, err, sizeof err) == 0, "read: %s", err);
        const moet_gguf_tensor *pt = moet_gguf_find_tensor(&g, "model.layers.1.self_attn.o_proj.weight");
        const moet_weight *wo = &m->layers[1].wo;
        int exact = pt && pt->type == MOET_TYPE_BF16 && wo->type == MOET_TYPE_F8_E4M3;
        float row[256];
        for (int64_t r = 0; exact && r < wo->rows; r++) {
            moet_weight_row_f32(wo, r, row);
            for (int64_t cc = 0; cc < wo->cols; cc++) {
                uint16_t h;
                memcpy(&h, pt->data + ((size_t)r * (size_t)wo->cols + (size_t)cc) * 2, 2);
                exact &= h == moet_f32_to_bf16(row[cc]);
            }
        }
        CHECK(exact && !moet_gguf_find_tensor(&g, "model.layers.1.self_attn.o_proj.weight_scale_inv"),
              "fp8 pack: o_proj is not the BF16 rounding of its dequantized values, or its scales were packed");
        moet_gguf_close(&g);
        REQUIRE(moet_model_load(path, &mo, &pm, err, sizeof err) == 0, "load pack: %s", err);
        double mw;
        const double dd = pack_vs_memory(m, pm, &po, T, l8, &mw);
        fprintf(stderr, "fp8: W2 pack (dense BF16) vs in-memory W2 (dense FP8): max |diff| / max |logit| = %.3g\n", dd);
        CHECK(dd < 0.05, "fp8: the pack's logits differ from the in-memory W2 model's by %.3g", dd);
        moet_model_free(pm); moet_model_free(m);
    }
    { /* other block sizes are refused by name */
        static const char *const bad = ", \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
                                       "\"weight_block_size\": [64, 64]}";
        char db[512];
        snprintf(db, sizeof db, "%s/fp8_bad", g_dir);
        write_ckpt(db, &f8, ds_config(1, bad));
        copy_tokenizer(tokdir, db);
        float *x = run_on("cpu", db, T, err, sizeof err, &rc);
        CHECK(!x && strstr(err, "weight_block_size"), "fp8: 64 x 64 blocks: '%s'", x ? "(loaded)" : err);
        free(x);
    }
    free(l8); free(l32);
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < c[v].n; i++) free(c[v].t[i].data);
    for (int i = 0; i < f8.n; i++) free(f8.t[i].data);
    for (int i = 0; i < f32.n; i++) free(f32.t[i].data);
}

/* ---- GptOssForCausalLM ---------------------------------------------------------------------------------------
 * A random gpt-oss: q/k/v/o biases, sinks, layer 0 sliding (window OW) and layer 1 full, YaRN x32 untruncated, the
 * biased router and experts with the clamped SwiGLU. Its experts are random MXFP4 (hub layout: _blocks / _scales,
 * gate and up rows interleaved) and the same values dequantized in transformers' layout ([E, in, out] f32): the two
 * must give the same logits (to f32 summation order); with both layers full the logits must change; a W2 pack must
 * keep the biases, sinks and windows and equal the in-memory W2 model; on a device, both layouts equal the CPU's. */
enum { OE = 4, OK = 2, OF = 64, OL = 2, OW = 3 };

static const char *oss_config(const char *layer0) {
    static char c[2048];
    snprintf(c, sizeof c,
             "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": %d, "
             "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
             "\"num_key_value_heads\": %d, \"head_dim\": %d, \"hidden_act\": \"silu\", \"max_position_embeddings\": 512, "
             "\"rms_norm_eps\": 1e-05, \"rope_theta\": 150000, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 32.0, "
             "\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"truncate\": false, \"original_max_position_embeddings\": 64}, "
             "\"num_local_experts\": %d, \"num_experts_per_tok\": %d, \"experts_per_token\": %d, \"swiglu_limit\": 7.0, "
             "\"sliding_window\": %d, \"layer_types\": [\"%s\", \"full_attention\"], \"attention_bias\": true, "
             "\"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2}",
             V, H, OF, OL, NH, NKV, HD, OE, OK, OK, OW, layer0);
    return c;
}

static void oss_section(const char *tokdir) {
    static float buf[V * H];
    static ckpt c[3]; /* transformers' layout, the hub's MXFP4, [E, out, in] rows */
    char n[128], err[1024];
    add_common(&c[0], -1, 0, 0); /* then copied into c[1] below: add_common draws new values each call */
    static const float e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int l = 0; l < OL; l++) {
        add_common(&c[0], l, 0, 1);
        snprintf(n, sizeof n, "model.layers.%d.self_attn.o_proj.bias", l);
        for (int i = 0; i < H; i++) buf[i] = rnd(0.3f);
        add(&c[0], n, 1, H, 0, 0, buf);
        snprintf(n, sizeof n, "model.layers.%d.self_attn.sinks", l);
        for (int i = 0; i < NH; i++) buf[i] = rnd(2.0f);
        add(&c[0], n, 1, NH, 0, 0, buf);
        snprintf(n, sizeof n, "model.layers.%d.mlp.router.weight", l);
        for (int i = 0; i < OE * H; i++) buf[i] = rnd(1.0f);
        add(&c[0], n, 2, OE, H, 0, buf);
        snprintf(n, sizeof n, "model.layers.%d.mlp.router.bias", l);
        for (int i = 0; i < OE; i++) buf[i] = rnd(0.5f);
        add(&c[0], n, 1, OE, 0, 0, buf);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        for (int i = 0; i < OE * 2 * OF; i++) buf[i] = rnd(0.5f);
        add(&c[0], n, 2, OE, 2 * OF, 0, buf);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj_bias", l);
        for (int i = 0; i < OE * H; i++) buf[i] = rnd(0.3f);
        add(&c[0], n, 2, OE, H, 0, buf);
        /* the experts: MXFP4 rows [out][in] (gate_up: 2F rows of H, interleaved; down: H rows of F) */
        for (int k = 0; k < 2; k++) {
            const int64_t R = k ? H : 2 * OF, C = k ? OF : H, nb = C / 32;
            static uint8_t blk[OE * 2 * OF * (H / 32) * 16], scl[OE * 2 * OF * (H / 32)];
            static float tr[OE * 2 * OF * H], ro[OE * 2 * OF * H]; /* transformers' [E, in, out]; [E, out, in] */
            for (int64_t e = 0; e < OE; e++)
                for (int64_t r = 0; r < R; r++)
                    for (int64_t b = 0; b < nb; b++) {
                        uint8_t *q = blk + ((e * R + r) * nb + b) * 16;
                        uint8_t *s = scl + (e * R + r) * nb + b;
                        *s = (uint8_t)(121 + (int)(rnd(1.0f) * 2.5f + 2.5f)); /* 2^-6 .. 2^-1 */
                        for (int j = 0; j < 16; j++) q[j] = (uint8_t)(rnd(1.0f) * 127.5f + 127.5f);
                        for (int j = 0; j < 32; j++) { /* element 2i in byte i's low nibble, 2i + 1 high */
                            const float val = e2m1[(q[j / 2] >> (4 * (j & 1))) & 15] * ldexpf(1.0f, (int)*s - 127);
                            tr[(e * C + b * 32 + j) * R + r] = val;
                            ro[(e * R + r) * C + b * 32 + j] = val;
                        }
                    }
            const char *nm = k ? "down_proj" : "gate_up_proj";
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s", l, nm);
            add(&c[0], n, 3, OE, C, R, tr);
            add(&c[2], n, 3, OE, R, C, ro);
            const int64_t sb[4] = {OE, R, nb, 16}, ss[3] = {OE, R, nb};
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s_blocks", l, nm);
            add_u8(&c[1], n, 4, sb, blk);
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s_scales", l, nm);
            add_u8(&c[1], n, 3, ss, scl);
        }
    }
    for (int i = 0; i < c[0].n; i++) { /* the shared tensors (all but transformers' expert matrices) into c[1] */
        const tensor *t = &c[0].t[i];
        const size_t ln = strlen(t->name);
        if ((ln > 12 && !strcmp(t->name + ln - 12, "gate_up_proj")) || (ln > 9 && !strcmp(t->name + ln - 9, "down_proj")))
            continue;
        add(&c[1], t->name, t->nd, t->shape[0], t->shape[1], t->shape[2], t->data);
        add(&c[2], t->name, t->nd, t->shape[0], t->shape[1], t->shape[2], t->data);
    }
    const int T = 7;
    char d[4][512];
    float *lg[4];
    int rc;
    for (int v = 0; v < 4; v++) { /* transformers' layout, the hub's, transformers' with no sliding layer, rows */
        snprintf(d[v], sizeof d[v], "%s/oss%d", g_dir, v);
        write_ckpt(d[v], &c[v == 1 ? 1 : v == 3 ? 2 : 0], oss_config(v == 2 ? "full_attention" : "sliding_attention"));
        copy_tokenizer(tokdir, d[v]);
        lg[v] = run_on("cpu", d[v], T, err, sizeof err, &rc);
        REQUIRE(lg[v], "gpt-oss %d: load: %s", v, err);
    }
    double md = 0, mr = 0, mw = 0, spread = 0, mro = 0;
    int finite = 1;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        finite &= isfinite(lg[0][i]);
        md = fmax(md, fabs((double)lg[0][i] - lg[1][i]));
        mro = fmax(mro, fabs((double)lg[0][i] - lg[3][i]));
        mw = fmax(mw, fabs((double)lg[0][i] - lg[2][i]));
        mr = fmax(mr, fabs((double)lg[0][i]));
        spread = fmax(spread, fabs((double)lg[0][i] - lg[0][i % V]));
    }
    fprintf(stderr, "gpt_oss: MXFP4 hub layout vs transformers' layout: max |diff| / max |logit| = %.3g; full vs "
            "sliding layer 0: %.3g; spread %.3g\n", md / mr, mw / mr, spread);
    CHECK(finite && spread > 1e-3, "gpt-oss: logits not finite or all alike (spread %g)", spread);
    CHECK(md / mr < 1e-5, "gpt-oss: the MXFP4 layout's logits differ from transformers' layout by %.3g", md / mr);
    CHECK(mro == 0, "gpt-oss: the [E, out, in] layout's logits differ from transformers' layout by %.3g", mro / mr);
    CHECK(mw / mr > 1e-4, "gpt-oss: the sliding window changed nothing over %d tokens (window %d)", T, OW);
    { /* a W2 pack of the MXFP4 model keeps the biases, sinks, windows, the router */
        char path[600];
        snprintf(path, sizeof path, "%s/oss.pack", g_dir);
        moet_model_options mo = moet_model_default_options();
        mo.device = "cpu";
        moet_model *m, *pm;
        REQUIRE(moet_model_load(d[1], &mo, &m, err, sizeof err) == 0, "%s", err);
        moet_pack_options po = {.q = moet_matq_default_options(MOET_QF_W2), .calib = NULL, .n_threads = 2};
        REQUIRE(moet_pack_write(m, d[1], path, &po, err, sizeof err) == 0, "pack: %s", err);
        REQUIRE(moet_model_load(path, &mo, &pm, err, sizeof err) == 0, "load pack: %s", err);
        CHECK(pm->hp.router_scoring == MOET_ROUTER_TOPK_SOFTMAX && pm->hp.swiglu_limit == 7.0f &&
              pm->layers[0].window == OW && pm->layers[1].window == 0 && pm->layers[0].sinks &&
              pm->layers[1].exp_down_b && pm->layers[0].router_lbias && pm->hp.rope.attn_factor == m->hp.rope.attn_factor,
              "gpt-oss pack: router, limit, windows, sinks or biases lost");
        double dw;
        const double dd = pack_vs_memory(m, pm, &po, T, lg[1], &dw);
        fprintf(stderr, "gpt_oss: W2 pack vs in-memory W2: max |diff| / max |logit| = %.3g (W2 vs MXFP4: %.3g)\n", dd, dw);
        CHECK(dd < 1e-5, "gpt-oss: the pack's logits differ from the in-memory W2 model's by %.3g", dd);
        moet_model_free(pm); moet_model_free(m);
    }
    if (strcmp(device(), "cpu") != 0) { /* the device (sinks, windows, the biased MoE) against the CPU, both layouts */
        for (int v = 0; v < 2; v++) {
            float *x = run(d[v], T, err, sizeof err, &rc);
            REQUIRE(x, "gpt-oss on %s: %s", device(), err);
            double dd = 0;
            for (size_t i = 0; i < (size_t)T * V; i++) dd = fmax(dd, fabs((double)x[i] - lg[v][i]));
            fprintf(stderr, "gpt_oss (%s): %s vs cpu: max |diff| / max |logit| = %.3g\n", v ? "MXFP4" : "f32", device(),
                    dd / mr);
            CHECK(dd / mr < 1e-5, "gpt-oss: %s differs from the cpu by %.3g", device(), dd / mr);
            free(x);
        }
    }
    for (int v = 0; v < 4; v++) free(lg[v]);
    for (int v = 0; v < 3; v++)
        for (int i = 0; i < c[v].n; i++) free(c[v].t[i].data);
}

int main(int argc, char **argv) {
    REQUIRE(argc == 2, "usage: test_arch TOKENIZER_DIR");
    snprintf(g_dir, sizeof g_dir, "/tmp/moet_test_arch_XXXXXX");
    REQUIRE(mkdtemp(g_dir), "mkdtemp");
    static float buf[V * H];
    /* the random model, tensor by tensor, in the hub layout; the other two layouts from the same values */
    ckpt hub = {0}, fused = {0}, canon = {0};
    char n[128];
    add_common(&hub, -1, 0, 0);
    static float gw[E][F * H], uw[E][F * H], dw[E][H * F];
    for (int l = 0; l < L; l++) {
        add_common(&hub, l, 0, 0);
        for (int i = 0; i < E * H; i++) buf[i] = rnd(1.0f);
        snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.gate.weight", l);
        add(&hub, n, 2, E, H, 0, buf);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
        add(&fused, n, 2, E, H, 0, buf);
        add(&canon, n, 2, E, H, 0, buf);
        for (int e = 0; e < E; e++) {
            for (int i = 0; i < F * H; i++) { gw[e][i] = rnd(0.3f); uw[e][i] = rnd(0.3f); dw[e][i] = rnd(0.3f); }
            static const char *const hk[3] = {"w1", "w3", "w2"}, *const ck[3] = {"gate_proj", "up_proj", "down_proj"};
            const float *m3[3] = {gw[e], uw[e], dw[e]};
            for (int k = 0; k < 3; k++) {
                snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, e, hk[k]);
                add(&hub, n, 2, k == 2 ? H : F, k == 2 ? F : H, 0, m3[k]);
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, ck[k]);
                add(&canon, n, 2, k == 2 ? H : F, k == 2 ? F : H, 0, m3[k]);
            }
        }
        add_fused(&fused, l, E, gw[0], uw[0], dw[0]);
    }
    /* the shared tensors (everything but the MoE block's) into the other two */
    for (int i = 0; i < hub.n; i++)
        if (!strstr(hub.t[i].name, "block_sparse_moe")) {
            const tensor *t = &hub.t[i];
            add(&fused, t->name, t->nd, t->shape[0], t->shape[1], t->shape[2], t->data);
            add(&canon, t->name, t->nd, t->shape[0], t->shape[1], t->shape[2], t->data);
        }
    static const char *const names[3] = {"hub", "fused", "canonical"};
    const ckpt *cs[3] = {&hub, &fused, &canon};
    char dir[3][512], err[1024];
    float *lg[3];
    const int T = 7;
    for (int i = 0; i < 3; i++) {
        snprintf(dir[i], sizeof dir[i], "%s/%s", g_dir, names[i]);
        write_ckpt(dir[i], cs[i], config(0));
        copy_tokenizer(argv[1], dir[i]);
        int rc;
        lg[i] = run(dir[i], T, err, sizeof err, &rc);
        REQUIRE(lg[i], "%s layout: load: %s", names[i], err);
    }
    int finite = 1;
    double spread = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        finite &= isfinite(lg[0][i]);
        spread = fmax(spread, fabs((double)lg[0][i] - lg[0][i % V])); /* position 0 against the others */
    }
    CHECK(finite, "hub layout: non-finite logits");
    CHECK(spread > 1e-3, "hub layout: every position's logits alike (spread %g)", spread);
    for (int i = 1; i < 3; i++)
        CHECK(!memcmp(lg[0], lg[i], sizeof(float) * (size_t)T * V), "the %s layout's logits differ from the hub's",
              names[i]);
    fprintf(stderr, "mixtral: three layouts, %d positions: identical logits, spread %.3g\n", T, spread);
    /* a W2 pack of the hub layout: its experts are stored once, quantized under the pack's names (the hub's
     * block_sparse_moe.experts tensors are not copied as dense ones), the router under its own name; loaded back it
     * binds those and gives the logits of the in-memory W2 roundtrip */
    {
        char path[600];
        snprintf(path, sizeof path, "%s/w2.pack", g_dir);
        moet_model_options mo = moet_model_default_options();
        mo.device = device();
        moet_model *m, *pm;
        REQUIRE(moet_model_load(dir[0], &mo, &m, err, sizeof err) == 0, "%s", err);
        moet_pack_options po = {.q = moet_matq_default_options(MOET_QF_W2), .calib = NULL, .n_threads = 2};
        REQUIRE(moet_pack_write(m, dir[0], path, &po, err, sizeof err) == 0, "pack: %s", err);
        moet_gguf g;
        REQUIRE(moet_gguf_open(path, &g, err, sizeof err) == 0, "read: %s", err);
        size_t hub_experts = 0;
        for (size_t i = 0; i < g.n_tensors; i++) hub_experts += strstr(g.tensors[i].name, "block_sparse_moe.experts") != NULL;
        CHECK(hub_experts == 0, "the pack copied %zu hub expert tensors as dense ones", hub_experts);
        CHECK(moet_gguf_find_tensor(&g, "model.layers.1.block_sparse_moe.gate.weight") &&
              moet_gguf_find_tensor(&g, "model.layers.1.mlp.experts.3.down_proj.weight"), "the pack lacks the router "
              "or an expert");
        moet_gguf_close(&g);
        REQUIRE(moet_model_load(path, &mo, &pm, err, sizeof err) == 0, "load pack: %s", err);
        const double d = pack_vs_memory(m, pm, &po, T, NULL, NULL);
        fprintf(stderr, "mixtral: W2 pack vs in-memory W2: max |diff| / max |logit| = %.3g\n", d);
        CHECK(d < 1e-5, "the pack's logits differ from the in-memory W2 model's by %.3g", d);
        moet_model_free(pm); moet_model_free(m);
    }
    /* refusals: a sliding window shorter than the context; a missing expert tensor names itself */
    {
        char d[512];
        snprintf(d, sizeof d, "%s/window", g_dir);
        write_ckpt(d, &hub, config(1));
        copy_tokenizer(argv[1], d);
        int rc;
        float *x = run(d, T, err, sizeof err, &rc);
        CHECK(!x && rc != 0 && strstr(err, "sliding_window"), "sliding window: '%s'", x ? "(loaded)" : err);
        free(x);
        ckpt broken = hub;
        int drop = -1;
        for (int i = 0; i < broken.n; i++)
            if (strstr(broken.t[i].name, "layers.1.block_sparse_moe.experts.3.w2")) drop = i;
        REQUIRE(drop >= 0, "test setup");
        broken.t[drop] = broken.t[--broken.n];
        snprintf(d, sizeof d, "%s/missing", g_dir);
        write_ckpt(d, &broken, config(0));
        copy_tokenizer(argv[1], d);
        x = run(d, T, err, sizeof err, &rc);
        CHECK(!x && rc != 0 && strstr(err, "block_sparse_moe.experts.3.w2"), "missing expert: '%s'", x ? "(loaded)" : err);
        free(x);
        snprintf(d, sizeof d, "%s/unpadded", g_dir);
        write_ckpt_p(d, &hub, config(0), 0);
        copy_tokenizer(argv[1], d);
        x = run(d, T, err, sizeof err, &rc);
        CHECK(!x && rc != 0 && strstr(err, "not aligned"), "unpadded header: '%s'", x ? "(loaded)" : err);
        free(x);
    }
    glm_section(argv[1]);
    ds_section(argv[1]);
    oss_section(argv[1]);
    fp8_section(argv[1]);
    for (int i = 0; i < 3; i++) free(lg[i]);
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < cs[c]->n; i++) free(cs[c]->t[i].data);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (!getenv("MOET_TEST_KEEP") && system(cmd) != 0) /* MOET_TEST_KEEP: the checkpoints stay, for a look */
        fprintf(stderr, "warning: could not remove %s\n", g_dir);
    TEST_END();
}
