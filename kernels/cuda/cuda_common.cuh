// kernels/cuda/cuda_common.cuh - helpers shared by the kernels/cuda/*.cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_ops.h"

typedef __nv_bfloat16 bf16;

// Returns PG_EIO with file, line, the failing call and CUDA's reason.
#define PG_CUDA_TRY(call)                                                                  \
    do {                                                                                   \
        cudaError_t pg_e_ = (call);                                                        \
        if (pg_e_ != cudaSuccess)                                                          \
            return pg_err_set(PG_EIO, "%s:%d: %s: %s", __FILE__, __LINE__, #call,          \
                              cudaGetErrorString(pg_e_));                                  \
    } while (0)

// After a launch: a bad configuration or an earlier sticky error.
#define PG_CUDA_LAUNCHED(name) PG_CUDA_TRY(cudaGetLastError())

// Argument checks of launchers: PG_EINVAL with a message.
#define PG_ARG(cond, ...)                                                                  \
    do {                                                                                   \
        if (!(cond)) return pg_err_set(PG_EINVAL, __VA_ARGS__);                            \
    } while (0)

static inline cudaStream_t pg_stream(void *s) { return (cudaStream_t)s; }

static inline int pg_ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

// Multiprocessors of the current device (cached per device id).
int pg_cuda_sm_count(void);
