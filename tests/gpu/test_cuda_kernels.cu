// tests/gpu/test_cuda_kernels.cu - every CUDA kernel against a CPU reference.
//
// Random inputs (fresh per case), outputs poisoned before each launch (bf16
// NaN), references in fp64 on the bf16-rounded inputs; per case the
// relative error ||out - ref|| / ||ref|| is printed and checked against a
// bound suited to bf16. The sampler is compared with kernels/cpu/sampling.c
// itself (linked in): identical tokens for greedy and seeded sampling,
// logprobs within 1e-4. The quantized-weight cases (qgemv, qgemm) take their
// weights from kernels/dtype.c's quantizers (linked in).
//
// Usage: build/gpu/test_cuda_kernels [-k SUBSTRING]   exit 0 = all passed,
// 1 = a failure, 77 = no CUDA device (skipped).
#include <algorithm>
#include <numeric>
#include <string>

#include "tests/gpu/gpu_util.h"
#include "kernels/cuda/cuda_common.cuh" // pg_cuda_pdl_enabled / pg_cuda_pdl_set
#include "bench/cuda/attention_decode_v1.cuh" // decode v1 and v3, which left the library
#include "bench/cuda/attention_decode_v3.cuh" // for bench/cuda/ and are still checked here

extern "C" {
#include "kernels/backend.h" // pg_argmax, PG_DTYPE_*
#include "kernels/dtype.h"   // the quantizers and dequantizers (kernels/dtype.c, linked in)
#include "kernels/cpu/sampling.h"
#include "scheduler/plan.h"
}

static int g_pass = 0, g_fail = 0;
static const char *g_filter = "";
static const uint16_t POISON = 0xFFFF; // a bf16 NaN

static bool selected(const char *name) { return strstr(name, g_filter) != nullptr; }

static void report(const char *name, double err, double bound, const char *what = "rel_err") {
    bool ok = err == err && err <= bound;
    printf("%-4s %-68s %s %.3e (bound %.0e)\n", ok ? "ok" : "FAIL", name, what, err, bound);
    fflush(stdout);
    (ok ? g_pass : g_fail)++;
}
static void report_bool(const char *name, bool ok, const char *detail) {
    printf("%-4s %-68s %s\n", ok ? "ok" : "FAIL", name, detail);
    fflush(stdout);
    (ok ? g_pass : g_fail)++;
}

#include "tests/gpu/kernels_test_common.cuh"
#include "tests/gpu/kernels_test_decode.cuh"
#include "tests/gpu/kernels_test_prefill.cuh"
#include "tests/gpu/kernels_test_elementwise.cuh"
#include "tests/gpu/kernels_test_gemv.cuh"
#include "tests/gpu/kernels_test_pdl.cuh"
#include "tests/gpu/kernels_test_sampling.cuh"

// --- main ------------------------------------------------------------------------------

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-k") && i + 1 < argc) g_filter = argv[++i];
    if (!gpu_announce()) return 77;
    Rng r(20251129);

    printf("PDL (programmatic dependent launch): %s\n", pg_cuda_pdl_enabled() ? "on" : "off");
    {
        // Each GEMV kind against the register kernel without PDL, bit for bit.
        const int cases[][3] = {{0, 0, 0}, {1, 0, 0}, {1, 1, 0}, {2, 0, 0}, {2, 1, 0},
                                {3, 1, 0}, {4, 1, 0}, {1, 1, 1}, {2, 1, 1}};
        for (auto &c : cases) {
            Rng rp(20251202); // its own stream: the other cases keep their inputs
            test_pdl_chain(rp, c[0], c[1], c[2]);
        }
        test_l2_prefetch_args();
    }
    decode_tests(r);
    prefill_tests(r);
    {
        Rng rw(20261205); // its own stream: the other cases keep their inputs
        window_tests(rw);
    }
    {
        Rng rh(20261206); // its own stream: the other cases keep their inputs
        hd256_tests(rh);
    }

    test_rope(37, 32, 8, 128, 16, false, r);
    test_rope(64, 32, 8, 128, 16, true, r);
    test_rope(100, 9, 3, 64, 32, false, r);
    test_rope(5, 8, 8, 64, 16, true, r);
    test_rope(37, 32, 8, 128, 16, false, r, true);
    test_rope(64, 32, 8, 128, 16, true, r, true);
    test_rope(100, 9, 3, 64, 32, false, r, true);
    test_rope(64, 32, 8, 128, 16, true, r, true, true);
    test_rope(100, 9, 3, 64, 32, false, r, true, true);

    test_rmsnorm(7, 4096, true, false, r);
    test_rmsnorm(33, 576, true, false, r);
    test_rmsnorm(4, 8192, false, false, r);
    test_rmsnorm(3, 16384, true, false, r);
    test_rmsnorm(5, 100, true, false, r); // scalar path
    test_rmsnorm(9, 4096, false, true, r);
    test_add_bias(1, 4608, 4608, 0, r);      // Qwen2-7B fused QKV row: 28 + 2 x 4 heads of 128
    test_add_bias(7, 1152, 1160, 0, r);      // padded rows
    test_add_bias(300, 1152, 1160, 0, r);
    test_add_bias(7, 100, 103, 0, r);        // n not a multiple of 8: scalar path
    test_add_bias(300, 64, 72, 3, r);        // unaligned: scalar path
    // Qwen3 q/k norms on fused QKV rows [q heads | k heads | v heads].
    test_head_rmsnorm(1, 32, 128, (32 + 16) * 128, 0, r);        // q of 32 heads
    test_head_rmsnorm(7, 8, 128, (32 + 16) * 128, 32 * 128, r);  // k of 8 heads
    test_head_rmsnorm(300, 16, 128, (16 + 16) * 128, 0, r);
    test_head_rmsnorm(300, 8, 128, (16 + 16) * 128, 16 * 128, r);
    test_head_rmsnorm(300, 14, 64, (14 + 4) * 64, 0, r);
    test_head_rmsnorm(7, 2, 64, (14 + 4) * 64, 14 * 64, r);
    test_head_rmsnorm(7, 4, 256, 4 * 256 + 8, 0, r);             // the largest head_dim
    test_head_rmsnorm(7, 3, 64, 3 * 64 + 3, 1, r);               // odd stride, 2-byte aligned: scalar path
    test_norm_bias_refusals();
    test_silu(9, 14336, r);
    test_silu(17, 1536, r);
    test_silu(3, 100, r); // scalar path
    test_embed(40, 4096, 1000, r);
    test_embed(11, 100, 77, r);
    test_embed(40, 576, 16384, r, 16384);
    test_argmax(1, 7, 1000, r);
    test_argmax(2, 64, 64128, r);
    test_argmax(8, 300, 16032, r);
    test_argmax(3, 5, 17, r);
    {
        Rng rt(20251215); // its own stream: the other cases keep their inputs
        test_topk(1, 3, 1000, 8, rt);
        test_topk(2, 5, 1000, 50, rt);
        test_topk(4, 7, 32064, 20, rt);
        test_topk(2, 4, 40, 64, rt); // fewer columns than k: (-inf, -1) padding
        test_topk(8, 2, 16032, 64, rt);
        test_topk(1, 7, 128256, 64, rt); // one rank, a whole Llama-3 vocabulary
        test_topk(2, 5, 1000, 50, rt, true);
        test_topk(3, 7, 5000, 33, rt, true);
    }
    test_embed(33, 100, 77, r, 154);
    test_feed_tokens(1, 1, 1, r);
    test_feed_tokens(300, 256, 256, r);
    test_feed_tokens(2048, 256, 200, r);
    test_feed_tokens(5, 3, 0, r);
    test_copy_blocks(r);
    test_move_blocks_host(r);
    test_convert(r);

    pg_cuda_gemm *g = nullptr;
    PK(pg_cuda_gemm_create(&g));
    {
        DBuf ws(PG_CUDA_GEMM_WORKSPACE);
        test_gemm(g, ws, 1, 4096, 4096, 0, 4096, false, r);
        test_gemm(g, ws, 7, 576, 576, 0, 576, false, r);
        test_gemm(g, ws, 64, 1536, 576, 0, 1536, false, r);
        test_gemm(g, ws, 257, 1024, 4096, 0, 1024, false, r);
        test_gemm(g, ws, 16, 1024, 4096, 4096, 6144, false, r); // K slice of a fused QKV output
        test_gemm(g, ws, 33, 4096, 1024, 0, 4096, true, r);     // into the residual stream
        test_gemm(g, ws, 5, 100, 72, 8, 120, false, r);          // odd sizes
        // Every GEMV kind (pg_cuda_gemv_kernel_set), the ring kernels also
        // with their weights-before-wait path.
        const int kinds[][2] = {{0, 0}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {3, 1}, {4, 1}};
        for (auto &kp : kinds) {
            snprintf(g_gemv_tag, sizeof g_gemv_tag, " [kind %d%s]", kp[0], kp[1] ? " preload" : "");
            pg_cuda_gemv_kernel_set(kp[0]);
            pg_cuda_gemv_preload_set(kp[1]);
            Rng rg(20251201); // its own stream: the later cases keep their inputs
            gemv_tests(g, ws, rg);
        }
        pg_cuda_gemv_kernel_set(-1);
        pg_cuda_gemv_preload_set(0);
        g_gemv_tag[0] = 0;
        Rng rq(20260114); // its own stream: the later cases keep their inputs
        qgemv_tests(g, ws, rq);
    }
    pg_cuda_gemm_destroy(g);

    for (int vocab : {1000, 32000, 128256})
        for (int kind = 0; kind < N_KINDS; kind++) {
            test_sampling(vocab == 128256 ? 96 : 48, vocab, kind, false, r);
        }
    test_sampling(96, 128256, NORMAL1, true, r);
    test_sampling(256, 32000, NORMAL3, true, r);
    test_sampling_distribution(r);

    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
