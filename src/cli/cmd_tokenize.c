/*
 * cmd_tokenize.c — `moet tokenize` (text -> ids on stdout) and `moet inspect` (model summary).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int cmd_tokenize(int argc, char **argv) {
    cli_common c = {0};
    const char *text = NULL, *tok_path = NULL;
    int show_pieces = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--pieces")) show_pieces = 1;
        else if (!strcmp(argv[i], "--tokenizer")) { if (!(tok_path = cli_value(argc, argv, &i))) return 2; }
        else if (!text) text = argv[i];
        else { fprintf(stderr, "moet tokenize: unexpected argument '%s'\n", argv[i]); return 2; }
    }
    if (!text) { fprintf(stderr, "usage: moet tokenize [-m DIR | --tokenizer tokenizer.json] [--pieces] TEXT\n"); return 2; }
    char err[512];
    moet_model *m = NULL;
    moet_tokenizer *own = NULL;
    if (tok_path) {
        if (moet_tokenizer_load(tok_path, &own, err, sizeof err)) { fprintf(stderr, "moet: error: %s\n", err); return 1; }
    } else if (!(m = cli_load_model(&c))) {
        return 1;
    }
    const moet_tokenizer *tok = own ? own : moet_model_tokenizer(m);
    int32_t *ids;
    size_t n;
    int rc = 0;
    if (moet_tokenizer_encode(tok, text, strlen(text), &ids, &n, err, sizeof err)) {
        fprintf(stderr, "moet: error: %s\n", err);
        rc = 1;
    } else {
        for (size_t i = 0; i < n; i++) {
            if (show_pieces) {
                char buf[256];
                int b = moet_tokenizer_token_bytes(tok, ids[i], i == 0, buf, sizeof buf);
                printf("%d\t'%.*s'\n", ids[i], b > 0 ? b : 0, buf);
            } else {
                printf("%s%d", i ? " " : "", ids[i]);
            }
        }
        if (!show_pieces) printf("\n");
        free(ids);
    }
    moet_tokenizer_free(own);
    moet_model_free(m);
    return rc;
}

int cmd_inspect(int argc, char **argv) {
    cli_common c = {0};
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (!r) { fprintf(stderr, "moet inspect: unexpected argument '%s'\n", argv[i]); return 2; }
    }
    moet_model *m = cli_load_model(&c);
    if (!m) return 1;
    moet_model_info f;
    moet_model_info_get(m, &f);
    printf("architecture   %s\nparameters     %lld\nweight bytes   %lld\nvocab          %d\nhidden         %d\n"
           "layers         %d\nheads          %d (kv %d, head_dim %d)\nexperts        %d (top %d, ffn %d)\n"
           "dense ffn      %d\nmax positions  %d\n",
           f.architecture, (long long)f.n_params, (long long)f.weight_bytes, f.vocab_size, f.hidden_size, f.n_layers,
           f.n_heads, f.n_kv_heads, f.head_dim, f.n_experts, f.n_experts_used, f.expert_ffn, f.dense_ffn,
           f.max_positions);
    if (f.n_experts > 0) {
        const int renorm = f.norm_topk && strcmp(f.router, "top-k softmax") != 0; /* top-k softmax sums to 1 anyway */
        printf("router         %s%s", f.router, renorm ? ", top-k renormalised" : "");
        if (!strcmp(f.router, "sigmoid"))
            printf(", %d groups (keep %d), x %g", f.n_group, f.topk_group, (double)f.route_scale);
        printf("\n");
    }
    if (f.shared_ffn > 0) printf("shared expert  ffn %d\n", f.shared_ffn);
    if (f.kv_lora_rank > 0)
        printf("attention      MLA: q rank %d, kv rank %d, q/k head %d (%d rotated), v head %d\n", f.q_lora_rank,
               f.kv_lora_rank, f.head_dim, f.rope_dim, f.v_head_dim);
    else if (f.rope_dim != f.head_dim)
        printf("rope           %d of %d dims a head\n", f.rope_dim, f.head_dim);
    if (strcmp(f.rope_scaling, "none") != 0) printf("rope scaling   %s x %g\n", f.rope_scaling, (double)f.rope_factor);
    if (f.n_sliding > 0) printf("sliding window %d keys on %d of %d layers\n", f.sliding_window, f.n_sliding, f.n_layers);
    if (f.swiglu_limit > 0) printf("expert act     clamped SwiGLU (limit %g)\n", (double)f.swiglu_limit);
    printf("delta          %s\n", f.has_delta ? (f.delta_residual ? "loaded as residuals (--delta pick|on|gate; pick, R 0.8, by default)" : "loaded (base + delta experts: --delta on|gate)") : "none");
    moet_model_free(m);
    return 0;
}
