// bench/bench_cuda_gemm_fp8.cu - FP8 weights in large batches: the W8A8
// product against the paths it replaces and against bf16.
//
// For the matrices of a Llama-3.1-8B layer (fused QKV 6144x4096, O
// 4096x4096, fused gate/up 28672x4096, down 4096x14336) and m from 16 to
// 8192 tokens, per call, each the median over 20 repetitions of 10
// back-to-back calls after warm-up (CUDA events):
//   fp8        pg_cuda_gemm_fp8 alone (activations already e4m3; cuBLASLt's
//              e4m3 product, then the rescale pass, whose share of the
//              time is the last column)
//   fp8+q      pg_cuda_quant_rows_fp8 then pg_cuda_gemm_fp8: what the
//              backend runs today (qgemm -> fp8_gemm)
//   fp8 fast   pg_cuda_gemm_fp8 with fast accumulation
//   deq+bf16   pg_cuda_qdequant_bf16 then pg_cuda_gemm_bf16: the path
//              FP8 weights took before (PAGED_CUDA_FP8_GEMM=0)
//   bf16       pg_cuda_gemm_bf16 on bf16 weights (the bf16 model)
//   cutlass    pg_cuda_gemm_fp8_cutlass: the one-pass kernel (last column)
// as TFLOP/s (2 m n k per call), and the summary of fp8+q against bf16 and
// deq+bf16. torch._scaled_mm on the same shapes: bench/cuda/scaled_mm_peer.py.
//
// Usage: build/gpu/bench_cuda_gemm_fp8 [--quick]   exit 77 = no CUDA device.
#include <string.h>

#include <vector>

#include "tests/gpu/gpu_util.h"
#include "bench/bench_cuda_util.cuh"
extern "C" {
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dtype.h"
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (!gpu_announce()) return 77;
    const int shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    const char *names[] = {"qkv", "o", "gate_up", "down"};
    std::vector<int> ms = {16, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
    if (quick) ms = {64, 1024, 4096};
    const int MAXM = 8192, MAXN = 28672, MAXK = 14336;
    const size_t WELEMS = (size_t)28672 * 4096; // the largest n * k
    pg_cuda_gemm *g = nullptr;
    PK(pg_cuda_gemm_create(&g));
    DBuf ws(PG_CUDA_GEMM_WORKSPACE);
    // Activations (bf16 and e4m3), one weight of each kind, the dequantized
    // scratch and the output, sized for the largest shape.
    DBuf x((size_t)MAXM * MAXK * 2), xq((size_t)MAXM * MAXK), xs((size_t)MAXM * 4), out((size_t)MAXM * MAXN * 2),
        wb(WELEMS * 2), wq(WELEMS), wsc((size_t)MAXN * 4), scratch(WELEMS * 2);
    fill_random(x.p, (size_t)MAXM * MAXK, 1, 2.0f);
    fill_random(wb.p, WELEMS, 2, 0.02f);
    {
        // Real e4m3 weight bytes and scales (random bytes would hold NaNs),
        // made as 28672 rows of 4096 and read as each shape's [n][k].
        std::vector<uint8_t> q(WELEMS);
        std::vector<float> sc((size_t)MAXN);
        parallel_for(MAXN, [&](int64_t row) {
            Rng rr(7 + (uint64_t)row);
            std::vector<float> w(4096);
            for (auto &v : w) v = rr.sym() * 0.02f;
            pg_quantize_row_fp8(w.data(), 4096, &q[(size_t)row * 4096], &sc[(size_t)row]);
        });
        wq.up(q);
        wsc.up(sc);
    }
    PK(pg_cuda_quant_rows_fp8(xq.p, MAXK, xs.as<float>(), x.p, MAXK, MAXM, MAXK, nullptr));
    CK(cudaDeviceSynchronize());
    const int WARM = 3, REPS = quick ? 7 : 20, INNER = 10;
    printf("%-8s %6s %6s %6s | %9s %9s %9s %9s %9s | %s\n", "matrix", "m", "n", "k", "fp8", "fp8+q", "fp8 fast",
           "deq+bf16", "bf16", "TFLOP/s; fp8+q / bf16, / deq+bf16; rescale's share of fp8");
    struct Row {
        const char *name;
        int m, n, k;
        double t[7];
    };
    std::vector<Row> rows;
    for (int s = 0; s < 4; s++) {
        const int n = shapes[s][0], k = shapes[s][1];
        for (int m : ms) {
            Row r{names[s], m, n, k, {0, 0, 0, 0, 0, 0, 0}};
            int rc = 0;
            auto chk = [&](int v) {
                if (v < 0 && rc == 0) rc = v;
            };
            r.t[0] = time_ms(WARM, REPS, INNER, [&](int) {
                chk(pg_cuda_gemm_fp8(g, out.p, n, xq.p, k, xs.as<float>(), wq.p, wsc.as<float>(), m, n, k, 0, 0, nullptr, 0,
                                     ws.p, ws.n, nullptr));
            });
            r.t[1] = time_ms(WARM, REPS, INNER, [&](int) {
                chk(pg_cuda_quant_rows_fp8(xq.p, k, xs.as<float>(), x.p, k, m, k, nullptr));
                chk(pg_cuda_gemm_fp8(g, out.p, n, xq.p, k, xs.as<float>(), wq.p, wsc.as<float>(), m, n, k, 0, 0, nullptr, 0,
                                     ws.p, ws.n, nullptr));
            });
            r.t[2] = time_ms(WARM, REPS, INNER, [&](int) {
                chk(pg_cuda_gemm_fp8(g, out.p, n, xq.p, k, xs.as<float>(), wq.p, wsc.as<float>(), m, n, k, 0, 1, nullptr, 0,
                                     ws.p, ws.n, nullptr));
            });
            r.t[3] = time_ms(WARM, REPS, INNER, [&](int) {
                chk(pg_cuda_qdequant_bf16(scratch.p, wq.p, wsc.as<float>(), PG_DTYPE_FP8_E4M3, n, k, nullptr));
                chk(pg_cuda_gemm_bf16(g, out.p, n, x.p, k, scratch.p, m, n, k, 0, ws.p, ws.n, nullptr));
            });
            r.t[4] = time_ms(WARM, REPS, INNER, [&](int) {
                chk(pg_cuda_gemm_bf16(g, out.p, n, x.p, k, wb.p, m, n, k, 0, ws.p, ws.n, nullptr));
            });
            r.t[5] = time_ms(WARM, REPS, INNER, [&](int) {
                chk(pg_cuda_fp8_rescale(out.p, n, out.p, n, xs.as<float>(), wsc.as<float>(), m, n, 0, nullptr));
            });
            {
                int crc = 0;
                double tc = time_ms(WARM, REPS, INNER, [&](int) {
                    int v = pg_cuda_gemm_fp8_cutlass(out.p, n, xq.p, xs.as<float>(), wq.p, wsc.as<float>(), m, n, k,
                                                     0, ws.p, ws.n, nullptr);
                    if (v < 0) crc = v;
                });
                r.t[6] = crc < 0 ? 0 : tc;
                if (crc < 0 && m == ms[0] && s == 0) printf("cutlass: %s\n", pg_err_msg());
            }
            if (rc < 0) {
                printf("%-8s %6d: error %s\n", r.name, m, pg_err_msg());
                continue;
            }
            const double fl = 2.0 * m * (double)n * k;
            double tf[5];
            for (int i = 0; i < 5; i++) tf[i] = fl / (r.t[i] * 1e-3) / 1e12;
            printf("%-8s %6d %6d %6d | %9.1f %9.1f %9.1f %9.1f %9.1f | %.2fx %.2fx %4.0f%% | cutlass %7.1f\n", r.name,
                   m, n, k, tf[0], tf[1], tf[2], tf[3], tf[4], r.t[4] / r.t[1], r.t[3] / r.t[1],
                   100.0 * r.t[5] / r.t[0], r.t[6] > 0 ? fl / (r.t[6] * 1e-3) / 1e12 : 0.0);
            fflush(stdout);
            rows.push_back(r);
        }
    }
    // One layer's four products per m: the sums of the times.
    printf("\nper layer (qkv + o + gate_up + down), ms and TFLOP/s\n");
    printf("%6s | %8s %8s %8s %8s %8s | %7s %7s\n", "m", "fp8", "fp8+q", "fp8fast", "deq+bf16", "bf16", "vs bf16",
           "vs deq");
    for (int m : ms) {
        double t[5] = {0, 0, 0, 0, 0}, fl = 0;
        int n_found = 0;
        for (auto &r : rows)
            if (r.m == m) {
                for (int i = 0; i < 5; i++) t[i] += r.t[i];
                fl += 2.0 * m * (double)r.n * r.k;
                n_found++;
            }
        if (n_found != 4) continue;
        printf("%6d | %8.3f %8.3f %8.3f %8.3f %8.3f | %6.2fx %6.2fx   (fp8+q %.0f TFLOP/s, bf16 %.0f)\n", m, t[0],
               t[1], t[2], t[3], t[4], t[4] / t[1], t[3] / t[1], fl / (t[1] * 1e-3) / 1e12,
               fl / (t[4] * 1e-3) / 1e12);
    }
    pg_cuda_gemm_destroy(g);
    return 0;
}
