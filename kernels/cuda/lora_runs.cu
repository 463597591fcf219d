// kernels/cuda/lora_runs.cu - long runs of one adapter's rows through
// cuBLASLt (cuda_ops.h pg_cuda_lora_apply_runs; docs/lora.md "Runs of one
// adapter through cuBLASLt"). A prefill chunk is up to 2,048 consecutive
// rows of one sequence, so of one adapter: for them LoRA is two thin
// matrix products, t = x . a^T ([rows][in] x [in][rank]) and out += scale *
// t . b^T ([rows][rank] x [rank][out]), which cuBLASLt runs on the tensor
// cores near the bytes they read, where lora.cu's BGMV reads the adapter
// once per row (session 25's profile: LoRA 48 ms of an 86 ms mixed step of
// 2,000 rows). The rows left (short runs: decode rows, rows of
// non-bf16 adapters or unaligned shapes) go to pg_cuda_lora_apply with the
// run rows set to -1.
//
// Numerics: t leaves cuBLASLt as bf16 (f32 sums, one rounding), is scaled
// in f32 and rounded to bf16 again, and the expand adds in f32 and rounds
// the output once: t in bf16, as vLLM's punica kernels cast the shrink's
// result to the adapter's type before the expand. BGMV keeps t in f32, so
// run rows differ from BGMV rows by those two roundings of t (bound in
// tests/gpu/test_cuda_lora.cu "lora runs").
#include <limits.h>

#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/dtype.h"

namespace {

// t[i] = bf16(f32(t[i]) * s) for i < n.
__global__ void lora_t_scale_kernel(bf16 *t, int64_t n, float s) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) t[i] = __float2bfloat16(__bfloat162float(t[i]) * s);
}

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

} // namespace

int pg_cuda_lora_apply_runs(pg_cuda_gemm *g, void *gemm_ws, size_t gemm_ws_bytes, int64_t min_run, void *out,
                            int64_t ldo, const void *x, int64_t ldx, int64_t m, int64_t in, int64_t out_cols,
                            const int32_t *row_slot, const pg_cuda_lora_slot *slots, int32_t n_slots, void *ws,
                            size_t ws_bytes, void *stream) {
    PG_ARG(m >= 0 && m <= INT_MAX && in >= 1 && out_cols >= 1 && ldx >= in && ldo >= out_cols && min_run >= 1,
           "cuda lora_apply_runs: %lld rows of %lld -> %lld, strides %lld / %lld, runs from %lld", (long long)m,
           (long long)in, (long long)out_cols, (long long)ldx, (long long)ldo, (long long)min_run);
    PG_ARG(n_slots >= 0 && (m == 0 || (row_slot && (slots || n_slots == 0))), "cuda lora_apply_runs: no slot table");
    if (m == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    PG_CUDA_TRY(cudaStreamIsCapturing(st, &cap));
    if (cap != cudaStreamCaptureStatusNone)
        return pg_err_set(PG_EUNSUPP, "cuda lora_apply_runs: not graph-safe (host rows and shapes)");
    for (int64_t i = 0; i < m; i++)
        PG_ARG(row_slot[i] >= -1 && row_slot[i] < n_slots, "cuda lora_apply_runs: row %lld names slot %d of %d",
               (long long)i, row_slot[i], n_slots);
    // t after the staging region pg_cuda_lora_apply keeps (its grouped
    // shape trusts a staging of the step's rows there), 256-byte aligned.
    const size_t t_off = (pg_cuda_lora_stage_size(m) + 255) & ~(size_t)255;
    const bool shapes_ok = g && ws && (in & 7) == 0 && (out_cols & 7) == 0 && (ldx & 7) == 0 && (ldo & 7) == 0 &&
                           aligned16(x) && aligned16(out) && aligned16((const char *)ws + t_off);
    std::vector<int32_t> rest(row_slot, row_slot + m);
    bool any_rest = false;
    const bf16 *xb = (const bf16 *)x;
    bf16 *ob = (bf16 *)out;
    bf16 *t = (bf16 *)((char *)ws + t_off);
    for (int64_t i = 0; i < m;) {
        const int32_t s = row_slot[i];
        int64_t j = i + 1;
        while (j < m && row_slot[j] == s) j++;
        const int64_t len = j - i;
        const pg_cuda_lora_slot *sl = s >= 0 ? &slots[s] : nullptr;
        const bool run = sl && sl->a && sl->b && sl->dtype == PG_DTYPE_BF16 && shapes_ok && len >= min_run &&
                         sl->rank >= 8 && (sl->rank & 7) == 0 && sl->rank <= PG_CUDA_LORA_MAX_RANK &&
                         aligned16(sl->a) && aligned16(sl->b) &&
                         t_off + (size_t)len * (size_t)sl->rank * sizeof(bf16) <= ws_bytes;
        if (run) {
            // Each run's products follow the last run's in stream order, so
            // one t serves them all.
            PG_TRY(pg_cuda_gemm_bf16(g, t, sl->rank, xb + i * ldx, ldx, sl->a, len, sl->rank, in, 0, gemm_ws,
                                     gemm_ws_bytes, st));
            if (sl->scale != 1.0f) {
                const int64_t n = len * sl->rank;
                lora_t_scale_kernel<<<(unsigned)pg_ceil_div(n, 256), 256, 0, st>>>(t, n, sl->scale);
                PG_CUDA_LAUNCHED("lora_t_scale_kernel");
            }
            PG_TRY(pg_cuda_gemm_bf16(g, ob + i * ldo, ldo, t, sl->rank, sl->b, len, out_cols, sl->rank, 1, gemm_ws,
                                     gemm_ws_bytes, st));
            for (int64_t k = i; k < j; k++) rest[(size_t)k] = -1;
        } else {
            any_rest = any_rest || (sl && sl->a);
        }
        i = j;
    }
    if (!any_rest) return 0;
    return pg_cuda_lora_apply(out, ldo, x, ldx, m, in, out_cols, rest.data(), slots, n_slots, ws, ws_bytes, 0,
                              stream);
}
