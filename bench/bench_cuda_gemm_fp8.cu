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
// --sweep: the one-pass kernel's configurations (pg_cuda_gemm_fp8_cutlass_cfg:
// tile, cluster, schedule, swapped or not) times the persistent scheduler's
// swizzle (1, 2, 8) and raster order (heuristic, along m, along n), against
// the default path as the model runs it: pg_cuda_gemm_fp8 (cuBLASLt, then
// the rescale pass; O and down accumulate into the residual, through tmp,
// as the backend does). m from 64 to 8192. Combinations a configuration
// declines (PG_EUNSUPP: a shape, or knobs it has not) are skipped. One line
// per (matrix, m) with cuBLASLt's figure, the best combination and the
// ratio, then every figure; --json FILE writes them all. Each timing is the
// median of 5 repetitions sized to ~60 ms in all from a short probe of the
// same combination, so the sweep's length hardly depends on the shapes or
// the rates: 32 (matrix, m) x (1 + 30 combinations) x at most ~70 ms (60
// timed, a probe, warm-ups), about 70 s, and under 80 s with the set-up.
//
// Usage: build/gpu/bench_cuda_gemm_fp8 [--quick | --sweep [--json FILE]]
//   exit 77 = no CUDA device.
#include <string.h>
#include <time.h>

#include <string>
#include <vector>

#include "tests/gpu/gpu_util.h"
#include "bench/bench_cuda_util.cuh"
extern "C" {
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dtype.h"
}

// --- the configuration sweep (--sweep) ----------------------------------------------------

// One combination's timing at one (matrix, m).
struct SweepCell {
    int cfg, swizzle, raster;
    double ms;
};
struct SweepPoint {
    const char *name;
    int m, n, k, acc;
    double lt_ms; // pg_cuda_gemm_fp8: cuBLASLt + rescale
    std::vector<SweepCell> cells;
};

static const char *raster_name(int r) { return r == 0 ? "heur" : r == 1 ? "m" : "n"; }
static double tflops(double fl, double ms) { return ms > 0 ? fl / (ms * 1e-3) / 1e12 : 0.0; }
static double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// time_ms with the repetitions sized from a probe: 5 medians of `inner`
// calls, ~kTargetMs in all, whatever one call costs (1 to 200 calls).
template <typename F> static double time_sized(F f) {
    const double kTargetMs = 60.0;
    const int kReps = 5;
    const double probe = time_ms(1, 1, 2, f);
    const int inner = (int)std::max(1.0, std::min(200.0, kTargetMs / kReps / std::max(probe, 1e-4)));
    return time_ms(1, kReps, inner, f);
}

static void sweep_json(const char *path, const char *dev, const std::vector<SweepPoint> &pts, int n_cfgs) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return;
    }
    fprintf(f, "{\n  \"benchmark\": \"bench_cuda_gemm_fp8 --sweep\",\n  \"device\": \"%s\",\n  \"configs\": [", dev);
    for (int c = 0; c < n_cfgs; c++)
        fprintf(f, "%s\"%s\"", c ? ", " : "", pg_cuda_gemm_fp8_cutlass_cfg_name(c));
    fprintf(f, "],\n  \"points\": [\n");
    for (size_t i = 0; i < pts.size(); i++) {
        const SweepPoint &p = pts[i];
        const double fl = 2.0 * p.m * (double)p.n * p.k;
        fprintf(f,
                "    {\"matrix\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"accumulate\": %d, "
                "\"cublaslt_ms\": %.5f, \"cublaslt_tflops\": %.1f, \"cutlass\": [",
                p.name, p.m, p.n, p.k, p.acc, p.lt_ms, tflops(fl, p.lt_ms));
        for (size_t j = 0; j < p.cells.size(); j++) {
            const SweepCell &c = p.cells[j];
            fprintf(f, "%s\n      {\"cfg\": %d, \"swizzle\": %d, \"raster\": \"%s\", \"ms\": %.5f, \"tflops\": %.1f}",
                    j ? "," : "", c.cfg, c.swizzle, raster_name(c.raster), c.ms, tflops(fl, c.ms));
        }
        fprintf(f, "]}%s\n", i + 1 < pts.size() ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
    printf("wrote %s\n", path);
}

// xq, xs: activations for MAXM rows of MAXK; wq, wsc: the weight bytes and
// scales, read as each shape's [n][k]; out: MAXM x MAXN bf16.
static int sweep(const char *json, const char *dev, pg_cuda_gemm *g, DBuf &ws, DBuf &xq, DBuf &xs, DBuf &wq,
                 DBuf &wsc, DBuf &out) {
    struct Mat {
        const char *name;
        int n, k, acc;
    };
    const Mat mats[] = {{"qkv", 6144, 4096, 0}, {"o", 4096, 4096, 1}, {"gate_up", 28672, 4096, 0}, {"down", 4096, 14336, 1}};
    const int ms[] = {64, 128, 256, 512, 1024, 2048, 4096, 8192};
    const int swizzles[] = {1, 2, 8};
    int n_cfgs = 0;
    while (pg_cuda_gemm_fp8_cutlass_cfg_name(n_cfgs)) n_cfgs++;
    if (!n_cfgs) {
        printf("skipped: built without CUTLASS (no configurations)\n");
        return 77;
    }
    for (int c = 0; c < n_cfgs; c++) printf("config %d: %s\n", c, pg_cuda_gemm_fp8_cutlass_cfg_name(c));
    DBuf tmp((size_t)8192 * 4096 * 2); // the accumulating matrices' raw sums (n = 4096)
    fill_random(out.p, (size_t)8192 * 28672, 3, 1.0f); // the residual: finite values
    const double t0 = now_s();
    std::vector<SweepPoint> pts;
    int errors = 0;
    printf("\n%-8s %5s | %9s | %-34s %9s | %6s | %9s\n", "matrix", "m", "cuBLASLt", "best CUTLASS (cfg sw raster)",
           "TFLOP/s", "ratio", "c0 default");
    for (const Mat &mt : mats)
        for (int m : ms) {
            SweepPoint p{mt.name, m, mt.n, mt.k, mt.acc, 0, {}};
            const int n = mt.n, k = mt.k;
            int rc = 0;
            p.lt_ms = time_sized([&](int) {
                int v = pg_cuda_gemm_fp8(g, out.p, n, xq.p, k, xs.as<float>(), wq.p, wsc.as<float>(), m, n, k,
                                         mt.acc, 0, mt.acc ? tmp.p : nullptr, mt.acc ? tmp.n : 0, ws.p, ws.n,
                                         nullptr);
                if (v < 0 && !rc) rc = v;
            });
            if (rc < 0) {
                printf("%-8s %5d: cuBLASLt error %s\n", mt.name, m, pg_err_msg());
                errors++;
            }
            for (int c = 0; c < n_cfgs; c++)
                for (int sw : swizzles)
                    for (int ra = 0; ra < 3; ra++) {
                        auto call = [&]() {
                            return pg_cuda_gemm_fp8_cutlass_cfg(c, sw, ra, out.p, n, xq.p, xs.as<float>(), wq.p,
                                                                wsc.as<float>(), m, n, k, mt.acc, ws.p, ws.n,
                                                                nullptr);
                        };
                        const int v = call(); // a refusal costs nothing; else a warm-up
                        if (v == PG_EUNSUPP) continue;
                        if (v < 0) {
                            printf("%-8s %5d: c%d sw %d raster %s: error %s\n", mt.name, m, c, sw, raster_name(ra),
                                   pg_err_msg());
                            errors++;
                            continue;
                        }
                        p.cells.push_back({c, sw, ra, time_sized([&](int) { call(); })});
                    }
            CK(cudaDeviceSynchronize());
            const double fl = 2.0 * m * (double)n * k;
            const SweepCell *best = nullptr, *def = nullptr;
            for (const SweepCell &c : p.cells) {
                if (!best || c.ms < best->ms) best = &c;
                if (c.cfg == 0 && c.swizzle == 1 && c.raster == 0) def = &c;
            }
            char what[64] = "-";
            if (best)
                snprintf(what, sizeof what, "%.26s sw%d %s", pg_cuda_gemm_fp8_cutlass_cfg_name(best->cfg),
                         best->swizzle, raster_name(best->raster));
            printf("%-8s %5d | %9.1f | %-34s %9.1f | %5.2fx | %9.1f\n", mt.name, m, tflops(fl, p.lt_ms), what,
                   best ? tflops(fl, best->ms) : 0.0, best ? p.lt_ms / best->ms : 0.0, def ? tflops(fl, def->ms) : 0.0);
            pts.push_back(p);
        }
    const double secs = now_s() - t0;
    // Every figure: one line per (matrix, m, configuration), its swizzle x
    // raster grid (a configuration without a scheduler has one figure).
    printf("\nall figures, TFLOP/s (swizzle/raster)\n%-8s %5s %-28s", "matrix", "m", "config");
    for (int sw : swizzles)
        for (int ra = 0; ra < 3; ra++) printf(" %4d/%-4s", sw, raster_name(ra));
    printf("\n");
    for (const SweepPoint &p : pts) {
        const double fl = 2.0 * p.m * (double)p.n * p.k;
        for (int c = 0; c < n_cfgs; c++) {
            std::string line;
            bool any = false;
            for (int sw : swizzles)
                for (int ra = 0; ra < 3; ra++) {
                    char cell[16] = "         -";
                    for (const SweepCell &x : p.cells)
                        if (x.cfg == c && x.swizzle == sw && x.raster == ra) {
                            snprintf(cell, sizeof cell, " %9.1f", tflops(fl, x.ms));
                            any = true;
                        }
                    line += cell;
                }
            if (any) printf("%-8s %5d %-28s%s\n", p.name, p.m, pg_cuda_gemm_fp8_cutlass_cfg_name(c), line.c_str());
        }
        printf("%-8s %5d %-28s %9.1f\n", p.name, p.m, "cuBLASLt + rescale", tflops(fl, p.lt_ms));
    }
    printf("\nsweep: %.1f s, %d errors\n", secs, errors);
    if (json) sweep_json(json, dev, pts, n_cfgs);
    return errors ? 1 : 0;
}

int main(int argc, char **argv) {
    bool quick = false, do_sweep = false;
    const char *json = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--sweep")) do_sweep = true;
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    }
    char dev[256] = "";
    if (!gpu_announce(dev, sizeof dev)) return 77;
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
    if (do_sweep) {
        const int rc = sweep(json, dev, g, ws, xq, xs, wq, wsc, out);
        pg_cuda_gemm_destroy(g);
        return rc;
    }
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
