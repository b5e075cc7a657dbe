/* fuzz_gguf.c — libFuzzer target: the GGUF/pack validator on arbitrary bytes: accept or reject, never crash. */
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    moet_gguf_validate_buffer(data, size, err, sizeof err);
    return 0;
}
