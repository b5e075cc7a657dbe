/*
 * cmd_quantize.c — `moet quantize`: a Hugging Face checkpoint in, a moet pack (GGUF v3) out, routed experts in the
 * chosen format, calibrated on --calib text (activation statistics per expert) unless --no-calib.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "model/model.h"
#include "model/delta.h"
#include "model/pack.h"
#include "quant/calib.h"

static void usage(void) {
    fprintf(stderr, "usage: moet quantize -m HF_DIR -o OUT.gguf [--experts w2|w2+nvfp4|int2|asym2|sym2|nvfp4|mxfp4|q8_0|bf16]\n"
                    "                     [--delta-out OUT.delta.gguf] [--dense bf16|q8_0] [--calib TEXT_FILE[.xz] | --no-calib]\n"
                    "                     [--calib-tokens N]\n"
                    "  w2+nvfp4 (or w2 with --delta-out): the W2 base in OUT.gguf, the NVFP4 residual in the delta pack\n"
                    "  (default OUT.delta.gguf), loaded beside the pack by every command for --delta pick|on|gate\n"
                    "                     [--group 32] [--no-rotate] [--no-gptq] [--no-search] [-t THREADS]\n");
}

int cmd_quantize(int argc, char **argv) {
    cli_common c = {0};
    const char *out = NULL, *fmt = "w2", *calib = NULL, *dense = "bf16", *delta_out = NULL;
    long calib_tokens = 16384, group = 32;
    int no_calib = 0, no_rotate = 0, no_gptq = 0, no_search = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-o")) { VAL(); out = v; }
        else if (!strcmp(a, "--experts")) { VAL(); fmt = v; }
        else if (!strcmp(a, "--dense")) { VAL(); dense = v; }
        else if (!strcmp(a, "--calib")) { VAL(); calib = v; }
        else if (!strcmp(a, "--no-calib")) no_calib = 1;
        else if (!strcmp(a, "--calib-tokens")) { VAL(); if (cli_parse_int(v, 1, 1L << 40, &calib_tokens)) return 2; }
        else if (!strcmp(a, "--group")) { VAL(); if (cli_parse_int(v, 1, 1 << 20, &group)) return 2; }
        else if (!strcmp(a, "--delta-out")) { VAL(); delta_out = v; }
        else if (!strcmp(a, "--no-rotate")) no_rotate = 1;
        else if (!strcmp(a, "--no-gptq")) no_gptq = 1;
        else if (!strcmp(a, "--no-search")) no_search = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else { fprintf(stderr, "moet quantize: unknown option '%s'\n", a); usage(); return 2; }
#undef VAL
    }
    if (!out || !c.model) { usage(); return 2; }
    int qf = moet_qformat_parse(fmt);
    if (qf == MOET_QF_W2 && delta_out) qf = MOET_QF_W2_NVFP4;
    if (qf < 0 || qf == MOET_QF_W2_W2) {
        fprintf(stderr, "moet quantize: unknown expert format '%s'%s\n", fmt, qf < 0 ? "" : " (w2+w2 is in-memory only)");
        return 2;
    }
    if (delta_out && qf != MOET_QF_W2_NVFP4) { fprintf(stderr, "moet quantize: --delta-out needs --experts w2 or w2+nvfp4\n"); return 2; }
    char dpath[4096];
    if (qf == MOET_QF_W2_NVFP4 && !delta_out) {
        if (moet_delta_default_path(out, dpath, sizeof dpath)) { fprintf(stderr, "moet quantize: output path too long\n"); return 2; }
        delta_out = dpath;
    }
    if (strcmp(dense, "bf16") && strcmp(dense, "q8_0")) {
        fprintf(stderr, "moet quantize: --dense bf16 (dense tensors as stored) or q8_0 (projections and lm_head as Q8_0)\n");
        return 2;
    }
    if (group != 32) { fprintf(stderr, "moet quantize: --group %ld: the formats use groups of 32 (NVFP4: 16)\n", group); return 2; }
    if (!calib && !no_calib && (qf == MOET_QF_W2 || qf == MOET_QF_W2_NVFP4)) {
        fprintf(stderr, "moet quantize: W2 needs calibration text (--calib FILE) or an explicit --no-calib\n");
        return 2;
    }
    double t0 = moet_time_s();
    moet_model *m = cli_load_model(&c);
    if (!m) return 1;
    char err[1024];
    moet_calib *cal = NULL;
    int rc = 1;
    if (calib && !no_calib) {
        char *txt;
        size_t len;
        if (cli_read_text(calib, &txt, &len, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); goto done; }
        cal = moet_calib_create(m);
        int crc = cal ? moet_calib_run(m, cal, txt, len, 512, calib_tokens, err, sizeof err) : MOET_ENOMEM;
        free(txt);
        if (crc) { fprintf(stderr, "moet: error: calibration: %s\n", cal ? err : "out of memory"); goto done; }
    }
    moet_pack_options po = {.q = moet_matq_default_options((moet_qformat)qf), .calib = cal, .n_threads = c.threads,
                            .dense_q8 = !strcmp(dense, "q8_0"), .delta_path = delta_out};
    po.q.rotate = !no_rotate;
    po.q.gptq = !no_gptq;
    po.q.search = !no_search;
    if (moet_pack_write(m, c.model, out, &po, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); goto done; }
    MOET_LOGI("wrote %s (experts %s, %.2f bpw)%s%s in %.1f s", out, qf == MOET_QF_W2_NVFP4 ? "w2" : fmt,
              moet_qformat_bpw(qf == MOET_QF_W2_NVFP4 ? MOET_QF_W2 : (moet_qformat)qf), delta_out ? " and its NVFP4 delta " : "",
              delta_out ? delta_out : "", moet_time_s() - t0);
    rc = 0;
done:
    moet_calib_free(cal);
    moet_model_free(m);
    return rc;
}
