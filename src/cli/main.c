/*
 * main.c — `moet <command>`: dispatch and the helpers every subcommand shares.
 * Results go to stdout, logs and progress to stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "quant/calib.h"
#include "runtime/session_int.h"

void cli_usage(FILE *f) {
    fprintf(f,
            "moet " MOET_VERSION_STRING " — Mixture-of-Experts inference\n\n"
            "usage: moet <command> [options]\n\n"
            "commands:\n"
            "  run         generate text:   moet run [-m DIR] -p TEXT [-n N] [--temp T] [--seed S]\n"
            "  tokenize    print token ids: moet tokenize [-m DIR] TEXT\n"
            "  perplexity  PPL / KLD:       moet perplexity [-m DIR] -f FILE [--ctx 512] [--chunks N]\n"
            "                               [--save-logits F | --kld-base F] [--json]\n"
            "  bench       speed:           moet bench [-m DIR | --synthetic SHAPE] [-p 512] [-n 128] [-d 0] [-t 1,2]\n"
            "                               [--experts w2] [--gate TAU] [--reps 3] [--no-warmup] [--json FILE]\n"
            "                               (SHAPE: qwen3-30b-a3b, qwen3-235b-a22b, glm-4.5-air)\n"
            "  inspect     model summary:   moet inspect [-m DIR]\n"
            "  quantize    write a pack:    moet quantize -m HF_DIR -o OUT.gguf [--experts w2] [--calib TEXT]\n"
            "  serve       OpenAI API:      moet serve [-m DIR] [--host 127.0.0.1] [--port 8000] [--api-key KEY]\n"
            "                               [--max-seqs N] [--ctx N] [--queue N] [--timeout S]\n\n"
            "common options: -m DIR|PACK (Hugging Face checkpoint dir or moet pack; default: the embedded %s),\n"
            "                -t N (threads), --device cpu|cuda[:N] (default: cuda when a GPU is there), -v,\n"
            "                --expert-slots N|XG|auto (routed experts resident at once, or as many as X GiB hold; the\n"
            "                  rest fetched on a miss; 0: all; auto: all when the model fits the device, else what fits)\n"
            "                --expert-reserve G (auto: device GiB left free for KV caches and activations; default\n"
            "                  10%% of the device, at least 2)\n"
            "                --expert-home pinned|mapped (with slots: the others in pinned host RAM, or where the\n"
            "                  model maps them: page cache or the pack file; default mapped)\n"
            "                --kv-type f32|f16 (the KV cache's elements; f16: half the memory and attention bytes;\n"
            "                  default f16 on CUDA, f32 on the CPU)\n"
            "                --delta-pick R (--delta pick|on|gate with a delta pack: the delta only for a token's routed\n"
            "                  experts whose routing weight is at least R times the mean of its picks; 0: every pick;\n"
            "                  default 0.8 with --delta pick, the default mode for a delta pack)\n"
            "supported architectures: %s\n",
            MOET_DEFAULT_MODEL_DIR, moet_model_supported_architectures());
}

const char *cli_kv_type_name(int type) {
    return type == MOET_KV_F16 ? "f16" : type == MOET_KV_F32 ? "f32" : "auto";
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "moet: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_parse_int(const char *s, long lo, long hi, long *out) {
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (errno || e == s || *e || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cli_parse_float(const char *s, double *out) {
    char *e;
    errno = 0;
    double v = strtod(s, &e);
    if (errno || e == s || *e) return -1;
    *out = v;
    return 0;
}

int cli_common_arg(cli_common *c, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!(c->model = cli_value(argc, argv, i))) return -1;
        return 1;
    }
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        const char *v = cli_value(argc, argv, i);
        long n;
        if (!v || cli_parse_int(v, 1, 1024, &n)) {
            fprintf(stderr, "moet: -t needs a thread count in [1, 1024]\n");
            return -1;
        }
        c->threads = (int)n;
        return 1;
    }
    if (!strcmp(a, "--delta-pick")) {
        const char *v = cli_value(argc, argv, i);
        if (!v || cli_parse_float(v, &c->delta_pick) || !(c->delta_pick >= 0 && c->delta_pick <= 1e6)) {
            fprintf(stderr, "moet: --delta-pick needs a number >= 0 (0: the delta on every pick)\n");
            return -1;
        }
        c->delta_pick_set = 1;
        return 1;
    }
    if (!strcmp(a, "--delta-file")) {
        if (!(c->delta_file = cli_value(argc, argv, i))) return -1;
        return 1;
    }
    if (!strcmp(a, "--device")) {
        if (!(c->device = cli_value(argc, argv, i))) return -1;
        return 1;
    }
    if (!strcmp(a, "--expert-slots")) {
        const char *v = cli_value(argc, argv, i);
        const size_t vl = v ? strlen(v) : 0;
        if (v && !strcmp(v, "auto")) {
            c->expert_slots = MOET_EXPERT_SLOTS_AUTO;
            c->expert_slots_gib = 0;
            return 1;
        }
        if (vl > 1 && (v[vl - 1] == 'G' || v[vl - 1] == 'g')) { /* a budget: XG */
            char num[32];
            snprintf(num, sizeof num, "%.*s", (int)(vl - 1 < 31 ? vl - 1 : 31), v);
            if (cli_parse_float(num, &c->expert_slots_gib) || !(c->expert_slots_gib > 0) || c->expert_slots_gib > 1e6) {
                fprintf(stderr, "moet: --expert-slots XG needs a size in GiB > 0\n");
                return -1;
            }
            c->expert_slots = 0;
            return 1;
        }
        if (!v || cli_parse_int(v, 0, 1L << 40, &c->expert_slots)) {
            fprintf(stderr, "moet: --expert-slots needs a count >= 0, a budget like 40G, or auto\n");
            return -1;
        }
        c->expert_slots_gib = 0;
        return 1;
    }
    if (!strcmp(a, "--expert-reserve")) {
        const char *v = cli_value(argc, argv, i);
        char num[32];
        const size_t vl = v ? strlen(v) : 0;
        snprintf(num, sizeof num, "%.*s", (int)(vl && (v[vl - 1] == 'G' || v[vl - 1] == 'g') ? vl - 1 : vl), v ? v : "");
        if (!v || cli_parse_float(num, &c->expert_reserve_gib) || !(c->expert_reserve_gib > 0) || c->expert_reserve_gib > 1e6) {
            fprintf(stderr, "moet: --expert-reserve needs a size in GiB > 0\n");
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--kv-type")) {
        const char *v = cli_value(argc, argv, i);
        if (!v || (strcmp(v, "f32") && strcmp(v, "f16"))) {
            fprintf(stderr, "moet: --kv-type needs f32 or f16\n");
            return -1;
        }
        c->kv_type = !strcmp(v, "f16") ? MOET_KV_F16 : MOET_KV_F32;
        return 1;
    }
    if (!strcmp(a, "--expert-home")) {
        const char *v = cli_value(argc, argv, i);
        if (!v || (strcmp(v, "pinned") && strcmp(v, "mapped"))) {
            fprintf(stderr, "moet: --expert-home needs pinned or mapped\n");
            return -1;
        }
        c->expert_pinned = !strcmp(v, "pinned");
        return 1;
    }
    if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
        c->verbose = 1;
        moet_log_set_level(MOET_LOG_DEBUG);
        return 1;
    }
    return 0;
}

const char *const cli_delta_names[4] = {"off", "on", "gate", "pick"};

int cli_delta_mode(const char *cmd, const char *name, const moet_model_info *mi) {
    if (!name) return mi->delta_residual ? CLI_DELTA_PICK : mi->has_delta ? CLI_DELTA_GATE : CLI_DELTA_OFF;
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, cli_delta_names[i])) {
            if (i && !mi->has_delta) {
                fprintf(stderr, "moet %s: --delta %s needs a delta: a pack with its delta pack (X.delta.gguf beside "
                                "X.gguf, or --delta-file), or --experts w2+nvfp4 / w2+w2 (modes: " CLI_DELTA_MODES ")\n",
                        cmd, name);
                return -1;
            }
            if (i == CLI_DELTA_PICK && !mi->delta_residual) {
                fprintf(stderr, "moet %s: --delta pick needs the delta as residuals beside the base (a delta pack: "
                                "moet quantize --experts w2+nvfp4); experts requantized in memory hold base + delta as "
                                "one matrix\n", cmd);
                return -1;
            }
            return i;
        }
    fprintf(stderr, "moet %s: unknown --delta mode '%s' (modes: " CLI_DELTA_MODES ")\n", cmd, name);
    return -1;
}

int cli_delta_pick(const cli_common *c, moet_session *s, int dmode) {
    const double r = c->delta_pick_set ? c->delta_pick : dmode == CLI_DELTA_PICK ? CLI_DELTA_PICK_DEFAULT : 0.0;
    char err[512];
    if (dmode == CLI_DELTA_OFF) {
        if (c->delta_pick_set) MOET_LOGW("--delta-pick has no effect with the delta off");
        return 0;
    }
    if (moet_session_set_delta_pick(s, (float)r, err, sizeof err) == MOET_OK) return 0;
    fprintf(stderr, "moet: error: --delta-pick: %s\n", err);
    return -1;
}

moet_model *cli_load_model(const cli_common *c) {
    moet_model_options o = moet_model_default_options();
    o.n_threads = c->threads;
    o.verbose = 1;
    o.device = c->device;
    o.delta_path = c->delta_file;
    o.expert_slots = c->expert_slots;
    o.expert_slots_gib = c->expert_slots_gib;
    o.expert_reserve_gib = c->expert_reserve_gib;
    o.expert_pinned = c->expert_pinned;
    moet_model *m = NULL;
    char err[1024];
    const char *path = c->model ? c->model : MOET_DEFAULT_MODEL_DIR;
    if (moet_model_load(path, &o, &m, err, sizeof err) != MOET_OK) {
        fprintf(stderr, "moet: error: %s\n", err);
        return NULL;
    }
    return m;
}

int cli_parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof(int32_t));
    if (!v) return -1;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *e;
        errno = 0;
        long x = strtol(p, &e, 10);
        if (errno || e == p || x < 0 || x > INT32_MAX) { free(v); return -1; }
        if (k == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof(int32_t));
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = e;
    }
    *ids = v;
    *n = k;
    return 0;
}

int cli_read_text(const char *path, char **text, size_t *len, char *err, size_t errlen) {
    size_t pl = strlen(path);
    if (pl < 3 || strcmp(path + pl - 3, ".xz") != 0) return moet_file_read_all(path, (size_t)4 << 30, text, len, err, errlen);
    if (strchr(path, '\'')) return moet_err(err, errlen, MOET_EINVAL, "%s: quote in file name", path);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "xz -dc '%s'", path);
    FILE *f = popen(cmd, "r");
    if (!f) return moet_err(err, errlen, MOET_EIO, "%s: cannot run xz", path);
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    int st = pclose(f);
    if (!buf) return moet_err(err, errlen, MOET_ENOMEM, "%s: out of memory", path);
    if (st != 0) { free(buf); return moet_err(err, errlen, MOET_EIO, "%s: xz failed", path); }
    buf[n] = 0;
    *text = buf;
    *len = n;
    return MOET_OK;
}

int cli_requant_experts(moet_model *m, const moet_matq_options *qo, const char *calib_file, long calib_tokens,
                        int n_threads, moet_requant_stats *rqs) {
    char err[512];
    moet_calib *cal = NULL;
    if (calib_file) {
        char *ct;
        size_t cl;
        if (cli_read_text(calib_file, &ct, &cl, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); return 1; }
        cal = moet_calib_create(m);
        int crc = !cal || moet_calib_run(m, cal, ct, cl, 512, calib_tokens, err, sizeof err);
        free(ct);
        if (crc) {
            fprintf(stderr, "moet: error: calibration: %s\n", cal ? err : "out of memory");
            moet_calib_free(cal);
            return 1;
        }
    }
    int rc = moet_model_requant_experts(m, qo, cal, n_threads, rqs, err, sizeof err);
    moet_calib_free(cal);
    if (rc) fprintf(stderr, "moet: error: %s\n", err);
    return rc;
}

const char *cli_git_commit(void) {
    static char buf[64];
    if (buf[0]) return buf;
    /* a build run from a copy of the tree (the device machine) is told its commit: its own git metadata may be stale */
    const char *env = getenv("MOET_COMMIT");
    if (env && *env) {
        snprintf(buf, sizeof buf, "%s", env);
        return buf;
    }
    FILE *f = popen("git describe --always --dirty --abbrev=12 2>/dev/null", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        pclose(f);
        buf[strcspn(buf, "\n")] = 0;
    }
    if (!buf[0]) snprintf(buf, sizeof buf, "unknown");
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        cli_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("moet %s\n", MOET_VERSION_STRING); return 0; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "perplexity")) return cmd_perplexity(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
    fprintf(stderr, "moet: unknown command '%s'\n\n", cmd);
    cli_usage(stderr);
    return 2;
}
