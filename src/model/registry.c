/* registry.c — the table of architectures. Adding one: write its file, declare it here, add it to k_archs. */
#include <string.h>

#include "model/arch.h"

extern const moet_arch moet_arch_qwen3_moe;
extern const moet_arch moet_arch_mixtral;
extern const moet_arch moet_arch_glm4_moe;
extern const moet_arch moet_arch_deepseek_v3;
extern const moet_arch moet_arch_gpt_oss;

static const moet_arch *const k_archs[] = {&moet_arch_qwen3_moe, &moet_arch_mixtral, &moet_arch_glm4_moe,
                                            &moet_arch_deepseek_v3, &moet_arch_gpt_oss};

const moet_arch *moet_arch_find(const char *hf_name) {
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
        if (strcmp(k_archs[i]->hf_name, hf_name) == 0) return k_archs[i];
    return NULL;
}

const char *moet_arch_list(void) {
    return "Qwen3MoeForCausalLM, MixtralForCausalLM, Glm4MoeForCausalLM, DeepseekV3ForCausalLM, GptOssForCausalLM";
}
