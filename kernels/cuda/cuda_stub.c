// kernels/cuda/cuda_stub.c - the CUDA backend's entry points in a build
// without nvcc: no device, and creating the backend fails with a clear
// message. Where nvcc built kernels/cuda/*.cu, build/paged links
// build/rel/libpaged_cuda.a whole and before libpaged.a, so the real
// definitions (backend_cuda.cu) win and this object is never pulled in.
#include <stdio.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "kernels/comm/comm.h"

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

// The NCCL communicator (kernels/comm/comm.h): kernels/comm/comm_nccl.cu where
// nvcc exists.

int pg_comm_nccl_create_all(pg_backend *const *backends, int32_t n, pg_comm **out) {
    (void)backends;
    (void)n;
    if (out) *out = NULL;
    return pg_err_set(PG_EUNSUPP, "NCCL communicator: built without CUDA (no nvcc at build time)");
}

int pg_comm_nccl_unique_id(uint8_t out[PG_NCCL_ID_BYTES]) {
    (void)out;
    return pg_err_set(PG_EUNSUPP, "NCCL communicator: built without CUDA (no nvcc at build time)");
}

int pg_comm_nccl_create_rank(pg_backend *be, int32_t rank, int32_t size, const uint8_t id[PG_NCCL_ID_BYTES],
                             pg_comm **out) {
    (void)be;
    (void)rank;
    (void)size;
    (void)id;
    if (out) *out = NULL;
    return pg_err_set(PG_EUNSUPP, "NCCL communicator: built without CUDA (no nvcc at build time)");
}
