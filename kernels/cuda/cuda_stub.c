// kernels/cuda/cuda_stub.c - the CUDA backend's entry points in a build
// without nvcc: no device, and creating the backend fails with a clear
// message. Where nvcc built kernels/cuda/*.cu, build/paged links
// build/rel/libpaged_cuda.a whole and before libpaged.a, so the real
// definitions (backend_cuda.cu) win and this object is never pulled in.
#include <stdio.h>

#include "common/err.h"
#include "kernels/backend.h"

int pg_backend_cuda_probe(char *why, size_t cap) {
    snprintf(why, cap, "this binary was built without CUDA (no nvcc at build time)");
    return 0;
}

int pg_backend_cuda_create(int device, pg_backend **out) {
    (void)device;
    *out = NULL;
    return pg_err_set(PG_EUNSUPP, "built without CUDA (no nvcc at build time)");
}
