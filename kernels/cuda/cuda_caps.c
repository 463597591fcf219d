// kernels/cuda/cuda_caps.c - what the CUDA backend can do (kernels/backend.h
// pg_backend_caps), in plain C so that every build has it: `paged plan`
// plans for a GPU without one, and the CUDA backend (backend_cuda.cu) hands
// the same table out as be->caps.
#include "kernels/backend.h"

// bf16, FP8 e4m3 and int4 run as stored (kernels/cuda/qgemv.cu, gemm.cu);
// every other type is dequantized to bf16 at upload.
static bool cuda_runs_type_in_place(int dtype) {
    return dtype == PG_DTYPE_BF16 || dtype == PG_DTYPE_FP8_E4M3 || pg_dtype_is_int4(dtype);
}

static const pg_backend_caps CUDA_CAPS = {
    .act_dtype = PG_DTYPE_BF16,
    .kv_native = PG_DTYPE_BF16,
    .weights_borrow = false,
    .measures_memory = true,
    .has_graphs = true,
    .attn_window = true, // every attention kernel takes a sliding window (attention.cu)
    .runs_in_place = cuda_runs_type_in_place,
    .weight_dtype = PG_DTYPE_BF16,
    .vector_bytes = 2,
};

const pg_backend_caps *pg_backend_cuda_caps(void) { return &CUDA_CAPS; }
