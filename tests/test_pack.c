/*
 * test_pack.c — pack write -> read round trip: every dense tensor's bytes equal the checkpoint's, every expert
 * matrix's blocks equal a fresh quantization of the same matrix, expert records start 4 KiB-aligned in the file,
 * and a pack loaded as a model gives the same logits as the in-memory roundtrip of the same format (the CPU
 * kernel on packed W2 rows with rotated activations against the dequantized oracle).
 * usage: test_pack HF_MODEL_DIR
 */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "model/model.h"
#include "model/pack.h"
#include "quant/calib.h"
#include "quant/requant.h"
#include "quant/types.h"
#include "test_util.h"

int main(int argc, char **argv) {
    REQUIRE(argc == 2, "usage: test_pack HF_MODEL_DIR");
    char err[1024], path[256];
    snprintf(path, sizeof path, "/tmp/moet_pack_test_%d.gguf", (int)getpid());
    moet_model_options mo = moet_model_default_options();
    moet_model *m;
    REQUIRE(moet_model_load(argv[1], &mo, &m, err, sizeof err) == 0, "%s", err);
    const int formats[] = {MOET_QF_W2, MOET_QF_NVFP4, MOET_QF_Q8_0};
    for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++) {
        moet_pack_options po = {.q = moet_matq_default_options((moet_qformat)formats[fi]), .calib = NULL, .n_threads = 2};
        REQUIRE(moet_pack_write(m, argv[1], path, &po, err, sizeof err) == 0, "write: %s", err);
        char tmp[300];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        CHECK(access(tmp, F_OK) != 0, "temporary file left behind");
        moet_gguf g;
        REQUIRE(moet_gguf_open(path, &g, err, sizeof err) == 0, "read: %s", err);
        size_t dense = 0, experts = 0, misaligned = 0, mismatched = 0;
        for (size_t i = 0; i < m->st.n_tensors; i++) {
            const moet_st_tensor *t = &m->st.tensors[i];
            if (strstr(t->name, ".mlp.experts.")) continue;
            const moet_gguf_tensor *pt = moet_gguf_find_tensor(&g, t->name);
            CHECK(pt && pt->nbytes == t->nbytes && memcmp(pt->data, t->data, t->nbytes) == 0, "dense tensor %s differs", t->name);
            dense++;
        }
        const moet_hparams *hp = &m->hp;
        for (int l = 0; l < hp->n_layers; l++) {
            if (!hp->layer_moe[l]) continue;
            for (int e = 0; e < hp->n_experts; e += 7) {
                const moet_weight *ws[3] = {&m->layers[l].exp_gate[e], &m->layers[l].exp_up[e], &m->layers[l].exp_down[e]};
                static const char *kn[3] = {"gate_proj", "up_proj", "down_proj"};
                for (int k = 0; k < 3; k++) {
                    char nm[256];
                    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, kn[k]);
                    const moet_gguf_tensor *pt = moet_gguf_find_tensor(&g, nm);
                    REQUIRE(pt, "missing %s", nm);
                    if (k == 0 && (size_t)(pt->data - (const uint8_t *)g.map.data) % MOET_PACK_RECORD_ALIGN) misaligned++;
                    if (k > 0) { /* records are contiguous: gate, up, down back to back (32-byte alignment inside) */
                        char prev[256];
                        snprintf(prev, sizeof prev, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, kn[k - 1]);
                        const moet_gguf_tensor *pp = moet_gguf_find_tensor(&g, prev);
                        CHECK(pt->data - (pp->data + pp->nbytes) < 32, "%s does not follow %s", nm, prev);
                    }
                    const moet_weight *w = ws[k];
                    float *src = moet_weight_widen(w), *deq = malloc(sizeof(float) * (size_t)(w->rows * w->cols));
                    uint8_t *blk = malloc(pt->nbytes + 1);
                    moet_matq_options q = po.q;
                    q.seed = moet_expert_rot_seed(l, k);
                    moet_matq_info info;
                    REQUIRE(moet_matq_quantize(src, w->rows, w->cols, NULL, &q, deq, blk, &info, NULL) == 0, "quantize");
                    if (pt->type != info.type || memcmp(blk, pt->data, pt->nbytes)) mismatched++;
                    experts++;
                    free(src); free(deq); free(blk);
                }
            }
        }
        CHECK(misaligned == 0, "%zu expert records not 4 KiB-aligned in the file", misaligned);
        CHECK(mismatched == 0, "%zu expert matrices differ from a fresh quantization", mismatched);
        fprintf(stderr, "%s: %zu dense tensors and %zu expert matrices round-trip bit-exact\n",
                moet_qformat_name((moet_qformat)formats[fi]), dense, experts);
        moet_gguf_close(&g);

        /* The pack as a model against the in-memory roundtrip of the same format. */
        moet_model *pm, *rm;
        REQUIRE(moet_model_load(path, &mo, &pm, err, sizeof err) == 0, "load pack: %s", err);
        REQUIRE(moet_model_load(argv[1], &mo, &rm, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_model_requant_experts(rm, &po.q, NULL, 2, NULL, err, sizeof err) == 0, "%s", err);
        moet_session *a, *b;
        moet_session_options so = moet_session_default_options();
        so.n_ctx = 48;
        so.n_logits = 48;
        REQUIRE(moet_session_create(pm, &so, &a, err, sizeof err) == 0 && moet_session_create(rm, &so, &b, err, sizeof err) == 0, "%s", err);
        int32_t ids[48];
        for (int i = 0; i < 48; i++) ids[i] = (i * 977 + 31) % hp->vocab;
        REQUIRE(moet_session_eval(a, ids, 48, MOET_LOGITS_ALL, err, sizeof err) == 0, "%s", err);
        REQUIRE(moet_session_eval(b, ids, 48, MOET_LOGITS_ALL, err, sizeof err) == 0, "%s", err);
        const float *la = moet_session_logits(a, NULL), *lb = moet_session_logits(b, NULL);
        double md = 0, mr = 0;
        for (size_t i = 0; i < (size_t)48 * hp->vocab; i++) {
            md = fmax(md, fabs((double)la[i] - lb[i]));
            mr = fmax(mr, fabs((double)lb[i]));
        }
        fprintf(stderr, "%s: pack model vs in-memory roundtrip: max |diff| / max |logit| = %.3g\n",
                moet_qformat_name((moet_qformat)formats[fi]), md / mr);
        CHECK(md / mr < 1e-5, "pack logits differ from the oracle by %.3g", md / mr);
        moet_session_free(a); moet_session_free(b);
        moet_model_free(pm); moet_model_free(rm);
        unlink(path);
    }
    moet_model_free(m);
    TEST_END();
}
