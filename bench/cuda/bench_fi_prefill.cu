// bench/cuda/bench_fi_prefill.cu - FlashInfer's sm90 paged prefill (FA3-style:
// wgmma, TMA for Q, warp specialization) beside our prefill kernel, on OUR
// paged KV cache in place, both through the library the runner calls
// (issue 29; docs/cuda_kernels.md, "FlashInfer's prefill in the runner").
//
// FlashInfer runs through pg_cuda_fi_prefill_run (kernels/cuda/
// prefill_flashinfer.cu: the host plan, kept while the batch is the same,
// and the launch), ours through pg_cuda_paged_prefill_attention. The cache
// is the runner's: one K and one V tensor of [n_blocks][16][n_kv][head_dim]
// bf16, padded block tables [n_seqs][bt_stride] handed out in a shuffled
// order, block 0 the null block.
//
// 1. --check: cases against an fp32 host reference on the bf16 inputs, both
//    kernels, bound 1e-2 relative (‖out − ref‖ / ‖ref‖ over the rows
//    checked), outputs poisoned (bf16 NaN) first: single tokens, odd
//    lengths, chunks after cached context (chunked prefill, prefix-cache
//    hits), several sequences in one launch, head_dim 64, 128 and 256 (Gemma
//    3 270M-12B's heads, windows of 512 and 1024), GQA groups 1, 2, 4 and 8, a 32,768-token prompt and a 4,096-token chunk after 28,672
//    cached (rows sampled: every 61st and the last of each sequence),
//    sliding windows and soft-capped scores (Mistral, Gemma 2/3), and the
//    kept plan: the same batch again with new K/V values. Exit 1 on a
//    failure.
// 2. Timing on the issue's shapes (all of the prompt new, head_dim 128,
//    32 query / 8 KV heads, or --heads H/KV/D): 1 x 4096, 2 x 8192, 8 x
//    4096, 1 x 32768;
//    TFLOP/s with causal FLOPs 2 * 2 * heads * head_dim * sum L(L+1)/2.
//    The first FlashInfer call of a shape makes the plan: its host time
//    (plan + launch) is printed apart; the timed calls reuse the plan, as
//    every layer after the first of a step does.
//
// Usage: build/gpu/bench_fi_prefill [--quick | --check | --no-check] [--block-size N] [--heads H/KV/D]
//   exit 77 = skipped (no FlashInfer in the build, or a device other than
//   compute 9.x). --block-size: the timing's KV block (page) size, 16 by
//   default (the checks always run at 16); --no-check: the timing alone.
#include <chrono>

#include "tests/gpu/gpu_util.h"
#include "kernels/dtype.h"                    // (kernels_test_common.cuh's FP8 weight maker)
#include "tests/gpu/kernels_test_common.cuh" // e4m3 on the host
#include "bench/bench_cuda_util.cuh"

namespace {

int BS = 16; // tokens a KV block (--block-size; the checks always run at 16)

struct Heads {
    int h, kv, hd;
    int window = 0;       // > 0: the query at p sees keys (p - window, p]
    float softcap = 0.0f; // > 0: scores s -> softcap * tanh(s / softcap)
    bool f8 = false;      // fp8 e4m3 cache with per-head scales (FlashInfer's fp8 kernel)
};

// A batch: sequence s has q_len[s] new tokens after start[s] cached ones.
struct Batch {
    std::vector<int> q_len, start;
    int n_seqs() const { return (int)q_len.size(); }
    int tokens() const {
        int t = 0;
        for (int l : q_len) t += l;
        return t;
    }
};

// Everything both kernels read, laid out as the runner lays it out.
struct Setup {
    Heads hs;
    Batch b;
    int n_blocks = 0, bt_stride = 0, max_q = 0;
    std::vector<int32_t> bt, cu, sp; // padded block tables, cu_q, start_pos (host copies too)
    DBuf kc, vc, q, out_fi, out_pg, dbt, dcu, dsp, ws, scales;
    size_t kv_elems = 0, q_elems = 0;
};

void setup(Setup &S, Heads hs, const Batch &b, uint64_t seed) {
    S.hs = hs;
    S.b = b;
    const int n = b.n_seqs();
    int max_blocks = 0;
    for (int s = 0; s < n; s++) {
        max_blocks = std::max(max_blocks, (b.start[s] + b.q_len[s] + BS - 1) / BS);
        S.max_q = std::max(S.max_q, b.q_len[s]);
    }
    S.bt_stride = max_blocks + 3; // padded rows, as the runner's
    S.n_blocks = 1 + n * max_blocks;
    std::vector<int32_t> perm(S.n_blocks - 1);
    for (size_t i = 0; i < perm.size(); i++) perm[i] = (int32_t)i + 1;
    Rng r(seed);
    for (size_t i = perm.size(); i > 1; i--) std::swap(perm[i - 1], perm[r.below((int)i)]);
    S.bt.assign((size_t)n * S.bt_stride, 0);
    size_t next = 0;
    for (int s = 0; s < n; s++)
        for (int j = 0; j < (b.start[s] + b.q_len[s] + BS - 1) / BS; j++) S.bt[(size_t)s * S.bt_stride + j] = perm[next++];
    S.cu.assign(n + 1, 0);
    S.sp.assign(n, 0);
    for (int s = 0; s < n; s++) {
        S.cu[s + 1] = S.cu[s] + b.q_len[s];
        S.sp[s] = b.start[s];
    }
    S.kv_elems = (size_t)S.n_blocks * BS * hs.kv * hs.hd;
    S.q_elems = (size_t)b.tokens() * hs.h * hs.hd;
    S.kc.alloc(S.kv_elems * (hs.f8 ? 1 : 2));
    S.vc.alloc(S.kv_elems * (hs.f8 ? 1 : 2));
    // fp8: K's then V's scale per KV head, unequal so a head mixed up shows
    std::vector<float> sc(2 * (size_t)hs.kv);
    for (int i = 0; i < 2 * hs.kv; i++) sc[i] = (0.5f + 0.25f * (float)(i % 5)) / 448.0f;
    S.scales.up(sc);
    S.q.alloc(S.q_elems * 2);
    S.out_fi.alloc(S.q_elems * 2);
    S.out_pg.alloc(S.q_elems * 2);
    S.dbt.up(S.bt);
    S.dcu.up(S.cu);
    S.dsp.up(S.sp);
    S.ws.alloc(pg_cuda_fi_prefill_ws_bytes(hs.h));
}

pg_kv_shape shape_of(const Setup &S) {
    pg_kv_shape sh = {S.n_blocks, BS, S.hs.kv, S.hs.hd, S.hs.f8 ? PG_KV_FP8_E4M3 : PG_KV_BF16};
    if (S.hs.f8) sh.scales = S.scales.as<float>();
    sh.window = S.hs.window;
    sh.softcap = S.hs.softcap;
    return sh;
}

int run_fi(pg_cuda_fi_prefill *fi, Setup &S) {
    return pg_cuda_fi_prefill_run(fi, S.out_fi.p, S.q.p, (int64_t)S.hs.h * S.hs.hd, S.kc.p, S.vc.p, shape_of(S),
                                  S.dbt.as<int32_t>(), S.bt_stride, S.cu.data(), S.sp.data(), S.b.n_seqs(), S.hs.h,
                                  1.0f / sqrtf((float)S.hs.hd), S.ws.p, S.ws.n, nullptr);
}

void run_pg(Setup &S) {
    PK(pg_cuda_paged_prefill_attention(S.out_pg.p, S.q.p, (int64_t)S.hs.h * S.hs.hd, S.kc.p, S.vc.p, shape_of(S),
                                       S.dbt.as<int32_t>(), S.bt_stride, S.dcu.as<int32_t>(), S.dsp.as<int32_t>(),
                                       S.b.n_seqs(), S.hs.h, 1.0f / sqrtf((float)S.hs.hd), S.max_q, nullptr));
}

// The rows checked: all of a sequence of at most 512 new tokens; of longer
// ones every 61st and the last.
std::vector<int> rows_checked(const Setup &S) {
    std::vector<int> rows;
    for (int s = 0; s < S.b.n_seqs(); s++) {
        const int n = S.b.q_len[s];
        for (int i = 0; i < n; i++)
            if (n <= 512 || i % 61 == 0 || i == n - 1) rows.push_back(S.cu[s] + i);
    }
    return rows;
}

// ‖out − ref‖ / ‖ref‖ over the checked rows (inf when a value is not finite).
double rel_err(const std::vector<uint16_t> &out, const std::vector<float> &ref, const std::vector<int> &rows,
               int row_elems) {
    double num = 0, den = 0;
    for (int t : rows)
        for (int e = 0; e < row_elems; e++) {
            const size_t i = (size_t)t * row_elems + e;
            double o = bf2f(out[i]);
            if (!std::isfinite(o)) return INFINITY;
            num += (o - ref[i]) * (o - ref[i]);
            den += (double)ref[i] * ref[i];
        }
    return sqrt(num / (den > 0 ? den : 1));
}

// The fp32 reference for the checked rows, through the block tables.
std::vector<float> reference(const Setup &S, const std::vector<uint16_t> &hq, const std::vector<float> &hk,
                             const std::vector<float> &hv, const std::vector<int> &rows) {
    const int H = S.hs.h, KV = S.hs.kv, HD = S.hs.hd;
    std::vector<float> ref(S.q_elems, 0.0f);
    const float scale = 1.0f / sqrtf((float)HD);
    parallel_for((int64_t)rows.size() * H, [&](int64_t i) {
        const int t = rows[i / H], h = (int)(i % H), kvh = h / (H / KV);
        int s = 0;
        while (t >= S.cu[s + 1]) s++;
        const int pos = S.sp[s] + (t - S.cu[s]);
        const int j0 = S.hs.window > 0 ? std::max(0, pos - S.hs.window + 1) : 0;
        std::vector<float> sc(pos + 1), acc(HD, 0.0f);
        float mx = -INFINITY;
        for (int j = j0; j <= pos; j++) {
            const size_t slot = (size_t)S.bt[(size_t)s * S.bt_stride + j / BS] * BS + j % BS;
            float d = 0;
            for (int e = 0; e < HD; e++) d += bf2f(hq[((size_t)t * H + h) * HD + e]) * hk[(slot * KV + kvh) * HD + e];
            sc[j] = d * scale;
            if (S.hs.softcap > 0.0f) sc[j] = S.hs.softcap * tanhf(sc[j] / S.hs.softcap);
            mx = std::max(mx, sc[j]);
        }
        float sum = 0;
        for (int j = j0; j <= pos; j++) {
            const float w = expf(sc[j] - mx);
            sum += w;
            const size_t slot = (size_t)S.bt[(size_t)s * S.bt_stride + j / BS] * BS + j % BS;
            for (int e = 0; e < HD; e++) acc[e] += w * hv[(slot * KV + kvh) * HD + e];
        }
        for (int e = 0; e < HD; e++) ref[((size_t)t * H + h) * HD + e] = acc[e] / sum;
    });
    return ref;
}

struct Case {
    const char *name;
    Heads hs;
    Batch b;
};

// The cache's values as the kernels read them (K then V, floats): bf16
// uniform in [-1, 1); fp8, codes of uniform [-1, 1) / scale (about 1.6% on
// e4m3 subnormals), read back as scale * code. Uploads the cache.
void fill_cache(Setup &S, Rng &r, std::vector<float> &kf, std::vector<float> &vf) {
    kf.resize(S.kv_elems);
    vf.resize(S.kv_elems);
    if (!S.hs.f8) {
        std::vector<uint16_t> hk(S.kv_elems), hv(S.kv_elems);
        fill_bf16(hk, r, 1.0f);
        fill_bf16(hv, r, 1.0f);
        for (size_t i = 0; i < S.kv_elems; i++) kf[i] = bf2f(hk[i]), vf[i] = bf2f(hv[i]);
        S.kc.up(hk);
        S.vc.up(hv);
        return;
    }
    std::vector<float> sc(2 * (size_t)S.hs.kv);
    CK(cudaMemcpy(sc.data(), S.scales.p, sc.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<uint8_t> k8(S.kv_elems), v8(S.kv_elems);
    for (size_t i = 0; i < S.kv_elems; i++) {
        const int kvh = (int)(i / S.hs.hd % S.hs.kv);
        const float sk = sc[kvh], sv = sc[S.hs.kv + kvh];
        k8[i] = f_to_e4m3(r.sym() / sk);
        v8[i] = f_to_e4m3(r.sym() / sv);
        kf[i] = sk * e4m3_to_f(k8[i]);
        vf[i] = sv * e4m3_to_f(v8[i]);
    }
    S.kc.up(k8);
    S.vc.up(v8);
}

// The bound on ‖out − ref‖ / ‖ref‖: 1e-2 for bf16 arithmetic (ours on
// either cache, FlashInfer on bf16); FlashInfer's fp8 kernel multiplies
// e4m3 Q (a dynamic scale per head) and e4m3 P, each rounded to 3 mantissa
// bits (up to 2^-4 relative, about 2.5% rms), so its outputs carry about
// 3% from those roundings alone: bound 6e-2.
double bound_fi(const Heads &hs) { return hs.f8 ? 6e-2 : 1e-2; }

// One case: both kernels against the reference; `again` runs FlashInfer a
// second time on the same batch (the kept plan) with new K/V values. Ours
// runs first: FlashInfer's fp8 path quantizes Q in place.
bool check_case(pg_cuda_fi_prefill *fi, const Case &c, uint64_t seed, bool again) {
    Setup S;
    setup(S, c.hs, c.b, seed);
    std::vector<uint16_t> hq(S.q_elems);
    std::vector<float> kf, vf;
    Rng r(seed * 7 + 1);
    const std::vector<int> rows = rows_checked(S);
    const int row_elems = c.hs.h * c.hs.hd;
    bool ok = true;
    for (int round = 0; round < (again ? 2 : 1); round++) {
        fill_cache(S, r, kf, vf);
        fill_bf16(hq, r, 2.0f);
        S.q.up(hq);
        CK(cudaMemset(S.out_fi.p, 0xff, S.q_elems * 2)); // bf16 NaN
        CK(cudaMemset(S.out_pg.p, 0xff, S.q_elems * 2));
        run_pg(S);
        const int rc = run_fi(fi, S);
        CK(cudaDeviceSynchronize());
        if (rc < 0) {
            printf("check %-44s FAIL: pg_cuda_fi_prefill_run %d: %s\n", c.name, rc, pg_err_msg());
            return false;
        }
        std::vector<uint16_t> ofi(S.q_elems), opg(S.q_elems);
        S.out_fi.down(ofi);
        S.out_pg.down(opg);
        const std::vector<float> ref = reference(S, hq, kf, vf, rows);
        const double efi = rel_err(ofi, ref, rows, row_elems), epg = rel_err(opg, ref, rows, row_elems);
        const bool pass = rc == 0 && efi < bound_fi(c.hs) && epg < 1e-2;
        printf("check %-44s %s rows %6zu: flashinfer %.2e, ours %.2e: %s\n", c.name, round ? "(kept plan)" : "           ",
               rows.size(), efi, epg, pass ? "ok" : "FAIL");
        ok = ok && pass;
    }
    return ok;
}

bool check(pg_cuda_fi_prefill *fi) {
    const Heads l8{32, 8, 128}, g1{8, 8, 128}, g4{4, 1, 128}, h64{8, 2, 64};
    const Heads w128{32, 8, 128, 100}, wc64{8, 2, 64, 32, 30.0f}, c128{16, 8, 128, 0, 20.0f};
    const Heads f8{32, 8, 128, 0, 0.0f, true}, f8g1{8, 8, 128, 0, 0.0f, true}, f8h64{8, 2, 64, 0, 0.0f, true};
    const Heads f8w{32, 8, 128, 100, 0.0f, true};
    // head_dim 256: Gemma 3 270M / 1B (4/1, window 512), 12B (16/8, window 1024).
    const Heads g270{4, 1, 256}, g12{16, 8, 256}, g270w{4, 1, 256, 512}, g12w{16, 8, 256, 1024};
    const Heads f8g270{4, 1, 256, 0, 0.0f, true}, f8g12w{16, 8, 256, 1024, 0.0f, true};
    const Case cases[] = {
        {"300 + 77 new, 50 after 150 (32/8 hd128)", l8, {{300, 77, 50}, {0, 0, 150}}},
        {"1 token; 1 after 1000; 17 (32/8 hd128)", l8, {{1, 1, 17}, {0, 1000, 0}}},
        {"129 after 15; 2048 after 16 (8/8 hd128)", g1, {{129, 2048}, {15, 16}}},
        {"5 sequences, odd lengths (4/1 hd128)", g4, {{7, 250, 1, 513, 64}, {0, 33, 400, 0, 999}}},
        {"1; 33; 500 after 70; 193 (8/2 hd64)", h64, {{1, 33, 500, 193}, {0, 0, 70, 0}}},
        {"2048 after 6144, 1000 (8/2 hd64)", h64, {{2048, 1000}, {6144, 0}}},
        {"4096 after 28672 cached (32/8 hd128)", l8, {{4096}, {28672}}},
        {"32768 new (32/8 hd128)", l8, {{32768}, {0}}},
        {"window 100: 300 new, 200 after 500 (32/8 hd128)", w128, {{300, 200}, {0, 500}}},
        {"window 32, soft-cap 30: 129 after 15, 77 (8/2 hd64)", wc64, {{129, 77}, {15, 0}}},
        {"soft-cap 20: 1000 after 24, 5 (16/8 hd128)", c128, {{1000, 5}, {24, 3}}},
        {"5 sequences, odd lengths (4/1 hd256)", g270, {{7, 250, 1, 513, 64}, {0, 33, 400, 0, 999}}},
        {"300 + 77 new, 50 after 150 (16/8 hd256)", g12, {{300, 77, 50}, {0, 0, 150}}},
        {"2048 after 6144, 1000 (16/8 hd256)", g12, {{2048, 1000}, {6144, 0}}},
        {"window 512: 1300 new, 200 after 900 (4/1 hd256)", g270w, {{1300, 200}, {0, 900}}},
        {"window 1024: 2000 new, 1 after 3000 (16/8 hd256)", g12w, {{2000, 1}, {0, 3000}}},
        {"fp8: 300 + 77 new, 50 after 150 (32/8 hd128)", f8, {{300, 77, 50}, {0, 0, 150}}},
        {"fp8: 1 token; 1 after 1000; 17 (32/8 hd128)", f8, {{1, 1, 17}, {0, 1000, 0}}},
        {"fp8: 129 after 15; 2048 after 16 (8/8 hd128)", f8g1, {{129, 2048}, {15, 16}}},
        {"fp8: 1; 33; 500 after 70; 193 (8/2 hd64)", f8h64, {{1, 33, 500, 193}, {0, 0, 70, 0}}},
        {"fp8: 4096 after 28672 cached (32/8 hd128)", f8, {{4096}, {28672}}},
        {"fp8: window 100: 300 new, 200 after 500 (32/8 hd128)", f8w, {{300, 200}, {0, 500}}},
        {"fp8: 5 sequences, odd lengths (4/1 hd256)", f8g270, {{7, 250, 1, 513, 64}, {0, 33, 400, 0, 999}}},
        {"fp8: window 1024: 2000 new, 1 after 3000 (16/8 hd256)", f8g12w, {{2000, 1}, {0, 3000}}},
    };
    bool ok = true;
    uint64_t seed = 11;
    for (const Case &c : cases) {
        ok = check_case(fi, c, seed, &c == &cases[0] || (c.hs.f8 && !cases[&c - cases - 1].hs.f8)) && ok;
        seed++;
    }
    return ok;
}

} // namespace

int main(int argc, char **argv) {
    bool quick = false, check_only = false, no_check = false; // --check: the correctness cases alone
    int block_size = 16, th = 32, tkv = 8, thd = 128; // the timing's heads (--heads H/KV/D)
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--check")) check_only = true;
        else if (!strcmp(argv[i], "--no-check")) no_check = true;
        else if (!strcmp(argv[i], "--block-size") && i + 1 < argc) block_size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d/%d/%d", &th, &tkv, &thd) != 3 || th < 1 || tkv < 1 || th % tkv ||
                (thd != 64 && thd != 128 && thd != 256)) {
                fprintf(stderr, "--heads H/KV/D: query heads, KV heads dividing them, head_dim 64, 128 or 256\n");
                return 2;
            }
        }
    }
    if (block_size < 1 || block_size > 1024 || (block_size & (block_size - 1))) {
        fprintf(stderr, "--block-size: a power of two from 1 to 1024\n");
        return 2;
    }
    if (!pg_cuda_fi_prefill_built()) {
        printf("skipped: built without FlashInfer's headers (pip install flashinfer-python; tools/nvcc_or_stub.sh)\n");
        return 77;
    }
    if (!gpu_announce()) return 77;
    setenv("PAGED_CUDA_FI_FP8", "1", 1); // the fp8 cases run FlashInfer's fp8 kernel whatever the caller set
    pg_cuda_fi_prefill *fi = nullptr;
    if (pg_cuda_fi_prefill_create(&fi) < 0) {
        printf("skipped: %s\n", pg_err_msg());
        return 77;
    }
    const bool ok = no_check || check(fi);
    if (!no_check) printf("check: %s\n", ok ? "all passed" : "FAILED");
    if (check_only) {
        pg_cuda_fi_prefill_destroy(fi);
        return ok ? 0 : 1;
    }

    BS = block_size; // the timing's pages (FlashInfer's page_size, our block size)
    struct Shape {
        int n, len;
    } shapes[] = {{1, 4096}, {2, 8192}, {8, 4096}, {1, 32768}};
    for (int f8 = 0; f8 < 2; f8++) {
    const Heads hs{th, tkv, thd, 0, 0.0f, f8 != 0};
    printf("causal prefill, head_dim %d, %d q heads / %d KV heads, %s KV, page %d, all of the prompt new%s\n", hs.hd,
           hs.h, hs.kv, f8 ? "fp8 e4m3" : "bf16", BS, f8 ? " (flashinfer: Q quantized in place, in the time)" : "");
    printf("%-12s %14s %14s %10s %14s\n", "shape", "flashinfer", hs.hd > 128 ? "ours (v1)" : "ours (v2)", "fi/ours",
           "fi 1st call ms");
    for (const Shape &sh : shapes) {
        Batch b;
        for (int s = 0; s < sh.n; s++) {
            b.q_len.push_back(sh.len);
            b.start.push_back(0);
        }
        Setup S;
        setup(S, hs, b, 100 + sh.n);
        // fp8: codes of uniform [-1, 1) / scale, as the checks make them
        if (f8) {
            std::vector<uint8_t> k8(S.kv_elems);
            Rng r8(101);
            for (auto &b8 : k8) b8 = f_to_e4m3(r8.sym() * 448.0f);
            S.kc.up(k8);
            S.vc.up(k8);
        } else {
            fill_random(S.kc.p, S.kv_elems, 101, 1.0f);
            fill_random(S.vc.p, S.kv_elems, 102, 1.0f);
        }
        fill_random(S.q.p, S.q_elems, 103, 2.0f);
        CK(cudaDeviceSynchronize());
        auto t0 = std::chrono::steady_clock::now();
        PK(run_fi(fi, S)); // makes the plan
        const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        double pairs = 0;
        for (int l : b.q_len) pairs += (double)l * (l + 1) / 2.0;
        const double flops = 2.0 * 2.0 * hs.h * hs.hd * pairs;
        const int reps = quick ? 3 : 11;
        double ms_fi = time_ms(2, reps, 3, [&](int) { PK(run_fi(fi, S)); });
        double ms_pg = time_ms(2, reps, 3, [&](int) { run_pg(S); });
        char name[32];
        snprintf(name, sizeof name, "%d x %d", sh.n, sh.len);
        printf("%-12s %9.1f TF/s %9.1f TF/s %9.2fx %14.3f\n", name, flops / ms_fi * 1e-9, flops / ms_pg * 1e-9,
               ms_pg / ms_fi, first_ms);
    }
    }
    pg_cuda_fi_prefill_destroy(fi);
    return ok ? 0 : 1;
}
