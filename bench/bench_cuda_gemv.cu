// bench/bench_cuda_gemv.cu - W1's projections: the small-m GEMV against cuBLASLt.
//
// For m = 1, 2, 4, 8 and the bf16 shapes of a Llama-3.1-8B layer (fused QKV
// 6144x4096, O 4096x4096, fused gate/up 28672x4096, down 4096x14336) and the
// LM head (128256x4096): pg_cuda_gemv_bf16 and pg_cuda_gemm_bf16 (cuBLASLt)
// on the same inputs, plus the fused variants where the model uses them
// (RMSNorm + QKV; RMSNorm + gate/up + SiLU*mul) against the unfused chains
// they replace (add_rmsnorm + GEMM [+ silu_mul]). Each time is the median
// over 60 repetitions of 20 back-to-back calls (per-call ms) after warm-up,
// with CUDA events; the calls rotate over disjoint copies of the weight
// within 1.1 GB, so no weight byte comes from L2. Bandwidth counts weights +
// x + out bytes and is given as % of 4.23 TB/s (the H200 read ceiling that
// bench_cuda_attention measures). The summary table is printed last.
//
// Then the W1 chain (chain_bench): one batch-1 decode step of a
// Llama-3.1-8B-shape model, 32 layers with their own weights (14 GB) and
// KV caches (300-token context, block 16), captured as a CUDA graph the way
// the model's run_layers issues it, with the GEMV path or the cuBLASLt
// path, PDL on or off; the tail (row gather, final RMSNorm, LM head; no
// sampler) as a second graph. Median of per-replay event times. Then a
// table over the GEMV kernel kinds (pg_cuda_gemv_kernel_set) with and
// without the weights-before-wait promise (pg_cuda_gemv_preload_set), and
// "gemv only" chains without RoPE and attention, and chains where O's
// weight is issued to the L2 right after QKV ("O to L2": pg_cuda_l2_prefetch,
// what PAGED_CUDA_L2_PREFETCH=1 makes the backend do), with a plain chain
// measured again after them (the machine's drift).
//
// --chain-fp8: the same W1 chain with FP8 e4m3 weights (a scale per row)
// through gemv.cu's FP8 GEMV (the decode path of FP8 checkpoints; the LM
// head stays bf16, as in the backend), over the GEMV kinds with the
// preload, with and without attention, and with each projection left out
// in turn: what each matrix costs inside the chain, where PDL overlaps a
// kernel's start with its predecessor's tail (the isolated --fp8 table
// counts every launch's ramp and drain).
//
// --fp8: only the FP8 GEMV table (fp8_bench): Llama-3.1-8B's layer shapes
// with FP8 e4m3 weights (one byte each, a scale per row), gemv.cu's FP8
// GEMV (plain and fused, as the decode path calls them) against qgemv.cu's
// (the path it replaces) and the bf16 GEMV on bf16 weights of the shape;
// GB/s counts the bytes each reads (fp8 weights + scales + x + out).
//
// Usage: build/gpu/bench_cuda_gemv [--quick] [--chain | --chain-fp8 | --fp8]
// (--chain: only the W1 chain) exit 77 = no CUDA device.
#include <algorithm>
#include <numeric>
#include <string>

#include "tests/gpu/gpu_util.h"
#include "bench/bench_cuda_util.cuh"
#include "kernels/cuda/cuda_common.cuh" // pg_cuda_pdl_set / pg_cuda_pdl_enabled
extern "C" {
#include "kernels/dtype.h" // PG_DTYPE_FP8_E4M3
}

static const double CEILING_GBPS = 4230.0;

// --- the W1 step under a CUDA graph -----------------------------------------------------

static void chain_bench(bool quick, bool fp8 = false) {
    const int L = 32, H = 4096, NH = 32, NKV = 8, HD = 128, BS = 16, FFN = 14336, VOCAB = 128256, CTX = 300,
              CTX_BUCKET = 512;
    const int QKV = (NH + 2 * NKV) * HD, QD = NH * HD, KVD = NKV * HD;
    const size_t e_qkv = (size_t)QKV * H, e_o = (size_t)H * QD, e_gu = (size_t)2 * FFN * H, e_d = (size_t)H * FFN;
    const size_t per_layer = e_qkv + e_o + e_gu + e_d;
    const int bps = CTX_BUCKET / BS, n_blocks = bps + 4;
    const size_t kv_layer = (size_t)n_blocks * BS * KVD; // elements of one layer's K (or V)
    const size_t wb = fp8 ? 1 : 2; // bytes per weight
    DBuf w(per_layer * L * wb), lm((size_t)VOCAB * H * 2), nw((size_t)H * 2), kv(kv_layer * 2 * L * 2),
        wsc((size_t)2 * FFN * sizeof(float));
    if (fp8) {
        // Small e4m3 codes (|v| < 2, no NaN) and row scales of 1/64, as fp8_bench.
        CK(cudaMemset(w.p, 0x2a, per_layer * L));
        std::vector<float> hs((size_t)2 * FFN, 1.0f / 64);
        CK(cudaMemcpy(wsc.p, hs.data(), hs.size() * sizeof(float), cudaMemcpyHostToDevice));
    } else {
        fill_random(w.p, per_layer * L, 11, 0.02f);
    }
    fill_random(lm.p, (size_t)VOCAB * H, 12, 0.02f);
    fill_random(nw.p, H, 13, 1.0f);
    fill_random(kv.p, kv_layer * 2 * L, 14, 1.0f);
    auto W = [&](int l, size_t off) { return (const void *)(w.as<uint8_t>() + ((size_t)l * per_layer + off) * wb); };
    const float *wscale = wsc.as<float>();
    auto KC = [&](int l, int v) { return (void *)(kv.as<uint16_t>() + ((size_t)2 * l + v) * kv_layer); };
    // One sequence: 300 keys in random blocks; the new token at position 299.
    std::vector<int32_t> perm(n_blocks), bt(bps, 0);
    std::iota(perm.begin(), perm.end(), 0);
    Rng r(7);
    for (int i = n_blocks - 1; i > 0; i--) std::swap(perm[i], perm[r.below(i + 1)]);
    for (int b = 0; b < (CTX + BS - 1) / BS; b++) bt[b] = perm[b];
    std::vector<int32_t> tok = {5}, pos = {CTX - 1}, lens = {CTX}, rows = {0},
                         slots = {bt[(CTX - 1) / BS] * BS + (CTX - 1) % BS};
    std::vector<float> inv(HD / 2);
    for (int j = 0; j < HD / 2; j++) inv[j] = (float)(1.0 / pow(500000.0, 2.0 * j / HD));
    DBuf dtok, dpos, dlens, drows, dslots, dbt, dinv;
    dtok.up(tok), dpos.up(pos), dlens.up(lens), drows.up(rows), dslots.up(slots), dbt.up(bt), dinv.up(inv);
    DBuf x((size_t)H * 2), xn((size_t)H * 2), qkv((size_t)QKV * 2), attn((size_t)QD * 2), h((size_t)FFN * 2),
        gu((size_t)2 * FFN * 2), lg_in((size_t)H * 2), logits((size_t)VOCAB * 2), gws(PG_CUDA_GEMM_WORKSPACE);
    const size_t dws_bytes = pg_cuda_decode_workspace_size(1, NH, NKV, HD, CTX_BUCKET);
    DBuf dws(dws_bytes);
    CK(cudaDeviceSynchronize());
    pg_cuda_gemm *gemm = nullptr;
    PK(pg_cuda_gemm_create(&gemm));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const pg_kv_shape kvs = {n_blocks, BS, NKV, HD, PG_KV_BF16};
    const float eps = 1e-5f, scale = 1.0f / sqrtf((float)HD);

    // As the model's layer loop (engine/model/llama.c) on the CUDA backend for one decode row.
    auto mm = [&](bool gv, void *out, int64_t ldo, const void *in, int64_t ldx, const void *wt, int64_t n, int64_t k,
                  int acc) {
        if (gv && fp8) PK(pg_cuda_gemv_fp8(out, ldo, in, ldx, wt, wscale, 1, n, k, acc, st));
        else if (gv) PK(pg_cuda_gemv_bf16(out, ldo, in, ldx, wt, 1, n, k, acc, st));
        else PK(pg_cuda_gemm_bf16(gemm, out, ldo, in, ldx, wt, 1, n, k, acc, gws.p, gws.n, st));
    };
    bool with_attn = true; // false: the GEMVs alone (no RoPE, no attention), to split the layer's time
    int skip = 0;          // projections left out: 1 QKV, 2 O, 4 gate/up, 8 down (--chain-fp8's split)
    bool l2o = false;      // O's weight issued to the L2 after QKV (pg_cuda_l2_prefetch, as the backend's
                           // prefetch op under PAGED_CUDA_L2_PREFETCH=1)
    auto layers = [&](bool gv) {
        PK(pg_cuda_embed(x.p, lm.p, dtok.as<int32_t>(), 1, H, VOCAB, st));
        for (int l = 0; l < L; l++) {
            if (skip & 1) {
            } else if (gv && fp8) {
                PK(pg_cuda_gemv_rmsnorm_fp8(qkv.p, QKV, x.p, H, nw.p, eps, W(l, 0), wscale, 1, QKV, H, st));
            } else if (gv) {
                PK(pg_cuda_gemv_rmsnorm_bf16(qkv.p, QKV, x.p, H, nw.p, eps, W(l, 0), 1, QKV, H, st));
            } else {
                PK(pg_cuda_add_rmsnorm(xn.p, x.p, nullptr, nw.p, 1, H, eps, st));
                mm(false, qkv.p, QKV, xn.p, H, W(l, 0), QKV, H, 0);
            }
            uint16_t *q = qkv.as<uint16_t>();
            if (l2o) PK(pg_cuda_l2_prefetch(W(l, e_qkv), e_o * wb, st));
            if (with_attn) {
                PK(pg_cuda_rope_kv_write(q, QKV, q + QD, QKV, q + QD + KVD, QKV, dpos.as<int32_t>(),
                                         dslots.as<int32_t>(), 1, NH, dinv.as<float>(), KC(l, 0), KC(l, 1), kvs, st));
                PK(pg_cuda_paged_decode_attention(attn.p, q, QKV, KC(l, 0), KC(l, 1), kvs, dbt.as<int32_t>(), bps,
                                                  dlens.as<int32_t>(), 1, NH, scale, CTX_BUCKET, dws.p, dws_bytes,
                                                  st));
            }
            if (!(skip & 2)) mm(gv, x.p, H, attn.p, QD, W(l, e_qkv), H, QD, 1);
            if (skip & 4) {
            } else if (gv && fp8) {
                PK(pg_cuda_gemv_rmsnorm_silu_fp8(h.p, FFN, x.p, H, nw.p, eps, W(l, e_qkv + e_o), wscale, 1, FFN, H,
                                                 st));
            } else if (gv) {
                PK(pg_cuda_gemv_rmsnorm_silu_bf16(h.p, FFN, x.p, H, nw.p, eps, W(l, e_qkv + e_o), 1, FFN, H, st));
            } else {
                PK(pg_cuda_add_rmsnorm(xn.p, x.p, nullptr, nw.p, 1, H, eps, st));
                mm(false, gu.p, 2 * FFN, xn.p, H, W(l, e_qkv + e_o), 2 * FFN, H, 0);
                PK(pg_cuda_silu_mul(h.p, gu.p, 1, FFN, st));
            }
            if (!(skip & 8)) mm(gv, x.p, H, h.p, FFN, W(l, e_qkv + e_o + e_gu), H, FFN, 1);
        }
    };
    auto tail = [&](bool gv) {
        PK(pg_cuda_embed(lg_in.p, x.p, drows.as<int32_t>(), 1, H, 1, st));
        PK(pg_cuda_add_rmsnorm(lg_in.p, lg_in.p, nullptr, nw.p, 1, H, eps, st));
        mm(gv, logits.p, VOCAB, lg_in.p, H, lm.p, VOCAB, H, 0);
    };
    auto capture = [&](auto &&f, bool gv) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        f(gv);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphUpload(ge, st));
        CK(cudaGraphDestroy(g));
        return ge;
    };
    const int reps = quick ? 11 : 41;
    const double bytes_layers = (double)wb * (double)per_layer * L, bytes_tail = 2.0 * (double)VOCAB * H;
    printf("\nW1 chain%s: batch 1, %d layers (hidden %d, q %dx%d, kv %dx%d, ffn %d), context %d (bucket %d), block %d; "
           "CUDA graph replay, median of %d\n",
           fp8 ? " with FP8 weights (LM head bf16)" : "", L, H, NH, HD, NKV, HD, FFN, CTX, CTX_BUCKET, BS, reps);
    // One configuration: median layers and tail ms over the replays.
    auto measure = [&](bool gv, int pdl, double &ml, double &mt) {
            pg_cuda_pdl_set(pdl);
            layers(gv); // eager warm-up: shared-memory attributes, cuBLASLt plans
            tail(gv);
            CK(cudaStreamSynchronize(st));
            cudaGraphExec_t gl = capture(layers, gv), gt = capture(tail, gv);
            cudaEvent_t a, b, c;
            CK(cudaEventCreate(&a));
            CK(cudaEventCreate(&b));
            CK(cudaEventCreate(&c));
            std::vector<double> tl, tt;
            for (int i = 0; i < reps + 3; i++) {
                CK(cudaEventRecord(a, st));
                CK(cudaGraphLaunch(gl, st));
                CK(cudaEventRecord(b, st));
                CK(cudaGraphLaunch(gt, st));
                CK(cudaEventRecord(c, st));
                CK(cudaEventSynchronize(c));
                float m1, m2;
                CK(cudaEventElapsedTime(&m1, a, b));
                CK(cudaEventElapsedTime(&m2, b, c));
                if (i >= 3) tl.push_back(m1), tt.push_back(m2);
            }
            std::sort(tl.begin(), tl.end());
            std::sort(tt.begin(), tt.end());
            ml = tl[tl.size() / 2], mt = tt[tt.size() / 2];
            CK(cudaGraphExecDestroy(gl));
            CK(cudaGraphExecDestroy(gt));
            CK(cudaEventDestroy(a));
            CK(cudaEventDestroy(b));
            CK(cudaEventDestroy(c));
    };
    if (fp8) {
        // The GEMV kinds with the preload (as the backend runs them: kind
        // auto is 2 with the promise), then kind 2 with each projection
        // left out: the difference to the full chain is what it costs there.
        struct Cfg8 {
            int kind, preload, attn, skip;
            const char *what;
            int l2o = 0;
        } cfgs[] = {{0, 0, 1, 0, "full"},           {1, 1, 1, 0, "full"},         {2, 1, 1, 0, "full"},
                    {3, 1, 1, 0, "full"},           {2, 1, 0, 0, "gemv only"},    {2, 1, 1, 1, "without QKV"},
                    {2, 1, 1, 2, "without O"},      {2, 1, 1, 4, "without gate/up"}, {2, 1, 1, 8, "without down"},
                    {2, 1, 1, 15, "attention only"}, {2, 1, 1, 0, "full, O to L2", 1},
                    {1, 1, 1, 0, "full, O to L2", 1}, {2, 1, 1, 0, "full (again)"}};
        double full = 0;
        printf("\n| gemv kind | preload | chain | layers ms | us/layer | GB/s (weights read) | tail ms | layers + tail "
               "| us/layer saved vs full |\n| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for (const Cfg8 &c : cfgs) {
            pg_cuda_gemv_kernel_set(c.kind);
            pg_cuda_gemv_preload_set(c.preload);
            with_attn = c.attn != 0, skip = c.skip, l2o = c.l2o != 0;
            double ml, mt;
            measure(true, 1, ml, mt);
            if (c.kind == 2 && c.attn && !c.skip && !c.l2o && full == 0) full = ml;
            const double frac = 1.0 - ((c.skip & 1) ? (double)e_qkv : 0) / per_layer - ((c.skip & 2) ? (double)e_o : 0) / per_layer -
                                ((c.skip & 4) ? (double)e_gu : 0) / per_layer - ((c.skip & 8) ? (double)e_d : 0) / per_layer;
            printf("| %d | %s | %s | %.4f | %.1f | %.0f | %.4f | %.4f | %s |\n", c.kind, c.preload ? "on" : "off", c.what,
                   ml, 1000.0 * ml / L, bytes_layers * frac / ml / 1e6, mt, ml + mt,
                   full > 0 && c.skip ? (std::to_string(1000.0 * (full - ml) / L).substr(0, 5)).c_str() : "-");
        }
        with_attn = true, skip = 0, l2o = false;
        pg_cuda_gemv_kernel_set(-1);
        pg_cuda_gemv_preload_set(0);
        pg_cuda_pdl_set(-1);
        CK(cudaStreamDestroy(st));
        pg_cuda_gemm_destroy(gemm);
        return;
    }
    double res[2][2][2] = {};
    for (int gv = 1; gv >= 0; gv--)
        for (int pdl = 1; pdl >= 0; pdl--) {
            double ml, mt;
            measure(gv, pdl, ml, mt);
            const bool pdl_on = pg_cuda_pdl_enabled() != 0;
            res[gv][pdl][0] = ml, res[gv][pdl][1] = mt;
            printf("chain gemv=%-3s pdl=%-3s  layers %.4f ms (%.1f us/layer, %.0f GB/s)  tail %.4f ms  "
                   "step %.4f ms per token\n",
                   gv ? "on" : "off", pdl_on ? "on" : "off", ml, 1000.0 * ml / L, bytes_layers / ml / 1e6, mt, ml + mt);
        }
    printf("chain summary (ms per token, layers + tail, no sampler): gemv+pdl %.4f, gemv %.4f, cuBLASLt+pdl %.4f, "
           "cuBLASLt %.4f; PDL saves %.1f us/layer on the GEMV path; floor (weights at %.0f GB/s) %.4f ms\n",
           res[1][1][0] + res[1][1][1], res[1][0][0] + res[1][0][1], res[0][1][0] + res[0][1][1],
           res[0][0][0] + res[0][0][1], 1000.0 * (res[1][0][0] - res[1][1][0]) / L, CEILING_GBPS,
           (bytes_layers + bytes_tail) / CEILING_GBPS / 1e6);

    // The GEMV kernel kinds (pg_cuda_gemv_kernel_set) with and without the
    // weights-before-wait promise; "gemv only" drops RoPE and attention.
    struct Kind {
        int kind, preload, pdl, attn, l2o = 0;
    } kinds[] = {{0, 0, 1, 1}, {1, 0, 1, 1}, {1, 1, 1, 1}, {1, 1, 0, 1}, {2, 0, 1, 1}, {2, 1, 1, 1},
                 {3, 1, 1, 1}, {4, 1, 1, 1}, {0, 0, 1, 1}, {0, 0, 1, 0}, {1, 1, 1, 0}, {2, 1, 1, 0},
                 {3, 1, 1, 0}, {2, 1, 1, 1, 1}, {1, 1, 1, 1, 1}, {2, 1, 1, 1}};
    printf("\n| gemv kind | preload | PDL | chain | layers ms | us/layer | GB/s | tail ms | layers + tail |\n"
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const Kind &k : kinds) {
        pg_cuda_gemv_kernel_set(k.kind);
        pg_cuda_gemv_preload_set(k.preload);
        with_attn = k.attn != 0, l2o = k.l2o != 0;
        double ml, mt;
        measure(true, k.pdl, ml, mt);
        printf("| %d | %s | %s | %s | %.4f | %.1f | %.0f | %.4f | %.4f |\n", k.kind, k.preload ? "on" : "off",
               pg_cuda_pdl_enabled() ? "on" : "off", k.attn ? (k.l2o ? "full, O to L2" : "full") : "gemv only", ml,
               1000.0 * ml / L, bytes_layers / ml / 1e6, mt, ml + mt);
    }
    with_attn = true, l2o = false;
    pg_cuda_gemv_kernel_set(-1);
    pg_cuda_gemv_preload_set(0);
    pg_cuda_pdl_set(-1);
    CK(cudaStreamDestroy(st));
    pg_cuda_gemm_destroy(gemm);
}

struct Row {
    std::string what;
    int m;
    double gemv_ms, lt_ms, bytes;
};

// The FP8 GEMV table (see the top of the file). Weights rotate over copies
// within 1 GB as above, so every byte comes from HBM.
static void fp8_bench(bool quick) {
    const int WARM = 10, REPS = quick ? 11 : 60, INNER = 20;
    struct Shape {
        const char *name;
        int n, k, fused;
    } shapes[] = {{"qkv", 6144, 4096, 1}, {"o", 4096, 4096, 0}, {"gate_up", 28672, 4096, 2}, {"down", 4096, 14336, 0}};
    const size_t pool_bytes = (size_t)1 << 30;
    DBuf pool(pool_bytes), bpool(pool_bytes), sc((size_t)28672 * 4), x((size_t)8 * 14336 * 2),
        out((size_t)8 * 28672 * 2), nw(4096 * 2);
    fill_random(bpool.p, pool_bytes / 2, 1);
    // Small e4m3 codes (|v| < 2, no NaN) and scales of 1/64.
    CK(cudaMemset(pool.p, 0x2a, pool_bytes));
    std::vector<float> hs(28672, 1.0f / 64);
    CK(cudaMemcpy(sc.p, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    fill_random(x.p, (size_t)8 * 14336, 2, 3.0f);
    fill_random(nw.p, 4096, 3, 1.0f);
    CK(cudaDeviceSynchronize());
    const float *scales = sc.as<float>();
    printf("\n| matrix | m | fp8 GEMV ms | GB/s | %% of %.0f | qgemv ms | new/old speed | bf16 GEMV ms (bf16 weights) | bf16/fp8 time |\n"
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
           CEILING_GBPS);
    for (const Shape &s : shapes) {
        const size_t wbytes = (size_t)s.n * s.k;
        const int copies = (int)(pool_bytes / wbytes), bcopies = (int)(pool_bytes / (2 * wbytes));
        auto wp = [&](int i) { return (const void *)(pool.as<uint8_t>() + (size_t)(i % copies) * wbytes); };
        auto bp = [&](int i) { return (const void *)(bpool.as<uint16_t>() + (size_t)(i % bcopies) * wbytes); };
        const int ncol = s.fused == 2 ? s.n / 2 : s.n;
        for (int m : {1, 2, 4, 8}) {
            const double bytes = (double)wbytes + 4.0 * s.n + 2.0 * m * s.k + 2.0 * m * ncol;
            double tn = time_ms(WARM, REPS, INNER, [&](int i) {
                if (s.fused == 1)
                    PK(pg_cuda_gemv_rmsnorm_fp8(out.p, s.n, x.p, s.k, nw.p, 1e-5f, wp(i), scales, m, s.n, s.k, nullptr));
                else if (s.fused == 2)
                    PK(pg_cuda_gemv_rmsnorm_silu_fp8(out.p, ncol, x.p, s.k, nw.p, 1e-5f, wp(i), scales, m, ncol, s.k,
                                                     nullptr));
                else
                    PK(pg_cuda_gemv_fp8(out.p, s.n, x.p, s.k, wp(i), scales, m, s.n, s.k, 0, nullptr));
            });
            // qgemv.cu has no fused variants: the product alone.
            double to = time_ms(WARM, REPS, INNER, [&](int i) {
                PK(pg_cuda_qgemv(out.p, s.n, x.p, s.k, wp(i), scales, PG_DTYPE_FP8_E4M3, m, s.n, s.k, 0, nullptr));
            });
            double tb = time_ms(WARM, REPS, INNER, [&](int i) {
                if (s.fused == 1)
                    PK(pg_cuda_gemv_rmsnorm_bf16(out.p, s.n, x.p, s.k, nw.p, 1e-5f, bp(i), m, s.n, s.k, nullptr));
                else if (s.fused == 2)
                    PK(pg_cuda_gemv_rmsnorm_silu_bf16(out.p, ncol, x.p, s.k, nw.p, 1e-5f, bp(i), m, ncol, s.k, nullptr));
                else
                    PK(pg_cuda_gemv_bf16(out.p, s.n, x.p, s.k, bp(i), m, s.n, s.k, 0, nullptr));
            });
            printf("| %s %dx%d%s | %d | %.4f | %.0f | %.1f | %.4f | %.2fx | %.4f | %.2fx |\n", s.name, s.n, s.k,
                   s.fused == 1 ? " +norm" : s.fused == 2 ? " +norm+silu" : "", m, tn, bytes / tn / 1e6,
                   100.0 * bytes / tn / 1e6 / CEILING_GBPS, to, to / tn, tb, tb / tn);
        }
    }
}

int main(int argc, char **argv) {
    bool quick = false, chain_only = false, fp8_only = false, chain_fp8 = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        if (!strcmp(argv[i], "--chain")) chain_only = true;
        if (!strcmp(argv[i], "--fp8")) fp8_only = true;
        if (!strcmp(argv[i], "--chain-fp8")) chain_fp8 = true;
    }
    if (!gpu_announce()) return 77;
    printf("PDL (programmatic dependent launch) by default: %s\n", pg_cuda_pdl_enabled() ? "on" : "off");
    if (chain_only || chain_fp8) {
        chain_bench(quick, chain_fp8);
        return 0;
    }
    if (fp8_only) {
        // As the backend runs them: the weights-before-wait promise on.
        pg_cuda_gemv_preload_set(1);
        fp8_bench(quick);
        return 0;
    }
    const int WARM = 10, REPS = quick ? 11 : 60, INNER = 20;

    struct Shape {
        const char *name;
        int n, k;
        int fused; // 0 none, 1 RMSNorm prologue (QKV), 2 RMSNorm + SiLU*mul (gate/up)
    } shapes[] = {{"qkv", 6144, 4096, 1},
                  {"o", 4096, 4096, 0},
                  {"gate_up", 28672, 4096, 2},
                  {"down", 4096, 14336, 0},
                  {"lm_head", 128256, 4096, 0}};
    const int ms_[] = {1, 2, 4, 8};
    const int MAXM = 8, MAXK = 14336;
    const size_t pool_elems = (size_t)128256 * 4096 + 4096; // the LM head, the largest weight (1.05 GB)
    DBuf pool(pool_elems * 2), x((size_t)MAXM * MAXK * 2), out((size_t)MAXM * 128256 * 2),
        tmp((size_t)MAXM * 28672 * 2), xn((size_t)MAXM * 4096 * 2), nw(4096 * 2), ws(PG_CUDA_GEMM_WORKSPACE);
    fill_random(pool.p, pool_elems, 1);
    fill_random(x.p, (size_t)MAXM * MAXK, 2, 3.0f);
    fill_random(nw.p, 4096, 3, 1.0f);
    CK(cudaDeviceSynchronize());
    pg_cuda_gemm *gemm = nullptr;
    PK(pg_cuda_gemm_create(&gemm));
    std::vector<Row> rows;

    for (const Shape &s : shapes) {
        const size_t welems = (size_t)s.n * s.k;
        const int copies = (int)std::max<size_t>(1, pool_elems / welems);
        auto wp = [&](int i) { return (const void *)(pool.as<uint16_t>() + (size_t)(i % copies) * welems); };
        for (int m : ms_) {
            const double bytes = 2.0 * ((double)welems + (double)m * s.k + (double)m * s.n);
            double tg = time_ms(WARM, REPS, INNER, [&](int i) {
                PK(pg_cuda_gemv_bf16(out.p, s.n, x.p, s.k, wp(i), m, s.n, s.k, 0, nullptr));
            });
            double tl = time_ms(WARM, REPS, INNER, [&](int i) {
                PK(pg_cuda_gemm_bf16(gemm, out.p, s.n, x.p, s.k, wp(i), m, s.n, s.k, 0, ws.p, ws.n, nullptr));
            });
            char nm[96];
            snprintf(nm, sizeof nm, "%s %dx%d", s.name, s.n, s.k);
            printf("%-22s m=%d  gemv %8.4f ms %7.0f GB/s %5.1f%%   cuBLASLt %8.4f ms %7.0f GB/s %5.1f%%   x%.2f\n", nm,
                   m, tg, bytes / tg / 1e6, 100.0 * bytes / tg / 1e6 / CEILING_GBPS, tl, bytes / tl / 1e6,
                   100.0 * bytes / tl / 1e6 / CEILING_GBPS, tl / tg);
            rows.push_back({nm, m, tg, tl, bytes});
            if (!s.fused) continue;
            // The fused launcher against the chain it replaces (bytes: the
            // weight pass only; the chain's intermediates are extra traffic).
            double tf, tc;
            if (s.fused == 1) {
                tf = time_ms(WARM, REPS, INNER, [&](int i) {
                    PK(pg_cuda_gemv_rmsnorm_bf16(out.p, s.n, x.p, s.k, nw.p, 1e-5f, wp(i), m, s.n, s.k, nullptr));
                });
                tc = time_ms(WARM, REPS, INNER, [&](int i) {
                    PK(pg_cuda_add_rmsnorm(xn.p, x.p, nullptr, nw.p, m, s.k, 1e-5f, nullptr));
                    PK(pg_cuda_gemm_bf16(gemm, out.p, s.n, xn.p, s.k, wp(i), m, s.n, s.k, 0, ws.p, ws.n, nullptr));
                });
            } else {
                const int ffn = s.n / 2;
                tf = time_ms(WARM, REPS, INNER, [&](int i) {
                    PK(pg_cuda_gemv_rmsnorm_silu_bf16(out.p, ffn, x.p, s.k, nw.p, 1e-5f, wp(i), m, ffn, s.k,
                                                      nullptr));
                });
                tc = time_ms(WARM, REPS, INNER, [&](int i) {
                    PK(pg_cuda_add_rmsnorm(xn.p, x.p, nullptr, nw.p, m, s.k, 1e-5f, nullptr));
                    PK(pg_cuda_gemm_bf16(gemm, tmp.p, s.n, xn.p, s.k, wp(i), m, s.n, s.k, 0, ws.p, ws.n, nullptr));
                    PK(pg_cuda_silu_mul(out.p, tmp.p, m, ffn, nullptr));
                });
            }
            snprintf(nm, sizeof nm, "%s %dx%d %s", s.name, s.n, s.k, s.fused == 1 ? "+norm" : "+norm+silu");
            printf("%-22s m=%d  fused %7.4f ms %7.0f GB/s %5.1f%%   unfused chain %8.4f ms   x%.2f\n", nm, m, tf,
                   bytes / tf / 1e6, 100.0 * bytes / tf / 1e6 / CEILING_GBPS, tc, tc / tf);
            rows.push_back({nm, m, tf, tc, bytes});
        }
    }

    // Summary. "cuBLASLt" on the fused rows is the unfused chain.
    printf("\nsummary: per-call ms, GB/s and %% of %.0f GB/s (weights + x + out)\n", CEILING_GBPS);
    printf("%-30s %2s %9s %7s %6s %9s %7s %6s %7s\n", "shape", "m", "gemv ms", "GB/s", "%", "cuBLASLt", "GB/s", "%",
           "speedup");
    for (const Row &r : rows)
        printf("%-30s %2d %9.4f %7.0f %5.1f%% %9.4f %7.0f %5.1f%% %6.2fx\n", r.what.c_str(), r.m, r.gemv_ms,
               r.bytes / r.gemv_ms / 1e6, 100.0 * r.bytes / r.gemv_ms / 1e6 / CEILING_GBPS, r.lt_ms,
               r.bytes / r.lt_ms / 1e6, 100.0 * r.bytes / r.lt_ms / 1e6 / CEILING_GBPS, r.lt_ms / r.gemv_ms);
    // One W1 token's projections at m = 1: 32 layers of (norm+QKV, O,
    // norm+gate/up+SiLU, down) and the LM head, as the model runs them.
    auto find = [&](const char *prefix, int m) -> const Row * {
        for (const Row &r : rows)
            if (r.m == m && r.what == prefix) return &r;
        return nullptr;
    };
    for (int m : ms_) {
        const Row *q = find("qkv 6144x4096 +norm", m), *o = find("o 4096x4096", m),
                  *g = find("gate_up 28672x4096 +norm+silu", m), *d = find("down 4096x14336", m),
                  *l = find("lm_head 128256x4096", m);
        if (!(q && o && g && d && l)) continue;
        const double gv = 32 * (q->gemv_ms + o->gemv_ms + g->gemv_ms + d->gemv_ms) + l->gemv_ms;
        const double lt = 32 * (q->lt_ms + o->lt_ms + g->lt_ms + d->lt_ms) + l->lt_ms;
        const double bytes = 32 * (q->bytes + o->bytes + g->bytes + d->bytes) + l->bytes;
        printf("m=%d per token, 32 layers + LM head: gemv path %.3f ms (%.0f GB/s), cuBLASLt path %.3f ms "
               "(%.0f GB/s); floor at %.0f GB/s: %.3f ms\n",
               m, gv, bytes / gv / 1e6, lt, bytes / lt / 1e6, CEILING_GBPS, bytes / CEILING_GBPS / 1e6);
    }
    pg_cuda_gemm_destroy(gemm);
    pool.alloc(0); // the chain allocates its own 15 GB
    chain_bench(quick);
    return 0;
}
