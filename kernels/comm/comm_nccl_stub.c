// kernels/comm/comm_nccl_stub.c - the NCCL communicator (kernels/comm/comm.h)
// in a build without nvcc: creating it fails with a clear message. Where
// nvcc built kernels/comm/comm_nccl.cu, programs that run on the GPU link
// build/rel/libpaged_cuda.a whole and before libpaged.a, so the real
// definitions win and this object is never pulled in (as
// kernels/cuda/cuda_stub.c for the backend).
#include "common/err.h"
#include "kernels/comm/comm.h"

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
