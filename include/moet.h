/*
 * moet.h — the public C API of moet, a Mixture-of-Experts inference engine.
 *
 * Two opaque objects:
 *   moet_model    immutable after load: hyperparameters, mmap'd weights, tokenizer. Safe to share between threads.
 *   moet_session  everything that changes per sequence: KV cache, scratch, logits. One thread at a time.
 *   moet_kv       a paged KV cache pool that sessions take blocks from (optional: a session makes its own).
 *
 * Conventions, everywhere in this header:
 *   - functions that can fail return int: 0 (MOET_OK) on success, a negative MOET_E* code on failure, and write a
 *     NUL-terminated message into err (errlen bytes, may be NULL/0 to discard);
 *   - options structs are initialised by moet_*_default_options() and then edited;
 *   - sizes are sized integers; token ids are int32_t.
 */
#ifndef MOET_H
#define MOET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOET_VERSION_STRING "0.1.0"

enum {
    MOET_OK = 0,
    MOET_EINVAL = -1,   /* bad argument or bad input */
    MOET_EIO = -2,      /* file could not be opened/read/mapped */
    MOET_EFORMAT = -3,  /* malformed file (safetensors, config.json, tokenizer.json, pack) */
    MOET_EUNSUP = -4,   /* valid input using an architecture/option moet does not support */
    MOET_ENOMEM = -5,
    MOET_ERANGE = -6,   /* request exceeds a limit (context length, batch size) */
    MOET_EDEVICE = -7,  /* the compute device is missing or failed (no GPU, CUDA error) */
};

typedef struct moet_model moet_model;
typedef struct moet_session moet_session;
typedef struct moet_tokenizer moet_tokenizer;

/* ---- model ------------------------------------------------------------------------------------------------ */

typedef struct {
    int n_threads;      /* CPU worker threads for compute; <= 0: all online cores */
    int verbose;        /* log loading details to stderr */
    const char *device; /* "cpu", "cuda" or "cuda:N"; NULL or "auto": the first GPU when there is one, else cpu */
    /* A pack's delta pack (the NVFP4 residual of its W2 experts, for --delta on|gate): NULL: X.delta.gguf beside a
     * pack X.gguf when that file exists; "": none; a path: that file (an error if it cannot be loaded). */
    const char *delta_path;
    /* Routed experts resident at once (the expert cache, DESIGN.md §5): 0: all; n > 0: at most n, a step that routes
     * to another is run again once it is fetched (backend/expert_cache.h). The CPU backend carries the protocol (on
     * the CPU every expert lies in host memory: nothing moves); the CUDA backend holds n in device slots and copies
     * the rest from where the model keeps them (backend/cuda/expert_cache.cu). */
    int64_t expert_slots;
    /* expert_slots = MOET_EXPERT_SLOTS_AUTO: every expert resident when the whole model fits the device with
     * expert_reserve_gib to spare; else the cache, with as many slots as the device holds beside the dense weights
     * and the reserve (an error if that is not one token's experts). On a host backend: every expert resident. */
    double expert_reserve_gib; /* device memory auto leaves free (KV caches, activations); <= 0: 10%, >= 2 GiB */
    /* With expert_slots: 1: a device backend keeps the experts outside its slots in pinned host RAM (copied there
     * at their layer's first step, in the layout its kernels read: a fetch is one DMA); 0: it copies them from where
     * the model maps them (page cache or the pack file itself) on each fetch. */
    int expert_pinned;
    /* Instead of expert_slots (> 0): as many slots as this many GiB hold (a slot: one expert's matrices and, with a
     * delta, its residuals). moet_model_info.expert_slots says how many that made. */
    double expert_slots_gib;
} moet_model_options;

#define MOET_EXPERT_SLOTS_AUTO (-1)

moet_model_options moet_model_default_options(void);

/* path: a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json), or a moet pack (.gguf)
 * written by `moet quantize`. */
int moet_model_load(const char *path, const moet_model_options *opt, moet_model **out, char *err, size_t errlen);
void moet_model_free(moet_model *m);

typedef struct {
    const char *architecture;  /* e.g. "Qwen3MoeForCausalLM" */
    int32_t vocab_size, hidden_size, n_layers, n_heads, n_kv_heads, head_dim;
    int32_t n_experts, n_experts_used, expert_ffn, dense_ffn, max_positions;
    int64_t n_params;          /* parameters counted from the tensors */
    int64_t weight_bytes;      /* bytes of weights as stored */
    const char *backend;       /* "cpu" or "cuda" */
    const char *device;        /* what computes: "NVIDIA H200 (sm_90, ...)", "cpu, 2 threads" */
    int32_t has_delta;         /* base + delta experts are loaded (a delta pack, or experts requantized with one) */
    int32_t delta_residual;    /* ... as residuals beside the base (a delta pack), so it can run on some picks only */
    int64_t expert_slots;      /* the expert cache's slots (0: every expert resident) */
    const char *router;        /* "softmax" (Qwen3-MoE, Mixtral), "sigmoid" (a choice bias, group-limited: GLM-4.5,
                                * DeepSeek-V3) or "top-k softmax" (gpt-oss) */
    int32_t norm_topk;         /* the top-k weights renormalised */
    int32_t n_group, topk_group; /* the sigmoid router's expert groups and how many a token keeps */
    float route_scale;         /* the weights' factor (routed_scaling_factor) */
    int32_t shared_ffn;        /* the always-on shared expert's FFN width (0: none) */
    int32_t rope_dim;          /* the dims of a head RoPE rotates (head_dim, or fewer: partial rotary) */
    const char *rope_scaling;  /* "none" or "yarn" */
    float rope_factor;         /* YaRN's factor (0 without) */
    int32_t q_lora_rank, kv_lora_rank; /* MLA (DeepSeek-V3): the q and kv bottlenecks (kv_lora_rank 0: not MLA) */
    int32_t v_head_dim;        /* MLA: a value head's width (head_dim is the q/k head's) */
    int32_t sliding_window, n_sliding; /* gpt-oss: the window, and how many layers slide (0: none) */
    float swiglu_limit;        /* gpt-oss: the experts' clamped SwiGLU (0: plain SiLU) */
} moet_model_info;

void moet_model_info_get(const moet_model *m, moet_model_info *info);
/* The expert cache's counts since the model loaded: experts fetched, experts evicted, steps run again (all 0 without
 * a cache). */
void moet_model_expert_cache_stats(const moet_model *m, int64_t *fetched, int64_t *evicted, int64_t *replays);
/* And how often the MoE ops asked for an expert (a layer's expert once a forward pass, replays included) and found it
 * not resident: 1 - misses / uses is the cache's hit rate. */
void moet_model_expert_cache_uses(const moet_model *m, int64_t *uses, int64_t *misses);
const moet_tokenizer *moet_model_tokenizer(const moet_model *m);
/* End-of-sequence ids from config.json / generation_config.json; returns count written (<= cap). */
int moet_model_eos_ids(const moet_model *m, int32_t *ids, int cap);
/* The Jinja chat template shipped with the model (tokenizer_config.json "chat_template", or chat_template.jinja),
 * or NULL. */
const char *moet_model_chat_template(const moet_model *m);
/* Supported architectures, comma separated (for error messages and --help). */
const char *moet_model_supported_architectures(void);

/* ---- tokenizer -------------------------------------------------------------------------------------------- */

int moet_tokenizer_load(const char *tokenizer_json_path, moet_tokenizer **out, char *err, size_t errlen);
/* The same from tokenizer.json text in memory (label names it in errors). */
int moet_tokenizer_load_buffer(const char *label, const char *json, size_t len, moet_tokenizer **out, char *err,
                               size_t errlen);
void moet_tokenizer_free(moet_tokenizer *t);
/* Encodes text (len bytes) as HF tokenizers' encode(text) does (added/special tokens matched, post-processor
 * applied). *ids is malloc'd; caller frees. */
int moet_tokenizer_encode(const moet_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                          char *err, size_t errlen);
/* The same with the post-processor's special tokens (BOS/EOS) added or not (add_special = 0: a rendered chat
 * template already holds them, as transformers' apply_chat_template assumes). */
int moet_tokenizer_encode_special(const moet_tokenizer *t, const char *text, size_t len, int add_special,
                                  int32_t **ids, size_t *n_ids, char *err, size_t errlen);
/* Decodes ids to UTF-8 (malloc'd, NUL-terminated, *len without the NUL). */
int moet_tokenizer_decode(const moet_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len,
                          char *err, size_t errlen);
/* Bytes of one token as it appears in streamed output (not NUL-terminated); returns length or <0 for bad id.
 * at_start: the token is the first of a decoded sequence (decoders that strip a leading space use it). */
int moet_tokenizer_token_bytes(const moet_tokenizer *t, int32_t id, int at_start, char *buf, size_t cap);
int32_t moet_tokenizer_vocab_size(const moet_tokenizer *t);
/* Id of a token string (vocab or added token), or -1. */
int32_t moet_tokenizer_token_id(const moet_tokenizer *t, const char *token);

/* ---- KV cache pool ---------------------------------------------------------------------------------------- */

/* The KV cache is paged: every layer's keys and values live in blocks of block_tokens token rows, and a session
 * holds a table of the blocks its sequence uses, taking them from its pool as it grows and giving them back when it
 * is truncated or freed. By default a session makes a pool of its own for n_ctx tokens (the memory a contiguous
 * cache would take). Sessions that share one pool (a server's slots) hold only what their sequences use, so the
 * pool can be far smaller than sessions x n_ctx; an eval that needs more blocks than are free fails with
 * MOET_ENOMEM before it computes anything. A pool and its sessions are used by one thread at a time. */
typedef struct moet_kv moet_kv;

/* The cache's element type. f16 (IEEE binary16) halves the cache's memory and the bytes a decode step's attention
 * reads (most of a step's bytes at long contexts); each key and value is rounded to f16 once, when written (the
 * quality cost: docs/quality.md). auto is f32 on the CPU (the reference backend) and f16 on CUDA, where the
 * decode attention over f16 pools runs on tensor cores and a long context decodes faster (docs/performance.md);
 * MOET_KV_AUTO_CUDA=f32 in the environment keeps CUDA's auto at f32. */
enum { MOET_KV_AUTO = 0, MOET_KV_F32 = 1, MOET_KV_F16 = 2 };

typedef struct {
    int32_t n_tokens;     /* capacity in tokens (rounded up to whole blocks); <= 0: max_position_embeddings */
    int32_t block_tokens; /* tokens a block: a power of two in [1, 65536]; <= 0: 32 */
    int32_t prefix_cache; /* 1: full blocks are kept by the hash of their whole prefix and shared: an eval
                           * (MOET_LOGITS_LAST) whose leading full blocks were computed before, by any session of
                           * the pool, takes them instead of computing them; the same logits to float rounding
                           * (the KV may come from another path: a prefill chunk vs decode steps). 0 (default): off */
    int32_t type;         /* MOET_KV_AUTO (default), MOET_KV_F32 or MOET_KV_F16 */
} moet_kv_options;

moet_kv_options moet_kv_default_options(void);

/* A pool on m's backend (its memory is allocated here, once). */
int moet_kv_create(const moet_model *m, const moet_kv_options *opt, moet_kv **out, char *err, size_t errlen);
/* Drops the caller's reference; the memory goes when the last session using the pool is freed too. */
void moet_kv_free(moet_kv *kv);
/* Tokens' worth of blocks not held by any session (cached prefix blocks count: they are reclaimed on demand), and
 * the tokens a block holds (a power of two). */
int32_t moet_kv_free_tokens(const moet_kv *kv);
int32_t moet_kv_block_tokens(const moet_kv *kv);
/* The pool's capacity in tokens (whole blocks). */
int32_t moet_kv_tokens(const moet_kv *kv);
/* The element type its pools hold: MOET_KV_F32 or MOET_KV_F16 (auto resolved). */
int32_t moet_kv_type(const moet_kv *kv);
/* Tokens evals have taken from the prefix cache instead of computing them, since the pool was made. */
uint64_t moet_kv_hit_tokens(const moet_kv *kv);

/* ---- session ---------------------------------------------------------------------------------------------- */

typedef struct {
    int32_t n_ctx;      /* the sequence's longest context in tokens; <= 0: the model's max_position_embeddings */
    int32_t n_batch;    /* tokens per forward chunk (scratch is sized for it); longer evals run in chunks */
    int32_t n_logits;   /* rows MOET_LOGITS_ALL can return from one eval; <= 0: n_batch */
    int32_t graphs;     /* 1 (default): decode steps are recorded once and replayed (CUDA graphs); 0: launched */
    int32_t n_candidates; /* 0 (default): off. k in 1..64: an eval in MOET_LOGITS_LAST mode also finds the k largest
                           * logits of its row on the backend and copies only those to the host
                           * (moet_session_candidates); the whole row is copied when moet_session_logits asks */
    moet_kv *kv;        /* NULL (default): a KV pool of the session's own, for n_ctx tokens; else blocks from kv
                         * (a pool of the same model; the session keeps a reference, so kv may be freed first) */
    int32_t kv_block;   /* tokens a block of the session's own pool (kv NULL); <= 0: 32 */
    int32_t kv_type;    /* the element type of the session's own pool (kv NULL): MOET_KV_AUTO (default), MOET_KV_F32
                         * or MOET_KV_F16; with kv given, the pool's */
} moet_session_options;

moet_session_options moet_session_default_options(void);

int moet_session_create(const moet_model *m, const moet_session_options *opt, moet_session **out,
                        char *err, size_t errlen);
void moet_session_free(moet_session *s);

enum { MOET_LOGITS_LAST = 0, MOET_LOGITS_ALL = 1 };

/* Appends n tokens at the current position and runs the forward. With MOET_LOGITS_ALL the logits of every one of
 * the n tokens are kept (n * vocab floats), else only the last. */
int moet_session_eval(moet_session *s, const int32_t *tokens, int32_t n, int logits_mode, char *err, size_t errlen);
/* Logits of the last eval: row i of n_rows, each vocab_size floats. With candidates on, the rows are copied from
 * the backend at the first call after an eval (so the pointer is valid until the next eval, as always). */
const float *moet_session_logits(const moet_session *s, int32_t *n_rows);
/* The last eval's candidates (n_candidates on, MOET_LOGITS_LAST): the k largest logits of its row, *ids and *vals
 * in descending order of logit, equal logits by ascending id (NaN last). Returns k, or 0 where the last eval kept
 * none (candidates off, MOET_LOGITS_ALL, or a backend without them). Valid until the next eval. */
int32_t moet_session_candidates(const moet_session *s, const int32_t **ids, const float **vals);
int32_t moet_session_pos(const moet_session *s);
/* The element type of the session's KV cache: MOET_KV_F32 or MOET_KV_F16. */
int32_t moet_session_kv_type(const moet_session *s);
/* Takes the KV blocks the next n tokens will need now (an eval would take them itself): MOET_ENOMEM, with nothing
 * taken, when the pool has too few free; MOET_ERANGE past n_ctx. What a scheduler calls before it commits a
 * sequence to a step. */
int moet_session_reserve(moet_session *s, int32_t n, char *err, size_t errlen);
/* Forget KV entries from position pos on (pos <= current position); blocks past it go back to the pool. */
int moet_session_truncate(moet_session *s, int32_t pos, char *err, size_t errlen);

/* ---- batched decode ----------------------------------------------------------------------------------------- */

/* One forward over the next token of each of up to max_seqs sessions of one model: the weights are read once for
 * all of them, only attention runs per sequence (on each session's own KV cache). What continuous batching in a
 * server needs. n_ctx: the largest context among the sessions it will run. */
typedef struct moet_batch moet_batch;

int moet_batch_create(const moet_model *m, int32_t max_seqs, int32_t n_ctx, moet_batch **out, char *err,
                      size_t errlen);
void moet_batch_free(moet_batch *b);
/* Appends tokens[i] to sessions[i] (n distinct sessions of b's model, each with room for one more token) and runs
 * the forward; then moet_batch_logits(b, i) holds sessions[i]'s next-token logits until the next call. The
 * sessions' own logits (moet_session_logits) are left as they were. */
int moet_batch_decode(moet_batch *b, moet_session *const *sessions, const int32_t *tokens, int32_t n, char *err,
                      size_t errlen);
const float *moet_batch_logits(const moet_batch *b, int32_t i);
/* Row i's candidates from the last moet_batch_decode, as moet_session_candidates (a batch keeps
 * min(64, vocab) of them a row where the backend has them; moet_batch_logits copies the full rows on first use). */
int32_t moet_batch_candidates(const moet_batch *b, int32_t i, const int32_t **ids, const float **vals);

/* ---- sampler ---------------------------------------------------------------------------------------------- */

typedef struct {
    float temperature;          /* 0: greedy */
    int32_t top_k;              /* 0: off */
    float top_p;                /* 1: off */
    float min_p;                /* 0: off */
    float repetition_penalty;   /* 1: off (HF semantics: divide positive logits, multiply negative) */
    float presence_penalty;     /* 0: off (OpenAI semantics) */
    float frequency_penalty;    /* 0: off */
    int32_t penalty_last_n;     /* window of previous tokens penalties look at; -1: all */
    uint64_t seed;
} moet_sampler_options;

typedef struct moet_sampler moet_sampler;

moet_sampler_options moet_sampler_default_options(void);
int moet_sampler_create(const moet_sampler_options *opt, int32_t vocab_size, moet_sampler **out,
                        char *err, size_t errlen);
void moet_sampler_free(moet_sampler *s);
/* Picks the next token from logits; history = previous tokens (prompt + generated) for the penalties. */
int32_t moet_sampler_sample(moet_sampler *s, const float *logits, const int32_t *history, size_t n_history);
/* The token moet_sampler_sample would pick from the full logits, decided from k candidates (the row's k largest,
 * ordered as moet_session_candidates gives them) where they are enough to know it: greedy, or top_k in 1..k-1, and
 * penalties that can only lower logits; and no token outside the candidates can reach the cut. Then the result and
 * the random stream are exactly those of moet_sampler_sample. -1 where the candidates are not enough (nothing is
 * drawn; call moet_sampler_sample with the full row). */
int32_t moet_sampler_sample_candidates(moet_sampler *s, const int32_t *ids, const float *vals, int32_t k,
                                       const int32_t *history, size_t n_history);

#ifdef __cplusplus
}
#endif
#endif /* MOET_H */
