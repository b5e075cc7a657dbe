/*
 * cmd_perplexity.c — `moet perplexity`: PPL over fixed windows and KL divergence to a saved base run.
 *
 * Method (llama.cpp's and ../shared/quality-peers.md's): the file is tokenized as one text (no BOS unless the
 * tokenizer's post-processor adds one), cut into non-overlapping windows of --ctx tokens from token 0, each window
 * evaluated from an empty cache and scoring its ctx-1 next-token predictions.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/util.h"
#include "model/model.h"
#include "runtime/kld.h"
#include "quant/calib.h"
#include "quant/requant.h"
#include "runtime/session_int.h"

#define STUDY_SIGS 6 /* --gate-study's signals a step: top-1, its margin, entropy; router margin min / mean, entropy */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(const double *sorted, size_t n, double q) {
    if (!n) return 0;
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    double f = pos - (double)i;
    return i + 1 < n ? sorted[i] * (1 - f) + sorted[i + 1] * f : sorted[n - 1];
}

int cmd_perplexity(int argc, char **argv) {
    cli_common c = {0};
    const char *file = NULL, *save = NULL, *base = NULL, *experts = NULL, *calib_file = NULL;
    long ctx = 512, chunks = 0, topk_opt = 0, calib_tokens = 32768, step = 0;
    int json = 0, no_rotate = 0, no_gptq = 0, no_search = 0;
    double beta = 0, tau = 0.6;
    const char *delta_mode = NULL, *study_path = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-f")) { VAL(); file = v; }
        else if (!strcmp(a, "--ctx")) { VAL(); if (cli_parse_int(v, 2, 1 << 20, &ctx)) { fprintf(stderr, "moet perplexity: bad --ctx\n"); return 2; } }
        else if (!strcmp(a, "--step")) { VAL(); if (cli_parse_int(v, 1, 1 << 20, &step)) { fprintf(stderr, "moet perplexity: bad --step\n"); return 2; } }
        else if (!strcmp(a, "--chunks")) { VAL(); if (cli_parse_int(v, 1, 1 << 30, &chunks)) { fprintf(stderr, "moet perplexity: bad --chunks\n"); return 2; } }
        else if (!strcmp(a, "--save-logits")) { VAL(); save = v; }
        else if (!strcmp(a, "--kld-base")) { VAL(); base = v; }
        else if (!strcmp(a, "--kld-topk")) { VAL(); if (cli_parse_int(v, 1, 1 << 24, &topk_opt)) { fprintf(stderr, "moet perplexity: bad --kld-topk\n"); return 2; } }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--experts")) { VAL(); experts = v; }
        else if (!strcmp(a, "--calib")) { VAL(); calib_file = v; }
        else if (!strcmp(a, "--no-calib")) calib_file = NULL;
        else if (!strcmp(a, "--calib-tokens")) { VAL(); if (cli_parse_int(v, 1, 1L << 40, &calib_tokens)) return 2; }
        else if (!strcmp(a, "--delta")) { VAL(); delta_mode = v; }
        else if (!strcmp(a, "--gate-study")) { VAL(); study_path = v; }
        else if (!strcmp(a, "--tau")) { VAL(); if (cli_parse_float(v, &tau) || tau < 0 || tau > 1) { fprintf(stderr, "moet perplexity: --tau in [0, 1]\n"); return 2; } }
        else if (!strcmp(a, "--no-rotate")) no_rotate = 1;
        else if (!strcmp(a, "--no-gptq")) no_gptq = 1;
        else if (!strcmp(a, "--no-search")) no_search = 1;
        else if (!strcmp(a, "--beta")) { VAL(); if (cli_parse_float(v, &beta) || beta < 0 || beta >= 1) return 2; }
        else { fprintf(stderr, "moet perplexity: unknown option '%s'\n", a); return 2; }
#undef VAL
    }
    if (!file) {
        fprintf(stderr, "usage: moet perplexity [-m DIR] -f TEXT_FILE [--ctx 512] [--chunks N] "
                        "[--save-logits FILE | --kld-base FILE] [--kld-topk K] [--json]\n"
                        "       [--step N (tokens a forward step: 1 scores as decode routes; default min(ctx, 512))]\n"
                        "       [--experts bf16|q8_0|mxfp4|nvfp4|int2|asym2|sym2|w2 [--calib TEXT[.xz]] [--calib-tokens N]\n"
                        "        [--no-rotate] [--no-gptq] [--no-search] [--beta B]]\n"
                        "       [--delta off|on|gate|pick] [--tau T] [--delta-pick R] (moet run -h: the delta modes)\n"
                        "       (routed experts quantized in memory; w2+nvfp4 / w2+w2 carry a delta)\n");
        return 2;
    }
    if (save && base) { fprintf(stderr, "moet perplexity: --save-logits and --kld-base exclude each other\n"); return 2; }
    char err[1024];
    char *text = NULL;
    size_t tlen;
    if (moet_file_read_all(file, (size_t)4 << 30, &text, &tlen, err, sizeof err)) {
        fprintf(stderr, "moet: error: %s\n", err);
        return 1;
    }
    moet_model *m = cli_load_model(&c);
    if (!m) { free(text); return 1; }
    int rc = 1;
    moet_requant_stats rqs = {0};
    int qf = -1;
    if (experts) {
        qf = moet_qformat_parse(experts);
        if (qf < 0) { fprintf(stderr, "moet perplexity: unknown --experts format '%s'\n", experts); moet_model_free(m); free(text); return 2; }
        moet_matq_options qo = moet_matq_default_options((moet_qformat)qf);
        qo.rotate = !no_rotate;
        qo.gptq = !no_gptq;
        qo.search = !no_search;
        qo.beta = (float)beta;
        if (cli_requant_experts(m, &qo, calib_file, calib_tokens, c.threads, &rqs)) { moet_model_free(m); free(text); return 1; }
        MOET_LOGI("experts as %s (%.2f bpw): weight relative error %.4g, mean beta %.3f, %lld matrices in %.1f s",
                  experts, moet_qformat_bpw((moet_qformat)qf), rqs.rel_err, rqs.mean_beta, (long long)rqs.n_matrices,
                  rqs.seconds);
    }
    int32_t *toks = NULL, *scr_ids = NULL, *rec_ids = NULL;
    float *logp = NULL, *rec_lp = NULL;
    double *klds = NULL;
    uint8_t *mark = NULL;
    float *gate_buf = NULL, *study_on = NULL, *route = NULL;
    double *study_sig = NULL;
    FILE *study = NULL;
    FILE *fs = NULL, *fb = NULL;
    char tmp_path[4096] = {0};
    moet_session *s = NULL;
    size_t n_tok;
    double t0 = moet_time_s();
    if (moet_tokenizer_encode(moet_model_tokenizer(m), text, tlen, &toks, &n_tok, err, sizeof err)) {
        fprintf(stderr, "moet: error: %s\n", err);
        goto out;
    }
    MOET_LOGI("tokenized %zu bytes into %zu tokens in %.2f s", tlen, n_tok, moet_time_s() - t0);
    size_t n_win = n_tok / (size_t)ctx;
    if (chunks && (size_t)chunks < n_win) n_win = (size_t)chunks;
    if (n_win == 0) {
        fprintf(stderr, "moet perplexity: the text has %zu tokens, fewer than --ctx %ld\n", n_tok, ctx);
        goto out;
    }
    moet_model_info info;
    moet_model_info_get(m, &info);
    const int32_t V = info.vocab_size;
    const size_t n_pos = n_win * (size_t)(ctx - 1);
    moet_kld_header kh = {.vocab = (uint32_t)V, .ctx = (uint32_t)ctx,
                          .topk = (uint32_t)(topk_opt ? (topk_opt < V ? topk_opt : V) : (V < 1024 ? V : 1024)),
                          .n_positions = n_pos, .tokens_hash = moet_fnv1a_ids(toks, n_win * (size_t)ctx)};
    if (base) {
        moet_kld_header bh;
        if (!(fb = fopen(base, "rb")) || moet_kld_read_header(fb, &bh)) {
            fprintf(stderr, "moet: error: %s: not a readable moet logits file\n", base);
            goto out;
        }
        if (bh.vocab != kh.vocab || bh.ctx != kh.ctx || bh.n_positions != kh.n_positions ||
            bh.tokens_hash != kh.tokens_hash) {
            fprintf(stderr, "moet: error: %s was saved for another run (vocab %u ctx %u positions %llu, or other "
                            "text); this run: vocab %u ctx %u positions %llu\n", base, bh.vocab, bh.ctx,
                    (unsigned long long)bh.n_positions, kh.vocab, kh.ctx, (unsigned long long)kh.n_positions);
            goto out;
        }
        kh.topk = bh.topk;
    }
    if (save) {
        snprintf(tmp_path, sizeof tmp_path, "%s.tmp", save);
        if (!(fs = fopen(tmp_path, "wb")) || moet_kld_write_header(fs, &kh)) {
            fprintf(stderr, "moet: error: cannot write %s\n", tmp_path);
            goto out;
        }
    }
    moet_model_info pmi;
    moet_model_info_get(m, &pmi);
    const int dmode = cli_delta_mode("perplexity", delta_mode, &pmi); /* CLI_DELTA_* */
    if (dmode < 0) goto out;
    delta_mode = cli_delta_names[dmode];
    moet_session_options so = moet_session_default_options();
    so.n_ctx = (int32_t)ctx;
    so.kv_type = c.kv_type;
    so.n_batch = step ? (int32_t)(step < ctx ? step : ctx) : ctx < 512 ? (int32_t)ctx : 512;
    so.n_logits = (int32_t)ctx;
    if (moet_session_create(m, &so, &s, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); goto out; }
    logp = malloc((size_t)V * sizeof(float));
    scr_ids = malloc((size_t)V * sizeof(int32_t));
    rec_ids = malloc(kh.topk * sizeof(int32_t));
    rec_lp = malloc(kh.topk * sizeof(float));
    klds = base ? malloc(n_pos * sizeof(double)) : NULL;
    mark = calloc((size_t)V, 1);
    if (!logp || !scr_ids || !rec_ids || !rec_lp || (base && !klds) || !mark) { fprintf(stderr, "moet: out of memory\n"); goto out; }
    double nll = 0, t_eval = moet_time_s();
    size_t n_scored = 0, agree = 0, corrected = 0;
    /* --gate-study: every step on the base and, from the same cache, on base + delta; per step the confidence
     * signals of the base step and both KLDs go to a CSV, to choose the gate's signal and threshold offline. */
    if (study_path && (dmode != 2 || !fb)) { fprintf(stderr, "moet perplexity: --gate-study needs --delta gate and --kld-base\n"); goto out; }
    if (study_path) {
        if (!(study = fopen(study_path, "w"))) { fprintf(stderr, "moet: error: cannot write %s\n", study_path); goto out; }
        fprintf(study, "window,pos,top1,margin,entropy,route_margin_min,route_margin_mean,route_entropy,kld_base,kld_on\n");
        study_on = malloc((size_t)ctx * (size_t)V * sizeof(float));
        study_sig = malloc((size_t)ctx * STUDY_SIGS * sizeof(double));
        route = calloc((size_t)m->hp.n_layers * 2, sizeof(float));
        if (!study_on || !study_sig || !route) { fprintf(stderr, "moet: out of memory\n"); goto out; }
        moet_session_set_route_stats(s, route); /* each one-token eval's router statistics, layer by layer */
    }
    if (dmode == 2 && !(gate_buf = malloc((size_t)ctx * (size_t)V * sizeof(float)))) { fprintf(stderr, "moet: out of memory\n"); goto out; }
    moet_session_use_delta(s, dmode == CLI_DELTA_ON || dmode == CLI_DELTA_PICK);
    if (cli_delta_pick(&c, s, dmode)) goto out;
    int64_t dcount[2] = {0, 0}; /* picks that ran with the delta, all picks (the CPU backend counts) */
    moet_session_set_delta_count(s, dcount);
    const double dpick = dmode ? moet_session_delta_pick(s) : 0.0;
    for (size_t w = 0; w < n_win; w++) {
        const int32_t *wt = toks + w * (size_t)ctx;
        const float *lg;
        if (moet_session_truncate(s, 0, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); goto out; }
        if (dmode != CLI_DELTA_GATE) {
            if (moet_session_eval(s, wt, (int32_t)ctx, MOET_LOGITS_ALL, err, sizeof err)) {
                fprintf(stderr, "moet: error: %s\n", err);
                goto out;
            }
            lg = moet_session_logits(s, NULL);
        } else {
            /* The confidence gate, step by step as decode runs it: each step on the base experts; a step whose top-1
             * probability is below tau is recomputed with base + delta, replacing its KV entries. */
            for (long j = 0; j + 1 < ctx; j++) {
                if (!study) {
                    int corr;
                    if (moet_session_eval_gated(s, wt[j], (float)tau, &corr, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); goto out; }
                    corrected += corr;
                    memcpy(gate_buf + (size_t)j * V, moet_session_logits(s, NULL), (size_t)V * sizeof(float));
                    continue;
                }
                if (moet_session_eval(s, wt + j, 1, MOET_LOGITS_LAST, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); goto out; }
                const float *l1 = moet_session_logits(s, NULL);
                moet_log_softmax(l1, V, logp);
                {
                    double p1 = 0, p2 = 0, ent = 0;
                    for (int32_t k = 0; k < V; k++) {
                        double pk = exp((double)logp[k]);
                        ent -= pk * (double)logp[k];
                        if (pk > p1) { p2 = p1; p1 = pk; } else if (pk > p2) p2 = pk;
                    }
                    double *sg = study_sig + j * STUDY_SIGS, rmin = INFINITY, rsum = 0, rent = 0;
                    int nm = 0;
                    for (int32_t l = 0; l < m->hp.n_layers; l++) /* the base step's routing, over the MoE layers */
                        if (m->hp.layer_moe[l]) {
                            rmin = fmin(rmin, route[2 * l]);
                            rsum += route[2 * l];
                            rent += route[2 * l + 1];
                            nm++;
                        }
                    sg[0] = p1; sg[1] = p1 - p2; sg[2] = ent;
                    sg[3] = nm ? rmin : 0; sg[4] = nm ? rsum / nm : 0; sg[5] = nm ? rent / nm : 0;
                    memcpy(gate_buf + (size_t)j * V, l1, (size_t)V * sizeof(float));
                    moet_session_truncate(s, moet_session_pos(s) - 1, NULL, 0);
                    moet_session_use_delta(s, 1);
                    int erc = moet_session_eval(s, wt + j, 1, MOET_LOGITS_LAST, err, sizeof err);
                    moet_session_use_delta(s, 0);
                    if (!erc) memcpy(study_on + (size_t)j * V, moet_session_logits(s, NULL), (size_t)V * sizeof(float));
                    moet_session_truncate(s, moet_session_pos(s) - 1, NULL, 0); /* back to the base entry */
                    if (erc || moet_session_eval(s, wt + j, 1, MOET_LOGITS_LAST, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); goto out; }
                }
            }
            lg = gate_buf;
        }
        for (long j = 0; j + 1 < ctx; j++) {
            moet_log_softmax(lg + (size_t)j * V, V, logp);
            nll -= logp[wt[j + 1]];
            if (fs) {
                float rest;
                moet_kld_record(logp, V, kh.topk, scr_ids, rec_ids, rec_lp, &rest);
                if (fwrite(&rest, 4, 1, fs) != 1 || fwrite(rec_ids, 4, kh.topk, fs) != kh.topk ||
                    fwrite(rec_lp, 4, kh.topk, fs) != kh.topk) {
                    fprintf(stderr, "moet: error: writing %s failed\n", tmp_path);
                    goto out;
                }
            }
            if (fb) {
                float rest;
                if (fread(&rest, 4, 1, fb) != 1 || fread(rec_ids, 4, kh.topk, fb) != kh.topk ||
                    fread(rec_lp, 4, kh.topk, fb) != kh.topk) {
                    fprintf(stderr, "moet: error: %s is truncated\n", base);
                    goto out;
                }
                for (uint32_t k = 0; k < kh.topk; k++)
                    if (rec_ids[k] < 0 || rec_ids[k] >= V) { fprintf(stderr, "moet: error: %s is corrupt\n", base); goto out; }
                klds[n_scored] = moet_kld_eval(rec_ids, rec_lp, rest, kh.topk, logp, V, mark);
                if (study) {
                    float *lq = malloc((size_t)V * sizeof(float));
                    if (!lq) goto out;
                    moet_log_softmax(study_on + (size_t)j * V, V, lq);
                    double kon = moet_kld_eval(rec_ids, rec_lp, rest, kh.topk, lq, V, mark);
                    free(lq);
                    const double *sg = study_sig + j * STUDY_SIGS;
                    fprintf(study, "%zu,%ld,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n", w, j, sg[0], sg[1], sg[2], sg[3],
                            sg[4], sg[5], klds[n_scored], kon);
                }
                int32_t am = 0;
                for (int32_t k = 1; k < V; k++) if (logp[k] > logp[am]) am = k;
                agree += am == rec_ids[0];
            }
            n_scored++;
        }
        double el = moet_time_s() - t_eval;
        fprintf(stderr, "\rmoet: [%zu/%zu] ppl %.4f  %.0f tok/s", w + 1, n_win, exp(nll / (double)n_scored),
                (double)((w + 1) * (size_t)ctx) / el);
    }
    fprintf(stderr, "\n");
    if (fs) {
        if (fflush(fs) || fsync(fileno(fs)) || fclose(fs)) { fs = NULL; fprintf(stderr, "moet: error: writing %s\n", tmp_path); goto out; }
        fs = NULL;
        if (rename(tmp_path, save)) { fprintf(stderr, "moet: error: rename to %s failed\n", save); goto out; }
        tmp_path[0] = 0;
    }
    double ppl = exp(nll / (double)n_scored);
    char ecj[256] = ""; /* the expert cache's counts (--expert-slots), for the JSON */
    if (pmi.expert_slots) {
        int64_t ef, ee, er, eu, em;
        moet_model_expert_cache_stats(m, &ef, &ee, &er);
        moet_model_expert_cache_uses(m, &eu, &em);
        MOET_LOGI("expert cache (%ld slots, %s homes): %lld uses, %lld missed (hit rate %.4f), %lld fetched, %lld "
                  "evicted, %lld steps run again", (long)pmi.expert_slots, c.expert_pinned ? "pinned" : "mapped", (long long)eu,
                  (long long)em, eu ? 1.0 - (double)em / (double)eu : 0.0, (long long)ef, (long long)ee, (long long)er);
        snprintf(ecj, sizeof ecj, ", \"expert_slots\": %ld, \"expert_home\": \"%s\", \"cache_uses\": %lld, "
                 "\"cache_misses\": %lld, \"cache_fetched\": %lld, \"cache_replays\": %lld", (long)pmi.expert_slots,
                 c.expert_pinned ? "pinned" : "mapped", (long long)eu, (long long)em, (long long)ef, (long long)er);
    }
    if (base) {
        double sum = 0;
        for (size_t i = 0; i < n_scored; i++) sum += klds[i];
        qsort(klds, n_scored, sizeof(double), cmp_double);
        double mean = sum / (double)n_scored, med = quantile(klds, n_scored, 0.5), p99 = quantile(klds, n_scored, 0.99),
               mx = klds[n_scored - 1], top1 = (double)agree / (double)n_scored;
        if (json)
            printf("{\"ppl\": %.6f, \"tokens\": %zu, \"ctx\": %ld, \"chunks\": %zu, \"kld_mean\": %.6g, "
                   "\"kld_median\": %.6g, \"kld_p99\": %.6g, \"kld_max\": %.6g, \"top1_agree\": %.6f, "
                   "\"kld_topk\": %u, \"experts\": \"%s\", \"expert_bpw\": %.4g, \"weight_rel_err\": %.6g, "
                   "\"delta\": \"%s\", \"tau\": %.3g, \"gate_corrected\": %.6f, \"delta_pick\": %.4g, "
                   "\"delta_picks\": %.6f%s}\n",
                   ppl, n_scored, ctx, n_win, mean, med, p99, mx, top1, kh.topk, experts ? experts : "source",
                   qf >= 0 ? moet_qformat_bpw((moet_qformat)qf) : 16.0, rqs.rel_err, delta_mode, dmode == 2 ? tau : 0.0,
                   dmode == 2 ? (double)corrected / (double)n_scored : dmode == 1 || dmode == 3 ? 1.0 : 0.0, dpick,
                   dcount[1] ? (double)dcount[0] / (double)dcount[1] : 0.0, ecj);
        else
            printf("PPL %.4f over %zu tokens (%zu windows of %ld)\nKLD mean %.6f  median %.6f  p99 %.6f  max %.6f\n"
                   "top-1 agreement %.4f\n", ppl, n_scored, n_win, ctx, mean, med, p99, mx, top1);
    } else if (json) {
        printf("{\"ppl\": %.6f, \"tokens\": %zu, \"ctx\": %ld, \"chunks\": %zu, \"delta\": \"%s\", "
               "\"gate_corrected\": %.6f%s}\n", ppl, n_scored, ctx, n_win, delta_mode,
               dmode == 2 ? (double)corrected / (double)n_scored : dmode == 1 || dmode == 3 ? 1.0 : 0.0, ecj);
    } else {
        printf("PPL %.4f over %zu tokens (%zu windows of %ld)\n", ppl, n_scored, n_win, ctx);
    }
    rc = 0;
out:
    if (fs) fclose(fs);
    if (tmp_path[0]) remove(tmp_path);
    if (fb) fclose(fb);
    moet_session_free(s);
    free(toks);
    free(text);
    free(logp);
    free(scr_ids);
    free(rec_ids);
    free(rec_lp);
    free(klds);
    free(mark);
    free(gate_buf);
    free(study_on);
    free(study_sig);
    free(route);
    if (study) fclose(study);
    moet_model_free(m);
    return rc;
}
