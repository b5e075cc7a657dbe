/*
 * arch.h — the architecture registry.
 *
 * An architecture is one file (qwen3_moe.c, mixtral.c; later deepseek_v3.c, glm4_moe.c, gpt_oss.c) that provides
 * two functions: parse_config (config.json -> moet_hparams, rejecting options it does not implement by name) and
 * bind (tensor names -> moet_layer plan, checking every shape against the hyperparameters), built from what the
 * HF decoders share (hf_common.h). Everything after binding is architecture-independent; a moet pack stores the
 * routed experts under Qwen3's per-expert names whatever the architecture, so each bind accepts those too.
 */
#ifndef MOET_MODEL_ARCH_H
#define MOET_MODEL_ARCH_H

#include <jansson.h>
#include <stddef.h>

#include "model/hparams.h"

struct moet_model;

typedef struct {
    const char *hf_name;   /* config.json "architectures" entry */
    const char *family;    /* short name */
    int (*parse_config)(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen);
    int (*bind)(struct moet_model *m, char *err, size_t errlen);
} moet_arch;

const moet_arch *moet_arch_find(const char *hf_name);
/* "A, B, C" */
const char *moet_arch_list(void);

#endif
