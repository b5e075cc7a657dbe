/*
 * cmd_run.c — `moet run`: prompt in, generated text streamed to stdout token by token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "runtime/session_int.h"

static void usage(void) {
    fprintf(stderr,
            "usage: moet run [-m DIR] (-p TEXT | --prompt-ids \"1 2 3\") [-n N] [--temp T] [--seed S]\n"
            "                [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--ctx N]\n"
            "                [--print-ids] [--ignore-eos] [-t THREADS]\n"
            "                [--experts FORMAT [--calib TEXT]] [--delta off|on|gate|pick] [--tau T] [--delta-pick R]\n"
            "  --experts   quantize the routed experts in memory first (e.g. w2, w2+nvfp4: W2 with an NVFP4 delta)\n"
            "  --delta     with a delta: off (base only), on (base + delta), pick (base + delta on the picks of at\n"
            "              least R x the token's mean routing weight, R 0.8: the default for a delta pack), gate (each\n"
            "              step on the base, recomputed with the delta when its top-1 probability is below --tau, 0.6;\n"
            "              the default for a delta requantized in memory)\n");
}

int cmd_run(int argc, char **argv) {
    cli_common c = {0};
    const char *prompt = NULL, *prompt_ids = NULL;
    long n_gen = 64, ctx = 0;
    int print_ids = 0, ignore_eos = 0;
    const char *experts = NULL, *calib_file = NULL, *delta_mode = NULL;
    double tau = 0.6;
    moet_sampler_options so = moet_sampler_default_options();
    so.temperature = 0.8f;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v = NULL;
        double d;
        long l;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
#define BAD() do { fprintf(stderr, "moet run: bad value for %s: '%s'\n", a, v); return 2; } while (0)
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { VAL(); prompt = v; }
        else if (!strcmp(a, "--prompt-ids")) { VAL(); prompt_ids = v; }
        else if (!strcmp(a, "-n")) { VAL(); if (cli_parse_int(v, 0, 1 << 24, &n_gen)) BAD(); }
        else if (!strcmp(a, "--ctx")) { VAL(); if (cli_parse_int(v, 1, 1 << 24, &ctx)) BAD(); }
        else if (!strcmp(a, "--temp")) { VAL(); if (cli_parse_float(v, &d) || d < 0) BAD(); so.temperature = (float)d; }
        else if (!strcmp(a, "--seed")) { VAL(); so.seed = strtoull(v, NULL, 10); }
        else if (!strcmp(a, "--top-k")) { VAL(); if (cli_parse_int(v, 0, 1 << 24, &l)) BAD(); so.top_k = (int32_t)l; }
        else if (!strcmp(a, "--top-p")) { VAL(); if (cli_parse_float(v, &d)) BAD(); so.top_p = (float)d; }
        else if (!strcmp(a, "--min-p")) { VAL(); if (cli_parse_float(v, &d)) BAD(); so.min_p = (float)d; }
        else if (!strcmp(a, "--repeat-penalty")) { VAL(); if (cli_parse_float(v, &d)) BAD(); so.repetition_penalty = (float)d; }
        else if (!strcmp(a, "--experts")) { VAL(); experts = v; }
        else if (!strcmp(a, "--calib")) { VAL(); calib_file = v; }
        else if (!strcmp(a, "--delta")) { VAL(); delta_mode = v; }
        else if (!strcmp(a, "--tau")) { VAL(); if (cli_parse_float(v, &d) || d < 0 || d > 1) BAD(); tau = d; }
        else if (!strcmp(a, "--print-ids")) print_ids = 1;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else { fprintf(stderr, "moet run: unknown option '%s'\n", a); usage(); return 2; }
#undef VAL
#undef BAD
    }
    if (!prompt == !prompt_ids) {
        fprintf(stderr, "moet run: give exactly one of -p TEXT or --prompt-ids\n");
        usage();
        return 2;
    }
    moet_model *m = cli_load_model(&c);
    if (!m) return 1;
    int dmode = 0;  /* CLI_DELTA_* */
    long corrected = 0, steps = 0;
    if (experts) {
        int qf = moet_qformat_parse(experts);
        if (qf < 0) { fprintf(stderr, "moet run: unknown --experts format '%s'\n", experts); moet_model_free(m); return 2; }
        moet_matq_options qo = moet_matq_default_options((moet_qformat)qf);
        moet_requant_stats rqs = {0};
        if (cli_requant_experts(m, &qo, calib_file, 16384, c.threads, &rqs)) { moet_model_free(m); return 1; }
    }
    {
        moet_model_info mi;
        moet_model_info_get(m, &mi);
        if ((dmode = cli_delta_mode("run", delta_mode, &mi)) < 0) {
            moet_model_free(m);
            return 2;
        }
    }
    const moet_tokenizer *tok = moet_model_tokenizer(m);
    char err[512];
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    int rc = 1;
    moet_session *s = NULL;
    moet_sampler *smp = NULL;
    if (prompt_ids) {
        if (cli_parse_ids(prompt_ids, &ids, &n_prompt)) { fprintf(stderr, "moet run: bad --prompt-ids\n"); goto out; }
    } else if (moet_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n_prompt, err, sizeof err)) {
        fprintf(stderr, "moet: error: %s\n", err);
        goto out;
    }
    if (n_prompt == 0) { fprintf(stderr, "moet run: the prompt is empty\n"); goto out; }
    moet_model_info info;
    moet_model_info_get(m, &info);
    moet_session_options sopt = moet_session_default_options();
    sopt.n_candidates = 64; /* the step copies 64 candidates, the whole row only when the sampler needs it */
    sopt.kv_type = c.kv_type;
    sopt.n_ctx = ctx ? (int32_t)ctx : (int32_t)(n_prompt + (size_t)n_gen < (size_t)info.max_positions
                                                    ? n_prompt + (size_t)n_gen : (size_t)info.max_positions);
    if (moet_session_create(m, &sopt, &s, err, sizeof err) ||
        moet_sampler_create(&so, info.vocab_size, &smp, err, sizeof err)) {
        fprintf(stderr, "moet: error: %s\n", err);
        goto out;
    }
    size_t cap = n_prompt + (size_t)n_gen + 1;
    int32_t *hist = realloc(ids, cap * sizeof(int32_t));
    if (!hist) goto out;
    ids = hist;
    int32_t eos[8];
    int n_eos = ignore_eos ? 0 : moet_model_eos_ids(m, eos, 8);
    double t0 = moet_time_s();
    moet_session_use_delta(s, dmode == CLI_DELTA_ON || dmode == CLI_DELTA_PICK);
    if (cli_delta_pick(&c, s, dmode)) goto out;
    if (dmode == 2) {  /* the gate runs step by step, prompt tokens included (tau 0 = off, tau 1 = on, exactly) */
        for (size_t i = 0; i < n_prompt; i++) {
            int corr;
            if (moet_session_eval_gated(s, ids[i], (float)tau, &corr, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); goto out; }
            corrected += corr;
            steps++;
        }
    } else if (moet_session_eval(s, ids, (int32_t)n_prompt, MOET_LOGITS_LAST, err, sizeof err)) {
        fprintf(stderr, "moet: error: %s\n", err);
        goto out;
    }
    double t1 = moet_time_s();
    size_t n = n_prompt;
    long generated = 0;
    while (generated < n_gen) {
        const int32_t *cid;
        const float *cval;
        const int32_t kc = moet_session_candidates(s, &cid, &cval);
        int32_t next = kc > 0 ? moet_sampler_sample_candidates(smp, cid, cval, kc, ids, n) : -1;
        if (next < 0) next = moet_sampler_sample(smp, moet_session_logits(s, NULL), ids, n);
        int stop = 0;
        for (int k = 0; k < n_eos; k++) stop |= next == eos[k];
        if (stop) break;
        ids[n++] = next;
        if (print_ids) {
            printf("%s%d", generated ? " " : "", next);
        } else {
            char buf[256];
            int b = moet_tokenizer_token_bytes(tok, next, 0, buf, sizeof buf);
            if (b > 0) fwrite(buf, 1, (size_t)b, stdout);
        }
        fflush(stdout);
        if (++generated == n_gen) break;
        if (moet_session_pos(s) >= sopt.n_ctx) { MOET_LOGW("context full after %ld tokens", generated); break; }
        int corr = 0;
        if (dmode == 2 ? moet_session_eval_gated(s, next, (float)tau, &corr, err, sizeof err)
                       : moet_session_eval(s, &next, 1, MOET_LOGITS_LAST, err, sizeof err)) {
            fprintf(stderr, "moet: error: %s\n", err);
            goto out;
        }
        corrected += corr;
        steps += dmode == 2;
    }
    printf("\n");
    double t2 = moet_time_s();
    MOET_LOGI("prompt %zu tokens in %.3f s (%.1f t/s); generated %ld tokens in %.3f s (%.1f t/s)", n_prompt, t1 - t0,
              (double)n_prompt / (t1 - t0), generated, t2 - t1, generated > 0 ? (double)generated / (t2 - t1) : 0.0);
    if (info.expert_slots) {
        int64_t ef, ee, er, eu, em;
        moet_model_expert_cache_stats(m, &ef, &ee, &er);
        moet_model_expert_cache_uses(m, &eu, &em);
        MOET_LOGI("expert cache (%ld slots, %s homes): hit rate %.4f, %lld experts fetched, %lld evicted, %lld steps "
                  "run again", (long)info.expert_slots, c.expert_pinned ? "pinned" : "mapped",
                  eu ? 1.0 - (double)em / (double)eu : 0.0, (long long)ef, (long long)ee, (long long)er);
    }
    if (dmode == 2) MOET_LOGI("delta gate (tau %.2f): %ld of %ld steps corrected (%.1f%%)", tau, corrected, steps,
                              steps ? 100.0 * (double)corrected / (double)steps : 0.0);
    rc = 0;
out:
    moet_sampler_free(smp);
    moet_session_free(s);
    free(ids);
    moet_model_free(m);
    return rc;
}
