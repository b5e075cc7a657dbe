/*
 * pack.h — moet packs: a model with its routed experts quantized, in one GGUF v3 file (docs/format.md).
 *
 * Keys: moet.format_version, moet.architecture (config.json's), the hyperparameters (moet.hp.*), the expert
 * format, the tokenizer (tokenizer.json text) and chat template. Tensors keep their Hugging Face names, so an
 * architecture's bind() works on a pack unchanged; each routed expert is one contiguous, 4 KiB-aligned record
 * (gate, up, down), and model.layers.L.mlp.experts.qparams [3E][4] holds each matrix's (qscale, qbeta, rot_seed,
 * rotated).
 */
#ifndef MOET_MODEL_PACK_H
#define MOET_MODEL_PACK_H

#include "model/model.h"
#include "quant/calib.h"
#include "quant/matq.h"

#define MOET_PACK_FORMAT_VERSION 1
#define MOET_PACK_RECORD_ALIGN 4096

typedef struct {
    moet_matq_options q;     /* expert format and its options */
    const moet_calib *calib; /* may be NULL */
    int n_threads;
    int dense_q8;            /* 1: the dense projections (attention, dense MLP, lm_head) as Q8_0; 0: as stored */
    const char *delta_path;  /* q.format w2+nvfp4: the pack gets the W2 base, this delta pack the NVFP4 residual */
} moet_pack_options;

/* m: a model loaded from a Hugging Face directory (source dir for the tokenizer files). */
int moet_pack_write(const moet_model *m, const char *src_dir, const char *out_path, const moet_pack_options *o,
                    char *err, size_t errlen);
/* Fills m from a pack (called by moet_model_load for a file path). */
int moet_pack_load(moet_model *m, const char *path, char *err, size_t errlen);

#endif
