/*
 * test_safetensors.c — malformed checkpoints are rejected with an error that names the problem, and leave nothing
 * behind; a well-formed file of the same construction is accepted (so the test can fail).
 *
 * usage: test_safetensors MODEL_DIR   (a valid checkpoint to derive broken model directories from)
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "format/safetensors.h"
#include "moet.h"
#include "test_util.h"

static char g_dir[256];

/* Writes u64 header length + header + data_len bytes of data. hlen_override != 0 replaces the length field. */
static const char *write_st(const char *name, const char *header, size_t data_len, uint64_t hlen_override) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot write %s", path);
    uint64_t hl = hlen_override ? hlen_override : strlen(header);
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hl >> (8 * i));
    fwrite(b, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i * 37 + 11), f);
    fclose(f);
    return path;
}

static void expect_reject(const char *what, const char *path, const char *needle) {
    moet_st_set s;
    moet_st_init(&s);
    char err[1024] = {0};
    int rc = moet_st_add_file(&s, path, err, sizeof err);
    CHECK(rc != MOET_OK, "%s: accepted", what);
    CHECK(s.n_files == 0 && s.n_tensors == 0, "%s: partial state left in the set", what);
    CHECK(strstr(err, needle) != NULL, "%s: error '%s' does not mention '%s'", what, err, needle);
    CHECK(strstr(err, path) != NULL, "%s: error '%s' does not name the file", what, err);
    fprintf(stderr, "rejected %-22s %s\n", what, err);
    moet_st_free(&s);
}

static void copy_file(const char *from, const char *to, size_t max_bytes) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    REQUIRE(a && b, "copy %s -> %s", from, to);
    char buf[65536];
    size_t n, tot = 0;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0 && tot < max_bytes) {
        if (tot + n > max_bytes) n = max_bytes - tot;
        fwrite(buf, 1, n, b);
        tot += n;
    }
    fclose(a);
    fclose(b);
}

/* A model dir: config.json from `config` (or copied), tokenizer copied, weights truncated to max_bytes. */
static const char *make_model(const char *src, const char *name, const char *config, size_t max_bytes) {
    static char d[512];
    char p[600], q[600];
    snprintf(d, sizeof d, "%s/%s", g_dir, name);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/tokenizer.json", src);
    snprintf(q, sizeof q, "%s/tokenizer.json", d);
    copy_file(p, q, SIZE_MAX);
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    snprintf(q, sizeof q, "%s/model.safetensors", d);
    copy_file(p, q, max_bytes);
    snprintf(q, sizeof q, "%s/config.json", d);
    if (config) {
        FILE *f = fopen(q, "w");
        fputs(config, f);
        fclose(f);
    } else {
        snprintf(p, sizeof p, "%s/config.json", src);
        copy_file(p, q, SIZE_MAX);
    }
    return d;
}

static void expect_model_reject(const char *what, const char *dir, const char *needle) {
    moet_model *m = NULL;
    char err[1024] = {0};
    moet_model_options o = moet_model_default_options();
    o.n_threads = 1;
    int rc = moet_model_load(dir, &o, &m, err, sizeof err);
    CHECK(rc != MOET_OK && m == NULL, "%s: model accepted", what);
    CHECK(strstr(err, needle) != NULL, "%s: error '%s' does not mention '%s'", what, err, needle);
    fprintf(stderr, "rejected %-22s %s\n", what, err);
}

/* config.json of the source model with one textual substitution. */
static char *config_with(const char *src, const char *from, const char *to) {
    char p[600], *txt;
    size_t n;
    snprintf(p, sizeof p, "%s/config.json", src);
    REQUIRE(moet_file_read_all(p, 1 << 20, &txt, &n, NULL, 0) == 0, "read %s", p);
    char *at = strstr(txt, from);
    REQUIRE(at, "'%s' not in %s", from, p);
    char *out = malloc(n + strlen(to) + 1);
    size_t pre = (size_t)(at - txt);
    memcpy(out, txt, pre);
    strcpy(out + pre, to);
    strcat(out, at + strlen(from));
    free(txt);
    return out;
}

int main(int argc, char **argv) {
    REQUIRE(argc == 2, "usage: test_safetensors MODEL_DIR");
    snprintf(g_dir, sizeof g_dir, "/tmp/moet_st_test_%d", (int)getpid());
    REQUIRE(mkdir(g_dir, 0755) == 0, "mkdir %s", g_dir);

    /* control: a valid two-tensor file */
    const char *good = write_st("good.safetensors",
                                "{\"__metadata__\":{\"a\":\"b\"},\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                                "\"y\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]}}", 24, 0);
    {
        moet_st_set s;
        moet_st_init(&s);
        char err[512];
        CHECK(moet_st_add_file(&s, good, err, sizeof err) == 0 && moet_st_finish(&s, err, sizeof err) == 0,
              "valid file rejected: %s", err);
        const moet_st_tensor *t = moet_st_find(&s, "y");
        CHECK(t && t->nbytes == 8 && t->dtype == MOET_ST_BF16, "tensor y misread");
        moet_st_free(&s);
    }
    {
        char p[512];
        snprintf(p, sizeof p, "%s/trunc.safetensors", g_dir);
        FILE *f = fopen(p, "wb");
        fwrite("\x10\0\0", 1, 3, f);
        fclose(f);
        expect_reject("truncated", p, "truncated");
    }
    expect_reject("header past EOF", write_st("hl.safetensors", "{}", 0, 1000000), "past the end");
    expect_reject("invalid JSON", write_st("json.safetensors", "{\"x\": {\"dtype\": \"F32\",", 8, 0), "not valid JSON");
    expect_reject("not an object", write_st("arr.safetensors", "[1,2,3]", 0, 0), "not a JSON object");
    expect_reject("duplicate key", write_st("dup.safetensors",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0),
        "not valid JSON");
    expect_reject("overlap", write_st("ovl.safetensors",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0),
        "overlap");
    expect_reject("offset out of range", write_st("oor.safetensors",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, 0), "outside the data section");
    expect_reject("reversed offsets", write_st("rev.safetensors",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, 0), "outside the data section");
    expect_reject("wrong dtype size", write_st("dts.safetensors",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", 8, 0), "needs 16 bytes");
    expect_reject("absurd shape", write_st("abs.safetensors",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}", 8, 0), "overflows");
    expect_reject("huge shape", write_st("huge.safetensors",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296],\"data_offsets\":[0,8]}}", 8, 0), "needs 17179869184 bytes");
    expect_reject("negative dim", write_st("neg.safetensors",
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, 0), "non-negative");
    expect_reject("unknown dtype", write_st("udt.safetensors",
        "{\"x\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, 0), "unknown dtype");
    expect_reject("missing offsets", write_st("mo.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, 0),
                  "data_offsets");
    expect_reject("rank too high", write_st("rank.safetensors",
        "{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, 0), "rank");

    /* Whole-model checks: the checkpoint must agree with config.json. */
    const char *src = argv[1];
    expect_model_reject("truncated weights", make_model(src, "m_trunc", NULL, 100000), "outside the data section");
    char *c1 = config_with(src, "\"hidden_size\": 128", "\"hidden_size\": 96");
    expect_model_reject("shape vs config", make_model(src, "m_shape", c1, SIZE_MAX), "config.json implies");
    char *c2 = config_with(src, "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM");
    expect_model_reject("unknown architecture", make_model(src, "m_arch", c2, SIZE_MAX),
                        "supported: Qwen3MoeForCausalLM, MixtralForCausalLM");
    char *c3 = config_with(src, "\"rope_type\": \"default\"", "\"rope_type\": \"llama3\"");
    expect_model_reject("unsupported rope", make_model(src, "m_rope", c3, SIZE_MAX), "rope type 'llama3'");
    char *c4 = config_with(src, "\"num_local_experts\": 64", "\"num_local_experts\": 65");
    expect_model_reject("expert count", make_model(src, "m_exp", c4, SIZE_MAX), "implies [65, 128]");
    char *c5 = config_with(src, "\"vocab_size\": 4096", "\"vocab_size\": \"many\"");
    expect_model_reject("mistyped config", make_model(src, "m_type", c5, SIZE_MAX), "'vocab_size' must be an integer");
    expect_model_reject("config not JSON", make_model(src, "m_json", "{\"architectures\": [", SIZE_MAX), "invalid JSON");
    { /* YaRN (a long-context Qwen3 config): accepted, its table blended, its attention factor 0.1 ln(4) + 1 */
        char *c6 = config_with(src, "\"rope_type\": \"default\"",
                               "\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128");
        moet_model_options o = moet_model_default_options();
        o.device = "cpu";
        moet_model *m = NULL;
        char err[512];
        const int rc = moet_model_load(make_model(src, "m_yarn", c6, SIZE_MAX), &o, &m, err, sizeof err);
        CHECK(rc == 0, "yarn config: %s", err);
        if (!rc) {
            moet_model_info f;
            moet_model_info_get(m, &f);
            CHECK(!strcmp(f.rope_scaling, "yarn") && f.rope_factor == 4.0f, "yarn config: scaling %s x %g",
                  f.rope_scaling, (double)f.rope_factor);
            moet_model_free(m);
            fprintf(stderr, "accepted yarn rope           x %g\n", (double)f.rope_factor);
        }
        free(c6);
    }
    free(c1); free(c2); free(c3); free(c4); free(c5);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
    TEST_END();
}
