// bench/bench_cuda_attention.cu - W5: paged attention against measured ceilings.
//
// In one binary, on random data:
//   ceilings  read bandwidth (a sum over a 4 GiB bf16 buffer, 16-byte loads)
//             and the bf16 GEMM rate (cuBLASLt through pg_cuda_gemm_bf16,
//             8192^3);
//   decode    pg_cuda_paged_decode_attention v4, v2 and bench/cuda/'s v3
//             (bf16 KV) and v2, v4 (fp8 KV) for batch {1,16,64,256} x
//             context {512,4096,32768}, 32 query / 8 KV heads, head 128,
//             block 16: bytes of K, V, q and out over time, against the read
//             bandwidth, and fp8's KV tokens/s over bf16 v2's; bench/cuda/'s
//             v1 on a few points for comparison (--decode: only these and
//             the read ceiling);
//   prefill   pg_cuda_paged_prefill_attention, causal FLOPs (4 * head_dim
//             per (query, key, head) pair actually attended) over time,
//             against the GEMM rate;
//   others    the sampler and the element-wise kernels at batch 256.
// Each time is the median of repeated launches after warm-up, with CUDA
// events; calls whose data would sit in L2 rotate over several disjoint
// copies of their KV blocks. The summary table is printed last; --json
// PATH writes every number.
#include <algorithm>
#include <numeric>
#include <string>

#include "tests/gpu/gpu_util.h"
#include "bench/bench_cuda_util.cuh"
#include "bench/cuda/attention_decode_v1.cuh" // decode v1 and v3: numbered versions the library
#include "bench/cuda/attention_decode_v3.cuh" // no longer carries, timed here

// Sum of 16-byte words (xor-folded), one partial per CTA: reads every byte once.
__global__ void read_kernel(const uint4 *p, size_t n, uint32_t *out) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(p + i);
        acc += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc; // never true on random data; keeps the loads
}

// --- results ---------------------------------------------------------------------------------

struct Row {
    std::string kind, what;
    double ms, value, pct; // value: GB/s or TFLOP/s; pct of the ceiling
    std::string unit, extra;
};
static std::vector<Row> rows;

static void json_write(const char *path, double read_bw, double gemm_tflops, const char *dev) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return;
    }
    fprintf(f, "{\n  \"benchmark\": \"bench_cuda_attention\",\n  \"device\": \"%s\",\n", dev);
    fprintf(f, "  \"read_bandwidth_GBps\": %.1f,\n  \"gemm_bf16_tflops\": %.1f,\n  \"rows\": [\n", read_bw, gemm_tflops);
    for (size_t i = 0; i < rows.size(); i++) {
        const Row &r = rows[i];
        fprintf(f,
                "    {\"kind\": \"%s\", \"case\": \"%s\", \"ms\": %.5f, \"value\": %.2f, \"unit\": \"%s\", "
                "\"pct_of_ceiling\": %.1f, \"extra\": \"%s\"}%s\n",
                r.kind.c_str(), r.what.c_str(), r.ms, r.value, r.unit.c_str(), r.pct, r.extra.c_str(),
                i + 1 < rows.size() ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
}

// --- main -----------------------------------------------------------------------------------

int main(int argc, char **argv) {
    const char *json = nullptr;
    bool quick = false, decode_only = false; // --decode: the read ceiling and decode attention only
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--decode")) decode_only = true;
    }
    char dev[256];
    if (!gpu_announce(dev, sizeof dev)) return 77;
    const int REPS = quick ? 5 : 21;

    // Ceiling 1: read bandwidth over 4 GiB.
    double read_bw;
    {
        const size_t bytes = (size_t)4 << 30;
        DBuf buf(bytes), sink(4096 * 4);
        fill_random(buf.p, bytes / 2, 1);
        double ms = time_ms(3, REPS, 1, [&](int) {
            read_kernel<<<132 * 16, 512>>>(buf.as<uint4>(), bytes / 16, sink.as<uint32_t>());
        });
        read_bw = bytes / ms / 1e6;
        printf("read bandwidth: %.1f GB/s (4 GiB, %.3f ms)\n", read_bw, ms);
        rows.push_back({"ceiling", "read 4 GiB", ms, read_bw, 100.0, "GB/s", ""});
    }

    // Ceiling 2: bf16 GEMM rate, 8192^3 on random data.
    pg_cuda_gemm *gemm = nullptr;
    PK(pg_cuda_gemm_create(&gemm));
    DBuf gws(PG_CUDA_GEMM_WORKSPACE);
    double gemm_tflops = 0.0;
    if (!decode_only) {
        const int N = 8192;
        const size_t wmax = (size_t)28672 * 4096; // the largest weight below (gate_up)
        DBuf a((size_t)N * N * 2), b(wmax * 2), c((size_t)N * N * 2);
        fill_random(a.p, (size_t)N * N, 2);
        fill_random(b.p, wmax, 3);
        double ms = time_ms(3, quick ? 3 : 11, 1, [&](int) {
            PK(pg_cuda_gemm_bf16(gemm, c.p, N, a.p, N, b.p, N, N, N, 0, gws.p, gws.n, nullptr));
        });
        gemm_tflops = 2.0 * N * N * (double)N / ms / 1e9;
        printf("bf16 GEMM 8192^3: %.1f TFLOP/s (%.3f ms)\n", gemm_tflops, ms);
        rows.push_back({"ceiling", "gemm bf16 8192^3", ms, gemm_tflops, 100.0, "TFLOP/s", ""});
        // Decode-time GEMM shapes of llama3-8b (fused QKV, O, gate/up, down) at batch 256.
        struct {
            int m, n, k;
            const char *name;
        } gs[] = {{256, 6144, 4096, "qkv"}, {256, 4096, 4096, "o"}, {256, 28672, 4096, "gate_up"}, {256, 4096, 14336, "down"},
                  {1, 6144, 4096, "qkv"}, {1, 28672, 4096, "gate_up"}};
        for (auto &g : gs) {
            double t = time_ms(3, REPS, 10, [&](int) {
                PK(pg_cuda_gemm_bf16(gemm, c.p, g.n, a.p, g.k, b.p, g.m, g.n, g.k, 0, gws.p, gws.n, nullptr));
            });
            double bytes = 2.0 * ((double)g.n * g.k + (double)g.m * g.k + (double)g.m * g.n);
            char nm[96];
            snprintf(nm, sizeof nm, "gemm %s m=%d n=%d k=%d", g.name, g.m, g.n, g.k);
            double tf = 2.0 * g.m * g.n * (double)g.k / t / 1e9;
            char ex[96];
            snprintf(ex, sizeof ex, "%.0f GB/s weights+act", bytes / t / 1e6);
            printf("%-40s %8.4f ms %7.1f TFLOP/s  %s\n", nm, t, tf, ex);
            rows.push_back({"gemm", nm, t, tf, 100.0 * tf / gemm_tflops, "TFLOP/s", ex});
        }
    }

    // Paged KV pool for the largest decode point: 256 x 32768 tokens.
    const int H = 32, KV = 8, HD = 128, BS = 16;
    const size_t max_tokens = (size_t)256 * 32768;
    const int n_blocks = (int)(max_tokens / BS) + 64;
    const size_t blk_elems = (size_t)BS * KV * HD;
    DBuf kc((size_t)n_blocks * blk_elems * 2), vc((size_t)n_blocks * blk_elems * 2);
    fill_random(kc.p, (size_t)n_blocks * blk_elems, 11);
    fill_random(vc.p, (size_t)n_blocks * blk_elems, 12);
    pg_kv_shape shape = {n_blocks, BS, KV, HD, PG_KV_BF16};
    std::vector<int32_t> perm(n_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    Rng rng(7);
    for (int i = n_blocks - 1; i > 0; i--) std::swap(perm[i], perm[rng.below(i + 1)]);
    const float scale = 1.0f / sqrtf((float)HD);

    // --- decode ---
    printf("\n== decode attention (v3 persistent balanced, v2 split-K grid, v1 CUDA cores; %d q / %d kv heads, head %d, block %d)\n", H, KV, HD, BS);
    const size_t ws_bytes = bench_decode_v3_workspace_size(256, H, KV, HD, 32768); // v3's need and the library's
    DBuf dws(ws_bytes);
    for (int batch : {1, 16, 64, 256})
        for (int ctx : {512, 4096, 32768}) {
            const int bps = ctx / BS;
            const double bytes = (double)batch * ctx * KV * HD * 2 * 2 + (double)batch * H * HD * 2 * 2;
            // Rotate over disjoint block sets while one call's KV fits in L2 several times.
            int sets = (int)std::min<double>(8.0, std::ceil(512e6 / bytes));
            if ((size_t)sets * batch * bps > (size_t)n_blocks) sets = (int)(n_blocks / ((size_t)batch * bps));
            if (sets < 1) sets = 1;
            std::vector<int32_t> bt((size_t)sets * batch * bps);
            for (size_t i = 0; i < bt.size(); i++) bt[i] = perm[i];
            std::vector<int32_t> lens(batch, ctx);
            DBuf dbt, dlen, dq((size_t)batch * H * HD * 2), dout((size_t)batch * H * HD * 2);
            dbt.up(bt);
            dlen.up(lens);
            fill_random(dq.p, (size_t)batch * H * HD, 5, 2.0f);
            double ms_bf16_v2 = 0.0; // for the fp8 KV tokens/s ratios
            for (int version : {4, 3, 2, 1}) {
                if (version == 1 && !(batch == 16 && ctx == 4096) && !(batch == 1 && ctx == 32768)) continue;
                double ms = time_ms(3, REPS, 10, [&](int it) {
                    const int32_t *t = dbt.as<int32_t>() + (size_t)(it % sets) * batch * bps;
                    if (version == 1)
                        PK(bench_decode_v1(dout.p, dq.p, H * HD, kc.p, vc.p, shape, t, bps, dlen.as<int32_t>(), batch,
                                           H, scale, nullptr));
                    else if (version == 3)
                        PK(bench_decode_v3(dout.p, dq.p, H * HD, kc.p, vc.p, shape, t, bps, dlen.as<int32_t>(), batch,
                                           H, scale, ctx, dws.p, dws.n, nullptr));
                    else
                        PK(pg_cuda_paged_decode_attention_v(version, dout.p, dq.p, H * HD, kc.p, vc.p, shape, t, bps,
                                                            dlen.as<int32_t>(), batch, H, scale, ctx, dws.p, dws.n,
                                                            nullptr));
                });
                if (version == 2) ms_bf16_v2 = ms;
                double gbs = bytes / ms / 1e6;
                char nm[96], ex[96];
                snprintf(nm, sizeof nm, "decode v%d batch=%d ctx=%d", version, batch, ctx);
                snprintf(ex, sizeof ex, "%.1f MB, %d rotation sets", bytes / 1e6, sets);
                printf("%-40s %8.4f ms %8.1f GB/s %5.1f%% of read BW  (%s)\n", nm, ms, gbs, 100.0 * gbs / read_bw, ex);
                rows.push_back({"decode", nm, ms, gbs, 100.0 * gbs / read_bw, "GB/s", ex});
            }
            // fp8 e4m3 KV through v2 and v4: the same pool read as 1-byte elements
            // (half the bytes per token); the ratio is KV tokens/s against bf16 v2.
            for (int version : {2, 4}) {
                pg_kv_shape shape8 = shape;
                shape8.dtype = PG_KV_FP8_E4M3;
                const double bytes8 = (double)batch * ctx * KV * HD * 1 * 2 + (double)batch * H * HD * 2 * 2;
                double ms = time_ms(3, REPS, 10, [&](int it) {
                    const int32_t *t = dbt.as<int32_t>() + (size_t)(it % sets) * batch * bps;
                    PK(pg_cuda_paged_decode_attention_v(version, dout.p, dq.p, H * HD, kc.p, vc.p, shape8, t, bps,
                                                        dlen.as<int32_t>(), batch, H, scale, ctx, dws.p, dws.n,
                                                        nullptr));
                });
                double gbs = bytes8 / ms / 1e6;
                char nm[96], ex[160];
                snprintf(nm, sizeof nm, "decode v%d fp8 batch=%d ctx=%d", version, batch, ctx);
                snprintf(ex, sizeof ex, "%.1f MB (1 byte/element), %d rotation sets, %.2e KV tokens/s, x%.2f bf16 v2",
                         bytes8 / 1e6, sets, (double)batch * ctx / ms * 1e3, ms_bf16_v2 / ms);
                printf("%-40s %8.4f ms %8.1f GB/s %5.1f%% of read BW  (%s)\n", nm, ms, gbs, 100.0 * gbs / read_bw, ex);
                rows.push_back({"decode", nm, ms, gbs, 100.0 * gbs / read_bw, "GB/s", ex});
            }
        }

    if (!decode_only) {
        // --- prefill ---
        printf("\n== prefill attention (tensor cores, causal, varlen; %d q / %d kv heads, head %d, block %d)\n", H, KV, HD, BS);
        struct PCase {
            int n_seqs, n_q, start;
        } pcs[] = {{1, 4096, 0}, {4, 2048, 0}, {16, 512, 3584}, {8, 1024, 0}, {2, 8192, 0}};
        for (auto &pc : pcs) {
            const int ctx = pc.start + pc.n_q, bps = (ctx + BS - 1) / BS;
            std::vector<int32_t> bt((size_t)pc.n_seqs * bps), cu(pc.n_seqs + 1), sp(pc.n_seqs, pc.start);
            for (size_t i = 0; i < bt.size(); i++) bt[i] = perm[i];
            for (int s = 0; s <= pc.n_seqs; s++) cu[s] = s * pc.n_q;
            const int T = pc.n_seqs * pc.n_q;
            DBuf dbt, dcu, dsp, dq((size_t)T * H * HD * 2), dout((size_t)T * H * HD * 2);
            dbt.up(bt);
            dcu.up(cu);
            dsp.up(sp);
            fill_random(dq.p, (size_t)T * H * HD, 9, 2.0f);
            for (int version : {2, 1}) {
                double ms = time_ms(2, quick ? 3 : 11, 3, [&](int) {
                    PK(pg_cuda_paged_prefill_attention_v(version, dout.p, dq.p, H * HD, kc.p, vc.p, shape,
                                                         dbt.as<int32_t>(), bps, dcu.as<int32_t>(), dsp.as<int32_t>(),
                                                         pc.n_seqs, H, scale, pc.n_q, nullptr));
                });
                // Keys attended: query i of a chunk at start s sees s + i + 1 keys.
                double pairs = (double)pc.n_seqs * ((double)pc.n_q * pc.start + (double)pc.n_q * (pc.n_q + 1) / 2.0);
                double tf = 4.0 * HD * H * pairs / ms / 1e9;
                char nm[96];
                snprintf(nm, sizeof nm, "prefill v%d seqs=%d q=%d start=%d", version, pc.n_seqs, pc.n_q, pc.start);
                printf("%-44s %8.4f ms %7.1f TFLOP/s %5.1f%% of GEMM rate\n", nm, ms, tf, 100.0 * tf / gemm_tflops);
                rows.push_back({"prefill", nm, ms, tf, 100.0 * tf / gemm_tflops, "TFLOP/s", ""});
            }
            { // fp8 e4m3 KV through the default (v2)
                pg_kv_shape shape8 = shape;
                shape8.dtype = PG_KV_FP8_E4M3;
                double ms = time_ms(2, quick ? 3 : 11, 3, [&](int) {
                    PK(pg_cuda_paged_prefill_attention_v(2, dout.p, dq.p, H * HD, kc.p, vc.p, shape8, dbt.as<int32_t>(),
                                                         bps, dcu.as<int32_t>(), dsp.as<int32_t>(), pc.n_seqs, H, scale,
                                                         pc.n_q, nullptr));
                });
                double pairs = (double)pc.n_seqs * ((double)pc.n_q * pc.start + (double)pc.n_q * (pc.n_q + 1) / 2.0);
                double tf = 4.0 * HD * H * pairs / ms / 1e9;
                char nm[96];
                snprintf(nm, sizeof nm, "prefill v2 fp8 seqs=%d q=%d start=%d", pc.n_seqs, pc.n_q, pc.start);
                printf("%-44s %8.4f ms %7.1f TFLOP/s %5.1f%% of GEMM rate\n", nm, ms, tf, 100.0 * tf / gemm_tflops);
                rows.push_back({"prefill", nm, ms, tf, 100.0 * tf / gemm_tflops, "TFLOP/s", ""});
            }
        }

        // --- sampler and element-wise kernels at batch 256 ---
        printf("\n== other kernels (batch 256)\n");
        {
            const int n = 256, vocab = 128256;
            DBuf logits((size_t)n * vocab * 2), out((size_t)n * sizeof(pg_sample_out)),
                ws(pg_cuda_sample_workspace_size(n, vocab));
            fill_random(logits.p, (size_t)n * vocab, 21, 8.0f);
            std::vector<int32_t> tokens(64);
            for (auto &t : tokens) t = rng.below(vocab);
            DBuf dt;
            dt.up(tokens);
            struct {
                const char *name;
                float temp, top_p;
                int top_k, logprobs;
                float rep;
            } sc[] = {{"greedy", 0.0f, 1.0f, 0, -1, 1.0f},
                      {"greedy+logprobs5", 0.0f, 1.0f, 0, 5, 1.0f},
                      {"T=1", 1.0f, 1.0f, 0, -1, 1.0f},
                      {"T=0.7 top_p=0.9", 0.7f, 0.9f, 0, -1, 1.0f},
                      {"T=0.8 top_k=50 top_p=0.95 rep=1.1 lp=20", 0.8f, 0.95f, 50, 20, 1.1f}};
            for (auto &c : sc) {
                std::vector<pg_sample_params> p(n);
                for (int s = 0; s < n; s++) {
                    memset(&p[s], 0, sizeof p[s]);
                    p[s].temperature = c.temp;
                    p[s].top_p = c.top_p;
                    p[s].top_k = c.top_k;
                    p[s].logprobs = c.logprobs;
                    p[s].repetition_penalty = c.rep;
                    p[s].seed = 99 + s;
                    p[s].n_history = 64;
                }
                DBuf dp;
                dp.up(p);
                double ms = time_ms(2, REPS, 3, [&](int) {
                    PK(pg_cuda_sample(out.as<pg_sample_out>(), logits.p, PG_CUDA_BF16, vocab, n, vocab,
                                      dp.as<pg_sample_params>(), dt.as<int32_t>(), ws.p, ws.n, nullptr));
                });
                char nm[96];
                snprintf(nm, sizeof nm, "sample 256x128256 bf16 %s", c.name);
                printf("%-58s %8.4f ms\n", nm, ms);
                rows.push_back({"sampler", nm, ms, ms * 1000.0, 0.0, "us", ""});
            }
            const int dim = 4096, ffn = 14336;
            DBuf x((size_t)n * dim * 2), r((size_t)n * dim * 2), w(dim * 2), o((size_t)n * dim * 2), gu((size_t)n * 2 * ffn * 2),
                so((size_t)n * ffn * 2);
            fill_random(x.p, (size_t)n * dim, 31);
            fill_random(r.p, (size_t)n * dim, 32);
            fill_random(w.p, dim, 33);
            fill_random(gu.p, (size_t)n * 2 * ffn, 34);
            double ms = time_ms(3, REPS, 20, [&](int) { PK(pg_cuda_add_rmsnorm(o.p, x.p, r.p, w.p, n, dim, 1e-5f, nullptr)); });
            double gbs = (double)n * dim * 2 * 4 / ms / 1e6;
            printf("%-58s %8.4f ms %8.1f GB/s\n", "add_rmsnorm 256x4096", ms, gbs);
            rows.push_back({"elementwise", "add_rmsnorm 256x4096", ms, gbs, 100.0 * gbs / read_bw, "GB/s", ""});
            ms = time_ms(3, REPS, 20, [&](int) { PK(pg_cuda_silu_mul(so.p, gu.p, n, ffn, nullptr)); });
            gbs = (double)n * ffn * 2 * 3 / ms / 1e6;
            printf("%-58s %8.4f ms %8.1f GB/s\n", "silu_mul 256x14336", ms, gbs);
            rows.push_back({"elementwise", "silu_mul 256x14336", ms, gbs, 100.0 * gbs / read_bw, "GB/s", ""});
        }
    }

    // --- summary (W5) ---
    for (const char *variant : {"v2", "v3", "v4", "v2 fp8", "v4 fp8"}) {
        printf("\n== W5 summary: decode attention %s, GB/s (%% of measured read bandwidth %.0f GB/s)%s\n", variant,
               read_bw, strstr(variant, "fp8") ? ", KV bytes at 1 byte per element" : "");
        printf("%-8s %18s %18s %18s\n", "batch", "ctx 512", "ctx 4096", "ctx 32768");
        for (int batch : {1, 16, 64, 256}) {
            printf("%-8d", batch);
            for (int ctx : {512, 4096, 32768}) {
                char nm[96];
                snprintf(nm, sizeof nm, "decode %s batch=%d ctx=%d", variant, batch, ctx);
                for (auto &r : rows)
                    if (r.what == nm) printf(" %10.0f (%4.1f%%)", r.value, r.pct);
            }
            printf("\n");
        }
    }
    // KV tokens/s of each fp8 kernel over bf16 v2's (both move the same tokens).
    auto row_ms = [&](const char *nm) {
        for (auto &r : rows)
            if (r.what == nm) return r.ms;
        return 0.0;
    };
    printf("\n== W5 summary: fp8 KV tokens/s / bf16 v2 KV tokens/s (v2 fp8 | v4 fp8)\n");
    printf("%-8s %18s %18s %18s\n", "batch", "ctx 512", "ctx 4096", "ctx 32768");
    for (int batch : {1, 16, 64, 256}) {
        printf("%-8d", batch);
        for (int ctx : {512, 4096, 32768}) {
            char b2[96], f2[96], f4[96];
            snprintf(b2, sizeof b2, "decode v2 batch=%d ctx=%d", batch, ctx);
            snprintf(f2, sizeof f2, "decode v2 fp8 batch=%d ctx=%d", batch, ctx);
            snprintf(f4, sizeof f4, "decode v4 fp8 batch=%d ctx=%d", batch, ctx);
            const double mb = row_ms(b2), m2 = row_ms(f2), m4 = row_ms(f4);
            printf("      %5.2f | %5.2f", m2 > 0 ? mb / m2 : 0.0, m4 > 0 ? mb / m4 : 0.0);
        }
        printf("\n");
    }
    printf("prefill attention, TFLOP/s (%% of measured bf16 GEMM %.0f TFLOP/s)\n", gemm_tflops);
    for (auto &r : rows)
        if (r.kind == "prefill") printf("  %-40s %7.1f (%4.1f%%)\n", r.what.c_str(), r.value, r.pct);
    if (json) json_write(json, read_bw, gemm_tflops, dev);
    pg_cuda_gemm_destroy(gemm);
    return 0;
}
