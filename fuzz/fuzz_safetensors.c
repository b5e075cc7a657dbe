/* fuzz_safetensors.c — libFuzzer target: any byte string given to the safetensors validator is either accepted with
 * every tensor inside the data section or rejected with a message; never a crash, leak or out-of-bounds read. */
#include <stddef.h>
#include <stdint.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    moet_st_validate_buffer("fuzz", data, size, err, sizeof err);
    return 0;
}
