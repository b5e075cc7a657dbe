/* fuzz_config.c — libFuzzer target: a config.json's bytes through every architecture's parse_config (each input as
 * the config of Qwen3-MoE, Mixtral and GLM-4.5 alike): accept or reject with an error, never crash or leak. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/hparams.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const names[] = {"Qwen3MoeForCausalLM", "MixtralForCausalLM", "Glm4MoeForCausalLM"};
    json_error_t je;
    json_t *cfg = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    if (!cfg) return 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const moet_arch *a = moet_arch_find(names[i]);
        if (!a) abort();
        moet_hparams hp;
        memset(&hp, 0, sizeof hp);
        char err[512];
        if (a->parse_config(cfg, &hp, err, sizeof err) == 0) {
            /* what the runtime relies on once a config is accepted */
            if (hp.n_layers < 1 || hp.hidden < 1 || hp.n_heads < 1 || hp.n_kv_heads < 1 || hp.n_heads % hp.n_kv_heads ||
                hp.rope_dim < 2 || hp.rope_dim > hp.head_dim || hp.rope_dim % 2 || !hp.layer_moe ||
                hp.n_experts_used > hp.n_experts || hp.n_group < 1 || hp.topk_group > hp.n_group ||
                (hp.n_experts > 0 && hp.n_experts % hp.n_group))
                abort();
        }
        free(hp.layer_moe);
    }
    json_decref(cfg);
    return 0;
}
