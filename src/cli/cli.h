/*
 * cli.h — shared pieces of the moet command-line tool: argument helpers, model loading with the default model,
 * and the subcommand entry points (one file each).
 */
#ifndef MOET_CLI_H
#define MOET_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "moet.h"
#include "quant/matq.h"
#include "quant/requant.h"

#ifndef MOET_DEFAULT_MODEL_DIR
#define MOET_DEFAULT_MODEL_DIR "models/moe-mini-a"
#endif

/* Options every model-loading command accepts. */
typedef struct {
    const char *model;   /* -m */
    int threads;         /* -t */
    int verbose;         /* -v */
    const char *device;  /* --device cpu|cuda[:N] (default: the GPU when there is one) */
    const char *delta_file; /* --delta-file F (default: X.delta.gguf beside a pack X.gguf; "" for none) */
    long expert_slots;   /* --expert-slots N (0: every expert resident; MOET_EXPERT_SLOTS_AUTO: auto) */
    double expert_slots_gib; /* --expert-slots XG: as many as X GiB hold */
    double expert_reserve_gib; /* --expert-reserve G (with --expert-slots auto) */
    int expert_pinned;   /* --expert-home pinned (1) | mapped (0) */
    int kv_type;         /* --kv-type f32|f16: MOET_KV_F32 / MOET_KV_F16 (0: MOET_KV_AUTO) */
    int delta_pick_set;  /* --delta-pick R given */
    double delta_pick;   /* R: the delta on the picks of at least R times the mean routing weight (0: all) */
} cli_common;

/* --delta MODE: off (the base alone), on (base + delta on every pick), gate (each step on the base, redone with the
 * delta where its top-1 probability is below --tau), pick (base + delta on the picks of at least --delta-pick R x the
 * token's mean routing weight, R default CLI_DELTA_PICK_DEFAULT; docs/quality.md). */
enum { CLI_DELTA_OFF = 0, CLI_DELTA_ON = 1, CLI_DELTA_GATE = 2, CLI_DELTA_PICK = 3 };
#define CLI_DELTA_PICK_DEFAULT 0.8
#define CLI_DELTA_MODES "off, on, gate, pick"

/* The mode of --delta name for model mi (NULL: the default, pick for a delta pack, gate for a delta requantized in
 * memory, off without one), or -1 after a message that says why (cmd: the command, for it). */
int cli_delta_mode(const char *cmd, const char *name, const moet_model_info *mi);
extern const char *const cli_delta_names[4];

/* Sets the session's delta picks for mode dmode: --delta-pick R where given, else CLI_DELTA_PICK_DEFAULT for pick
 * and 0 (every pick) for on and gate; nothing for off. -1 after an error message (R > 0 with experts requantized in
 * memory, which hold base + delta as one matrix). */
int cli_delta_pick(const cli_common *c, moet_session *s, int dmode);

/* The name of a MOET_KV_* type as --kv-type spells it ("auto", "f32", "f16"). */
const char *cli_kv_type_name(int type);

/* Consumes argv[*i] (and its value) if it is a common option; returns 1 if consumed, 0 if not, -1 on error. */
int cli_common_arg(cli_common *c, int argc, char **argv, int *i);
/* Value of the option at argv[*i] (advancing *i), or NULL with a message. */
const char *cli_value(int argc, char **argv, int *i);
int cli_parse_int(const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *s, double *out);
/* Loads c->model (or the embedded default). Prints the error and returns NULL on failure. */
moet_model *cli_load_model(const cli_common *c);
/* Parses "1 2 3" into ids (malloc'd). */
int cli_parse_ids(const char *s, int32_t **ids, size_t *n);
void cli_usage(FILE *f);
/* Reads a text file; a name ending in .xz is decompressed through xz(1). */
int cli_read_text(const char *path, char **text, size_t *len, char *err, size_t errlen);
const char *cli_git_commit(void);
/* --experts for run/perplexity: calibrate on calib_file (NULL: none, calib_tokens of it) and requantize m's routed
 * experts in memory with qo. Prints the error and returns nonzero on failure. */
int cli_requant_experts(moet_model *m, const moet_matq_options *qo, const char *calib_file, long calib_tokens,
                        int n_threads, moet_requant_stats *rqs);

int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
