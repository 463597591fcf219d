// kernels/cuda/cuda_stub.c - the CUDA backend's entry points in a build
// without nvcc: no device, and creating the backend fails with a clear
// message. Where nvcc built kernels/cuda/*.cu, build/paged links
// build/rel/libpaged_cuda.a whole and before libpaged.a, so the real
// definitions (backend_cuda.cu) win and this object is never pulled in.
// The NCCL communicator's stubs are kernels/comm/comm_nccl_stub.c.
#include <stdio.h>

#include "common/err.h"
#include "kernels/backend.h"

int pg_backend_cuda_probe(char *why, size_t cap) {
    snprintf(why, cap, "this binary was built without CUDA (no nvcc at build time)");
    return 0;
}

int pg_backend_cuda_attn_workspace(int32_t max_seqs, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                   int32_t max_len, size_t *bytes) {
    (void)max_seqs, (void)n_heads, (void)n_kv_heads, (void)head_dim, (void)max_len, (void)bytes;
    return 0;
}

int pg_backend_cuda_create(int device, pg_backend **out) {
    (void)device;
    *out = NULL;
    return pg_err_set(PG_EUNSUPP, "built without CUDA (no nvcc at build time)");
}
