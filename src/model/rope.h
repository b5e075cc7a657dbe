/*
 * rope.h — the rotary embedding's frequency table from a model's hyperparameters (moet_rope, backend.h).
 */
#ifndef MOET_MODEL_ROPE_H
#define MOET_MODEL_ROPE_H

#include <jansson.h>
#include <stddef.h>

#include "model/hparams.h"

enum { MOET_ROPE_DEFAULT = 0, MOET_ROPE_YARN = 1 };

/* hp->rope from rope_theta, rope_dim and the scaling fields (rope_type and YaRN's): 0, or MOET_EUNSUP when rope_dim
 * is over 2 x MOET_ROPE_MAX_FREQ. */
int moet_rope_init(moet_hparams *hp, char *err, size_t errlen);

/* The RoPE keys of a config.json: rope_theta and the scaling (rope_parameters, transformers 5's spelling, or
 * rope_theta + rope_scaling; type default or yarn, the rest refused by name) into hp; rope_dim must be set. YaRN's
 * attention factor is resolved as transformers does (attention_factor if given, else from mscale / mscale_all_dim,
 * else 0.1 ln(factor) + 1). Then moet_rope_init. */
int moet_rope_parse(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen);

/* YaRN's get_mscale: 0.1 m ln(s) + 1 for s > 1, else 1 (DeepSeek's softmax scale uses it too). */
double moet_yarn_mscale(double s, double m);

#endif
