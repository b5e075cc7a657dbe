/* fuzz_config.c — libFuzzer target: a config.json's bytes through every architecture's parse_config (each input as
 * the config of Qwen3-MoE, Mixtral, GLM-4.5, DeepSeek-V3 and gpt-oss alike): accept or reject with an error, never
 * crash or leak. */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/hparams.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const names[] = {"Qwen3MoeForCausalLM", "MixtralForCausalLM", "Glm4MoeForCausalLM",
                                        "DeepseekV3ForCausalLM", "GptOssForCausalLM"};
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
                (hp.n_experts > 0 && hp.n_experts % hp.n_group) || hp.rope.dim != hp.rope_dim ||
                hp.rope.dim > 2 * MOET_ROPE_MAX_FREQ || !(hp.rope.attn_factor > 0) ||
                (hp.kv_lora_rank > 0 && (hp.head_dim != hp.qk_nope_dim + hp.rope_dim || hp.v_head_dim < 1 ||
                                         hp.v_head_dim > hp.head_dim || hp.n_kv_heads != hp.n_heads)) ||
                (hp.layer_sliding && hp.sliding_window < 1))
                abort();
            for (int f = 0; f < hp.rope.dim / 2; f++)
                if (!(hp.rope.inv_freq[f] > 0) || !isfinite(hp.rope.inv_freq[f])) abort();
        }
        free(hp.layer_moe);
        free(hp.layer_sliding);
    }
    json_decref(cfg);
    return 0;
}
