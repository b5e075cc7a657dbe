/*
 * cmd_bench.c — `moet bench`: llama-bench-style prefill (pp) and decode (tg) throughput, written as a table to
 * stdout and as JSON (commit, machine, date, peak RSS) to --json FILE.
 *
 * pp N: one eval of N prompt tokens from an empty cache. tg N: N single-token evals after a short prompt.
 * -d D (llama-bench's depth): both start with D tokens already in the cache (evaluated first, not timed), so a
 * test shows what a long conversation costs: the attention's reads grow with the context (the table's test column
 * says "pp512 @ d4096", the JSON has "depth").
 * Each figure is the median of --reps runs, after one untimed warm-up run of the same tests (as llama-bench does;
 * --no-warmup skips it): on a GPU the first run records the CUDA graphs of each decode shape and loads the kernels,
 * which made a 30b tg32 at depth 4096 run at 0.73x its second rep's speed when --reps 1 timed
 * it (an H100, stop 45). Token ids are a fixed pseudo-random sequence (speed does not depend
 * on which ids, only routing does, and real routing is measured by perplexity runs).
 * --synthetic SHAPE builds a model of a real shape with random weights in backend memory (model/synthetic.c);
 * --experts picks its expert format, --dense bf16|q8_0 its attention projections' and lm_head's; with --expert-slots N its experts are built in host memory and the device caches N
 * of them (the table's experts column says so; the JSON carries the experts fetched and steps run again over the
 * last rep's decode). For decode the JSON also carries the bytes one token reads (every dense weight,
 * k experts per layer, the router, lm_head, the KV cache) and that over the time per token (effective GB/s), which
 * docs/performance.md sets against the GPU's measured copy bandwidth.
 * -b 4,16: batched decode as a server runs it: B sessions after a short prompt each, tg steps of one forward over
 * the next token of all B (moet_batch_decode); reported as aggregate tokens/s ("tg128 b16").
 * Every decode step also picks its greedy next token, as a client does (the ids fed stay the fixed sequence): from
 * the k candidates the backend kept (--candidates k, default 64: moet_session_options.n_candidates) or, with
 * --candidates 0, from the whole logit row copied to the host (what every step cost before candidates existed).
 * A model with its FP4 delta as residuals (a synthetic --experts w2+nvfp4 one, or a pack with its delta pack) runs
 * base + delta every step (the JSON's delta_pick says on which picks).
 * --gate TAU (a model with the FP4 delta: --experts w2+nvfp4 for a synthetic one): every decode step goes through the
 * confidence gate (moet_session_eval_gated): base experts, then base + delta again where the top-1 probability is
 * below TAU; the JSON counts the corrected steps. A tiny TAU times the gate's own cost (its confidence from the
 * candidates' lz, or with --candidates 0 from the whole row). --delta-pick R (docs/quality.md): the delta only on the
 * picks of at least R times the token's mean routing weight; the bytes a token count the residuals of the picks that
 * took them where the backend counts them (the CPU: "delta_picks" in the JSON), else of every pick (an upper bound:
 * how many picks pass depends on the router; "delta_picks" -1).
 * The JSON's "env" records the MOET_* settings of the run (kernel options such as MOET_MOE_X1 change what is timed),
 * so an A/B's files say what each measured without their names having to.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/util.h"
#include "model/model.h"
#include "quant/matq.h"
#include "quant/types.h"
#include "runtime/session_int.h"

extern char **environ;

/* The MOET_* environment (but MOET_COMMIT, the JSON's "commit") as a JSON object into buf: names and values escaped
 * as JSON strings; a setting that would not fit is left out, never cut. */
static void bench_env_json(char *buf, size_t cap) {
    size_t n = 0;
    int first = 1;
    buf[n++] = '{';
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "MOET_", 5) || !strncmp(*e, "MOET_COMMIT=", 12) || !eq) continue;
        char item[640];
        size_t k = 0;
        int ok = 1;
        if (!first) item[k++] = ',';
        item[k++] = '"';
        for (const char *c = *e; *c; c++) {
            if (k + 8 >= sizeof item) { ok = 0; break; }
            const unsigned char u = (unsigned char)*c;
            if (c == eq) { memcpy(item + k, "\": \"", 4); k += 4; }
            else if (u == '"' || u == '\\') { item[k++] = '\\'; item[k++] = (char)u; }
            else if (u < 0x20 || u >= 0x7f) k += (size_t)snprintf(item + k, sizeof item - k, "\\u%04x", u);
            else item[k++] = (char)u;
        }
        if (!ok) continue;
        item[k++] = '"';
        if (n + k + 2 >= cap) continue;
        memcpy(buf + n, item, k);
        n += k;
        first = 0;
    }
    buf[n++] = '}';
    buf[n] = 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void cpu_name(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = 0;
                snprintf(buf, cap, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

/* The greedy next token of a session's last row (s) or a batch's row i: its first candidate, or the argmax of the
 * whole row copied to the host where there are none (--candidates 0). */
static int32_t bench_greedy(const moet_session *s, const moet_batch *b, int32_t i, int32_t V) {
    const int32_t *ids;
    if ((s ? moet_session_candidates(s, &ids, NULL) : moet_batch_candidates(b, i, &ids, NULL)) > 0) return ids[0];
    const float *l = s ? moet_session_logits(s, NULL) : moet_batch_logits(b, i);
    int32_t best = 0;
    for (int32_t k = 1; k < V; k++)
        if (l[k] > l[best]) best = k;
    return best;
}

int cmd_bench(int argc, char **argv) {
    cli_common c = {0};
    long pp = 512, tg = 128, reps = 3, cands = 64, depth = 0, warmup = 1;
    double gate = -1; /* --gate TAU: decode through the confidence gate (< 0: off) */
    int32_t picked = 0; /* the greedy picks, folded so they are not optimised away (logged at the end) */
    const char *threads = "1,2", *json_path = NULL, *synthetic = NULL, *experts = "w2", *batches = NULL;
    int dense_q8 = 0; /* --dense q8_0: a synthetic model's attention projections and lm_head as Q8_0 */
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-p")) { VAL(); if (cli_parse_int(v, 0, 1 << 20, &pp)) return 2; }
        else if (!strcmp(a, "-n")) { VAL(); if (cli_parse_int(v, 0, 1 << 20, &tg)) return 2; }
        else if (!strcmp(a, "-d") || !strcmp(a, "--depth")) { VAL(); if (cli_parse_int(v, 0, 1 << 20, &depth)) return 2; }
        else if (!strcmp(a, "--reps")) { VAL(); if (cli_parse_int(v, 1, 100, &reps)) return 2; }
        else if (!strcmp(a, "--no-warmup")) warmup = 0;
        else if (!strcmp(a, "--threads-list") || !strcmp(a, "-T")) { VAL(); threads = v; }
        else if (!strcmp(a, "--json")) { VAL(); json_path = v; }
        else if (!strcmp(a, "--synthetic")) { VAL(); synthetic = v; }
        else if (!strcmp(a, "--experts")) { VAL(); experts = v; }
        else if (!strcmp(a, "--dense")) {
            VAL();
            if (strcmp(v, "bf16") && strcmp(v, "q8_0")) { fprintf(stderr, "moet bench: --dense bf16|q8_0\n"); return 2; }
            dense_q8 = !strcmp(v, "q8_0");
        }
        else if (!strcmp(a, "-b")) { VAL(); batches = v; }
        else if (!strcmp(a, "--candidates")) { VAL(); if (cli_parse_int(v, 0, 64, &cands)) return 2; }
        else if (!strcmp(a, "--gate")) {
            VAL();
            char *end;
            gate = strtod(v, &end);
            if (*end || !(gate >= 0 && gate <= 1)) { fprintf(stderr, "moet bench: --gate TAU in [0, 1]\n"); return 2; }
        }
        else { fprintf(stderr, "moet bench: unknown option '%s'\n", a); return 2; }
#undef VAL
    }
    if (c.threads) {
        static char one[16];
        snprintf(one, sizeof one, "%d", c.threads);
        threads = one;
    }
    char cpu[256], date[64];
    cpu_name(cpu, sizeof cpu);
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    struct utsname un;
    uname(&un);
    const char *model_path = synthetic ? synthetic : c.model ? c.model : MOET_DEFAULT_MODEL_DIR;
    int qf = moet_qformat_parse(experts);
    if (qf < 0) { fprintf(stderr, "moet bench: unknown --experts '%s'\n", experts); return 2; }
    char gpu[192] = "";
    char results[8192];
    size_t ro = 0;
    results[0] = 0;
    printf("| model | size | params | experts | backend | threads | test | t/s | GB/s |\n|---|---|---|---|---|---|---|---|---|\n");
    const char *p = threads;
    int first = 1;
    while (*p) {
        long nt;
        char tbuf[16];
        size_t l = strcspn(p, ",");
        snprintf(tbuf, sizeof tbuf, "%.*s", (int)(l < 15 ? l : 15), p);
        p += l + (p[l] == ',');
        if (cli_parse_int(tbuf, 1, 1024, &nt)) { fprintf(stderr, "moet bench: bad thread count '%s'\n", tbuf); return 2; }
        cli_common cc = c;
        cc.threads = (int)nt;
        moet_model *m = NULL;
        char err[512];
        if (synthetic) {
            moet_model_options mo = moet_model_default_options();
            mo.n_threads = cc.threads;
            mo.device = cc.device;
            mo.expert_slots = cc.expert_slots; /* experts in host memory, the device caching that many */
            mo.expert_slots_gib = cc.expert_slots_gib;
            mo.expert_reserve_gib = cc.expert_reserve_gib;
            mo.expert_pinned = cc.expert_pinned;
            double tb = moet_time_s();
            if (moet_model_synthetic(synthetic, moet_qformat_type((moet_qformat)qf), qf == MOET_QF_W2_NVFP4,
                                     dense_q8 ? MOET_TYPE_Q8_0 : MOET_TYPE_BF16, &mo, &m,
                                     err, sizeof err)) {
                fprintf(stderr, "moet: error: %s\n", err);
                return 1;
            }
            fprintf(stderr, "moet: synthetic %s built in %.1f s\n", synthetic, moet_time_s() - tb);
        } else if (!(m = cli_load_model(&cc))) {
            return 1;
        }
        moet_model_info info;
        moet_model_info_get(m, &info);
        int on_gpu = strcmp(info.backend, "cpu") != 0;
        if (on_gpu) snprintf(gpu, sizeof gpu, "%s", info.device);
        /* bytes one decode token reads: dense weights, k experts per MoE layer, the KV cache at mid-run */
        const moet_hparams *hp = &m->hp;
        double tok_bytes = (double)m->output.row_bytes * m->output.rows + (double)m->tok_embd.row_bytes;
        double tok_delta = 0; /* of those, the residuals' (every pick: scaled below where the picks are counted) */
        for (int li = 0; li < hp->n_layers; li++) {
            const moet_layer *L = &m->layers[li];
            const moet_weight *dw[4] = {&L->wq, &L->wk, &L->wv, &L->wo};
            for (int k = 0; k < 4; k++) tok_bytes += (double)dw[k]->row_bytes * dw[k]->rows;
            if (L->is_moe) {
                tok_bytes += (double)L->router.row_bytes * L->router.rows;
                if (L->sh_gate.data) /* the shared expert */
                    tok_bytes += (double)L->sh_gate.row_bytes * L->sh_gate.rows * 2 + (double)L->sh_down.row_bytes * L->sh_down.rows;
                tok_bytes += (double)hp->n_experts_used * ((double)L->exp_gate[0].row_bytes * L->exp_gate[0].rows * 2 +
                                                           (double)L->exp_down[0].row_bytes * L->exp_down[0].rows);
                if (L->dres_gate && gate < 0) /* the delta on: every step reads the residuals too */
                    tok_delta += (double)hp->n_experts_used * ((double)L->dres_gate[0].row_bytes * L->dres_gate[0].rows * 2 +
                                                               (double)L->dres_down[0].row_bytes * L->dres_down[0].rows);
            } else {
                tok_bytes += (double)L->gate.row_bytes * L->gate.rows * 2 + (double)L->down.row_bytes * L->down.rows;
            }
        }
        moet_session_options so = moet_session_default_options();
        so.n_candidates = (int32_t)cands;
        so.kv_type = c.kv_type;
        so.n_ctx = (int32_t)(depth + pp + tg + 8);
        so.n_batch = pp > 0 ? (int32_t)(pp < 512 ? pp : 512) : 256;
        moet_session *s;
        if (moet_session_create(m, &so, &s, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); moet_model_free(m); return 1; }
        const int32_t kvt = moet_session_kv_type(s); /* the cache's keys and values a layer, as the tg steps read them */
        tok_bytes += (double)hp->n_layers * 2.0 * (double)(depth + 4 + tg / 2) * hp->n_kv_heads * hp->head_dim *
                     (kvt == MOET_KV_F16 ? 2 : 4);
        /* a delta as residuals (a synthetic w2+nvfp4 model, or a pack with its delta pack): every step base + delta
         * (on its picks with --delta-pick), or through the gate with --gate */
        const int has_res = (synthetic && qf == MOET_QF_W2_NVFP4) || info.delta_residual;
        if (has_res && gate < 0) moet_session_use_delta(s, 1);
        const int bdm = has_res ? (gate < 0 ? 1 : 2) : 0; /* the delta: on, gate, none */
        if (cli_delta_pick(&c, s, bdm)) { moet_session_free(s); moet_model_free(m); return 1; }
        const double dpick = bdm ? moet_session_delta_pick(s) : 0.0;
        /* the picks that took the residual, counted where the backend counts them (the CPU); elsewhere tok_bytes
         * keeps the residual of every pick: an upper bound where dpick > 0 */
        int64_t dcount[2] = {0, 0};
        if (bdm == 1 && dpick > 0 && !on_gpu) moet_session_set_delta_count(s, dcount);
        long corrected = 0; /* --gate: steps of the last rep redone on base + delta */
        const long nid = depth + pp + tg + 8;
        int32_t *ids = malloc((size_t)nid * sizeof(int32_t));
        for (long i = 0; i < nid; i++) ids[i] = (int32_t)((i * 7919 + 13) % info.vocab_size);
        double tpp[100], ttg[100];
        int64_t ec0[5] = {0}, ec1[5] = {0}; /* expert cache counts around the last rep's tg steps (+ uses, misses) */
        for (long r = warmup ? -1 : 0; r < reps; r++) { /* r -1: the warm-up, not recorded */
            moet_session_truncate(s, 0, NULL, 0);
            int erc = 0;
            if (depth > 0 && pp > 0) erc |= moet_session_eval(s, ids, (int32_t)depth, MOET_LOGITS_LAST, err, sizeof err);
            double t0 = moet_time_s();
            if (pp > 0 && !erc) erc |= moet_session_eval(s, ids + depth, (int32_t)pp, MOET_LOGITS_LAST, err, sizeof err);
            double t1 = moet_time_s();
            const double rpp = pp > 0 ? (double)pp / (t1 - t0) : 0;
            moet_session_truncate(s, 0, NULL, 0);
            if (!erc) erc |= moet_session_eval(s, ids, (int32_t)(depth + 4), MOET_LOGITS_LAST, err, sizeof err);
            moet_model_expert_cache_stats(m, &ec0[0], &ec0[1], &ec0[2]);
            moet_model_expert_cache_uses(m, &ec0[3], &ec0[4]);
            t0 = moet_time_s();
            corrected = 0;
            for (long i = 0; i < tg && !erc; i++) {
                int corr = 0;
                if (gate >= 0) erc |= moet_session_eval_gated(s, ids[depth + 4 + i], (float)gate, &corr, err, sizeof err);
                else erc |= moet_session_eval(s, ids + depth + 4 + i, 1, MOET_LOGITS_LAST, err, sizeof err);
                corrected += corr;
                if (!erc) picked ^= bench_greedy(s, NULL, 0, info.vocab_size);
            }
            if (erc) {
                fprintf(stderr, "moet: error: %s\n", err);
                free(ids);
                moet_session_free(s);
                moet_model_free(m);
                return 1;
            }
            t1 = moet_time_s();
            const double rtg = tg > 0 ? (double)tg / (t1 - t0) : 0;
            if (r < 0) {
                fprintf(stderr, "moet: bench threads %ld warm-up: pp %.1f t/s, tg %.1f t/s (not counted)\n", nt, rpp, rtg);
                continue;
            }
            tpp[r] = rpp;
            ttg[r] = rtg;
            moet_model_expert_cache_stats(m, &ec1[0], &ec1[1], &ec1[2]);
            moet_model_expert_cache_uses(m, &ec1[3], &ec1[4]);
            fprintf(stderr, "moet: bench threads %ld rep %ld/%ld: pp %.1f t/s, tg %.1f t/s\n", nt, r + 1, reps, tpp[r], ttg[r]);
            if (gate >= 0)
                fprintf(stderr, "moet: gate tau %g: %ld of %ld decode steps redone on base + delta\n", gate, corrected, tg);
            if (info.expert_slots)
                fprintf(stderr, "moet: expert cache over the tg%ld steps: hit rate %.4f, %lld experts fetched, %lld "
                        "evicted, %lld steps run again\n", tg,
                        ec1[3] > ec0[3] ? 1.0 - (double)(ec1[4] - ec0[4]) / (double)(ec1[3] - ec0[3]) : 0.0,
                        (long long)(ec1[0] - ec0[0]), (long long)(ec1[1] - ec0[1]), (long long)(ec1[2] - ec0[2]));
        }
        qsort(tpp, (size_t)reps, sizeof(double), cmp_d);
        qsort(ttg, (size_t)reps, sizeof(double), cmp_d);
        const double dshare = dcount[1] > 0 ? (double)dcount[0] / (double)dcount[1] : -1.0; /* -1: not counted */
        moet_session_set_delta_count(s, NULL);
        tok_bytes += tok_delta * (dshare >= 0 ? dshare : 1.0);
        double mpp = tpp[reps / 2], mtg = ttg[reps / 2];
        const char *name = strrchr(model_path, '/') ? strrchr(model_path, '/') + 1 : model_path;
        double mib = (double)info.weight_bytes / (1 << 20);
        char exb[96];
        const char *ex = synthetic ? experts : "as stored";
        const long slots = (long)info.expert_slots; /* resolved (--expert-slots XG: from the expert size) */
        if (slots || dense_q8) { /* the expert cache's slots, Q8_0 projections: in the experts column */
            char sl[48] = "";
            if (slots) snprintf(sl, sizeof sl, ", %ld slots%s", slots, c.expert_pinned ? " pinned" : "");
            snprintf(exb, sizeof exb, "%s%s%s", ex, dense_q8 ? ", dense q8_0" : "", sl);
            ex = exb;
        }
        char size[32];
        if (mib >= 1024) snprintf(size, sizeof size, "%.2f GiB", mib / 1024); else snprintf(size, sizeof size, "%.1f MiB", mib);
        char dl[48] = ""; /* " @ d4096": the tests' depth */
        if (depth > 0) snprintf(dl, sizeof dl, " @ d%ld", depth);
        if (kvt == MOET_KV_F16) snprintf(dl + strlen(dl), sizeof dl - strlen(dl), " kv f16");
        if (dpick > 0) snprintf(dl + strlen(dl), sizeof dl - strlen(dl), " pick %g", dpick);
        if (pp > 0) printf("| %s | %s | %.2fB | %s | %s | %ld | pp%ld%s | %.1f | |\n", name, size, (double)info.n_params / 1e9, ex, info.backend, nt, pp, dl, mpp);
        char tgl[64];
        if (gate >= 0) snprintf(tgl, sizeof tgl, "tg%ld%s gate %g", tg, dl, gate); else snprintf(tgl, sizeof tgl, "tg%ld%s", tg, dl);
        if (tg > 0) printf("| %s | %s | %.2fB | %s | %s | %ld | %s | %.1f | %.0f |\n", name, size, (double)info.n_params / 1e9, ex, info.backend, nt, tgl, mtg, tok_bytes * mtg / 1e9);
        fflush(stdout);
        ro += (size_t)snprintf(results + ro, sizeof results - ro,
                               "%s\n    {\"backend\": \"%s\", \"device\": \"%s\", \"experts\": \"%s\", \"threads\": %ld, "
                               "\"depth\": %ld, \"kv_type\": \"%s\", \"pp\": %ld, \"pp_tps\": %.2f, \"tg\": %ld, \"tg_tps\": %.2f, "
                               "\"tg_bytes_per_token\": %.0f, "
                               "\"tg_gbps\": %.1f, \"weight_bytes\": %lld, \"n_params\": %lld, \"expert_slots\": %ld, "
                               "\"expert_home\": \"%s\", \"tg_experts_fetched\": %lld, \"tg_steps_replayed\": %lld, "
                               "\"tg_expert_uses\": %lld, \"tg_expert_misses\": %lld, \"tg_gate_tau\": %g, "
                               "\"tg_gate_corrected\": %ld, \"delta\": \"%s\", \"delta_pick\": %g, \"delta_picks\": %.4f}",
                               first ? "" : ",", info.backend, info.device, ex, nt, depth, cli_kv_type_name(kvt), pp, mpp, tg, mtg, tok_bytes,
                               tok_bytes * mtg / 1e9, (long long)info.weight_bytes, (long long)info.n_params,
                               slots, c.expert_pinned ? "pinned" : "mapped", (long long)(ec1[0] - ec0[0]),
                               (long long)(ec1[2] - ec0[2]), (long long)(ec1[3] - ec0[3]), (long long)(ec1[4] - ec0[4]),
                               gate, gate >= 0 ? corrected : 0L, bdm == 2 ? "gate" : bdm ? "on" : "off", dpick, dshare);
        first = 0;
        for (const char *bp = batches; bp && *bp && tg > 0;) {  /* batched decode */
            long B;
            char bb[16];
            size_t bl = strcspn(bp, ",");
            snprintf(bb, sizeof bb, "%.*s", (int)(bl < 15 ? bl : 15), bp);
            bp += bl + (bp[bl] == ',');
            if (cli_parse_int(bb, 1, 256, &B)) { fprintf(stderr, "moet bench: bad -b entry '%s'\n", bb); break; }
            moet_session **ss = calloc((size_t)B, sizeof *ss);
            int32_t *tok = malloc((size_t)B * sizeof(int32_t));
            moet_batch *bt = NULL;
            moet_session_options bo = moet_session_default_options();
            bo.n_ctx = (int32_t)(tg + 16);
            bo.kv_type = c.kv_type;
            int erc = !ss || !tok || moet_batch_create(m, (int32_t)B, bo.n_ctx, &bt, err, sizeof err);
            bo.n_candidates = (int32_t)cands;
            for (long i = 0; i < B && !erc; i++) {
                erc = moet_session_create(m, &bo, &ss[i], err, sizeof err);
                if (!erc && has_res) {
                    moet_session_use_delta(ss[i], 1);
                    erc = cli_delta_pick(&c, ss[i], 1);
                    if (erc) snprintf(err, sizeof err, "--delta-pick");
                }
                erc = erc || moet_session_eval(ss[i], ids + i % 8, 4, MOET_LOGITS_LAST, err, sizeof err);
            }
            double tb[100];
            for (long r = warmup ? -1 : 0; r < reps && !erc; r++) { /* r -1: the warm-up, not recorded */
                for (long i = 0; i < B; i++) moet_session_truncate(ss[i], 4, NULL, 0);
                double t0 = moet_time_s();
                for (long st = 0; st < tg && !erc; st++) {
                    for (long i = 0; i < B; i++) tok[i] = ids[(4 + st + 3 * i) % (pp + tg + 8)];
                    erc = moet_batch_decode(bt, ss, tok, (int32_t)B, err, sizeof err);
                    for (long i = 0; i < B && !erc; i++) picked ^= bench_greedy(NULL, bt, (int32_t)i, info.vocab_size);
                }
                const double rb = (double)B * (double)tg / (moet_time_s() - t0);
                if (r < 0) {
                    fprintf(stderr, "moet: bench batched b=%ld warm-up: %.1f t/s (not counted)\n", B, rb);
                    continue;
                }
                tb[r] = rb;
                fprintf(stderr, "moet: bench batched b=%ld rep %ld/%ld: %.1f t/s\n", B, r + 1, reps, tb[r]);
            }
            if (erc) {
                fprintf(stderr, "moet: batched decode b=%ld: %s\n", B, err);
            } else {
                qsort(tb, (size_t)reps, sizeof(double), cmp_d);
                printf("| %s | %s | %.2fB | %s | %s | %ld | tg%ld b%ld | %.1f | |\n", name, size, (double)info.n_params / 1e9,
                       ex, info.backend, nt, tg, B, tb[reps / 2]);
                fflush(stdout);
                ro += (size_t)snprintf(results + ro, sizeof results - ro,
                                       ",\n    {\"backend\": \"%s\", \"device\": \"%s\", \"experts\": \"%s\", \"threads\": %ld, "
                                       "\"tg\": %ld, \"batch\": %ld, \"batched_tps\": %.2f, \"weight_bytes\": %lld, \"n_params\": %lld}",
                                       info.backend, info.device, ex, nt, tg, B, tb[reps / 2], (long long)info.weight_bytes,
                                       (long long)info.n_params);
            }
            for (long i = 0; ss && i < B; i++) moet_session_free(ss[i]);
            moet_batch_free(bt);
            free(ss);
            free(tok);
        }
        free(ids);
        moet_session_free(s);
        moet_model_free(m);
        if (on_gpu) break; /* thread counts are a CPU matter */
    }
    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f) { fprintf(stderr, "moet: cannot write %s\n", json_path); return 1; }
        char envj[4096];
        bench_env_json(envj, sizeof envj);
        fprintf(f, "{\n  \"tool\": \"moet bench\",\n  \"commit\": \"%s\",\n  \"date\": \"%s\",\n"
                   "  \"machine\": {\"cpu\": \"%s\", \"cores\": %ld, \"os\": \"%s %s\", \"arch\": \"%s\", \"gpu\": \"%s\"},\n"
                   "  \"model\": \"%s\",\n  \"reps\": %ld,\n  \"warmup\": %ld,\n  \"candidates\": %ld,\n  \"env\": %s,\n"
                   "  \"peak_rss_bytes\": %llu,\n  \"results\": [%s\n  ]\n}\n",
                cli_git_commit(), date, cpu, sysconf(_SC_NPROCESSORS_ONLN), un.sysname, un.release, un.machine, gpu,
                model_path, reps, warmup, cands, envj, (unsigned long long)moet_peak_rss_bytes(), results);
        fclose(f);
        fprintf(stderr, "moet: wrote %s\n", json_path);
    }
    fprintf(stderr, "moet: bench greedy picks folded: %d\n", (int)picked);
    return 0;
}
