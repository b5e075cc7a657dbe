/* cuda_stub.c — the CUDA entry points of a build without CUDA (no nvcc found at configure time). */
#include <stdio.h>

#include "backend/backend.h"

moet_backend *moet_backend_cuda_create(int device, char *err, size_t errlen) {
    (void)device;
    if (err && errlen) snprintf(err, errlen, "this moet was built without CUDA (no nvcc at configure time)");
    return NULL;
}

int moet_backend_cuda_device_count(void) { return 0; }

int moet_backend_cuda_kernel_regs(const char *kernel) {
    (void)kernel;
    return -1;
}

long long moet_backend_cuda_launches(const char *kernel) {
    (void)kernel;
    return -1;
}
