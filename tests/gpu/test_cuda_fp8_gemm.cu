// tests/gpu/test_cuda_fp8_gemm.cu - the W8A8 product (kernels/cuda/gemm.cu,
// pg_cuda_gemm_fp8) and the per-token activation quantization that feeds it
// (kernels/cuda/act_quant.cu, pg_cuda_quant_rows_fp8), against their CPU
// references on random inputs.
//
//   - quant: the e4m3 bytes and f32 scales equal pg_quantize_row_fp8's (the
//     CPU twin's W8A8 rule, kernels/dtype.c) bit for bit, on the 16-byte
//     path and the scalar one (odd k, strides), with a zero row, values past
//     448 times the row's scale and e4m3 subnormals.
//   - gemm: the device's quantized activations times an FP8 weight
//     quantized on the host with pg_quantize_row_fp8 (the bytes the CPU
//     backend runs), against fp64 over the same e4m3 values times both
//     scales: what the CPU's quantized mode (kernels/cpu/matmul.c,
//     fp8_matmul) computes, up to the order of its f32 sum. The bound is
//     8e-3 of max |y|: the raw sums are rounded to bf16, then the scaled
//     value again (half an ulp each is up to 2^-8 = 3.9e-3 of |y|), and the
//     f32 sums add ~1e-6; with fast accumulation (cuBLASLt's flag, the
//     CUTLASS configurations named "fast") 4e-3 + 8e-5 sqrt(k), 1.4e-2 at
//     k 14,336. Every matrix of Llama-3-8B and Llama-3-70B (fused
//     QKV, O, fused gate/up, down), m from 9 to 4096 with odd counts,
//     accumulation into a residual, output strides past n. Large m checks
//     at most 48 rows spread over the batch, and every column of them.
//
//   - the one-pass CUTLASS kernel (pg_cuda_gemm_fp8_cutlass) on the same
//     cases, with and without accumulation, at 4e-3 (one bf16 rounding),
//     then each of its configurations (pg_cuda_gemm_fp8_cutlass_cfg: every
//     tile, cluster and schedule, the swapped product, the scheduler's
//     swizzle and raster order in turn) on the same inputs; and what the
//     configurations' entry point declines;
//   - the fused quantizations (pg_cuda_rmsnorm_quant_fp8,
//     pg_cuda_silu_mul_quant_fp8) against their unfused chains on the
//     device (add_rmsnorm or silu_mul, then quant_rows_fp8): h bit for bit;
//     the e4m3 bytes and scales equal, or at most 1 in 10^4 bytes one code
//     apart (a sum of squares that a compiler contracted differently),
//     reported as counts.
//   - the FP8 GEMV for 1-8 rows (kernels/cuda/gemv.cu, pg_cuda_gemv_fp8 and
//     its fused RMSNorm / SiLU variants; see gemv_tests below).
//
// Usage: build/gpu/test_cuda_fp8_gemm [-k FILTER]   exit 0 pass, 1 fail, 77 no GPU.
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/gpu/gpu_util.h"
extern "C" {
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dtype.h"
}
#include "tests/gpu/kernels_test_common.cuh" // make_fp8_weight, e4m3_values, e4m3_dot

static const char *g_filter = "";
static int g_fail = 0, g_ok = 0;
static bool selected(const char *name) { return strstr(name, g_filter) != nullptr; }

static void report(const char *name, double err, double bound) {
    const bool ok = err == err && err <= bound;
    printf("%-4s %-72s max_rel %.3e (bound %.2g)\n", ok ? "ok" : "FAIL", name, err, bound);
    fflush(stdout);
    ok ? g_ok++ : g_fail++;
}

static void report_bool(const char *name, bool ok, const char *detail) {
    printf("%-4s %-72s %s\n", ok ? "ok" : "FAIL", name, detail);
    fflush(stdout);
    ok ? g_ok++ : g_fail++;
}

// Random bf16 activations as a layer sees them: most values small, a few
// outlier channels far larger (they set the row's scale), some rows much
// smaller than others, and (when `zero_row` >= 0) one row all zeros.
static void fill_acts(std::vector<uint16_t> &x, int rows, int k, int ldx, Rng &r, int zero_row) {
    for (int i = 0; i < rows; i++) {
        const float mag = i % 5 == 0 ? 1e-3f : i % 3 == 0 ? 30.0f : 1.0f;
        for (int t = 0; t < k; t++) {
            float v = r.sym() * mag;
            if (t % 97 == i % 97) v *= 20.0f; // outlier channels
            if (t % 13 == 0) v *= 1e-4f;      // values that land on e4m3 subnormals
            x[(size_t)i * ldx + t] = f2bf(i == zero_row ? 0.0f : v);
        }
    }
}

// pg_cuda_quant_rows_fp8 against pg_quantize_row_fp8, bit for bit.
static void test_quant(int rows, int k, int ldx, int ldq, int align_off, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "quant rows=%d k=%d ldx=%d ldq=%d%s", rows, k, ldx, ldq,
             align_off ? " (x 2-byte aligned)" : "");
    if (!selected(name)) return;
    std::vector<uint16_t> x((size_t)rows * ldx + align_off, 0);
    std::vector<uint16_t> xs((size_t)rows * ldx);
    fill_acts(xs, rows, k, ldx, r, rows > 2 ? 2 : -1);
    std::copy(xs.begin(), xs.end(), x.begin() + align_off);
    DBuf dx, dq((size_t)rows * ldq), ds((size_t)rows * 4);
    dx.up(x);
    CK(cudaMemset(dq.p, 0x5a, dq.n));
    PK(pg_cuda_quant_rows_fp8(dq.p, ldq, ds.as<float>(), (const uint16_t *)dx.p + align_off, ldx, rows, k, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> gq((size_t)rows * ldq);
    std::vector<float> gs((size_t)rows);
    dq.down(gq);
    ds.down(gs);
    int bad_q = 0, bad_s = 0, bad_pad = 0;
    std::vector<float> row((size_t)k);
    std::vector<uint8_t> q((size_t)k);
    for (int i = 0; i < rows; i++) {
        for (int t = 0; t < k; t++) row[(size_t)t] = bf2f(xs[(size_t)i * ldx + t]);
        float s;
        pg_quantize_row_fp8(row.data(), k, q.data(), &s);
        if (memcmp(&s, &gs[(size_t)i], 4) != 0) bad_s++;
        for (int t = 0; t < k; t++) bad_q += q[(size_t)t] != gq[(size_t)i * ldq + t];
        for (int t = k; t < ldq; t++) bad_pad += gq[(size_t)i * ldq + t] != 0x5a;
    }
    char detail[128];
    snprintf(detail, sizeof detail, "%d of %d bytes, %d of %d scales differ; %d padding bytes written", bad_q,
             rows * k, bad_s, rows, bad_pad);
    report_bool(name, bad_q == 0 && bad_s == 0 && bad_pad == 0, detail);
}

// Compares two quantized outputs: bytes equal, or rarely one code apart.
static void compare_quant(const char *name, const std::vector<uint8_t> &a, const std::vector<uint8_t> &b,
                          const std::vector<float> &sa, const std::vector<float> &sb, const char *extra) {
    int64_t diff = 0, far = 0, sdiff = 0;
    for (size_t i = 0; i < a.size(); i++)
        if (a[i] != b[i]) {
            diff++;
            // e4m3 codes of one sign are ordered: one step is a difference of 1
            if ((a[i] & 0x80) != (b[i] & 0x80) || abs((int)(a[i] & 0x7f) - (int)(b[i] & 0x7f)) > 1) far++;
        }
    for (size_t i = 0; i < sa.size(); i++)
        if (!(fabsf(sa[i] - sb[i]) <= 4e-7f * fabsf(sb[i]))) sdiff++;
    char detail[200];
    snprintf(detail, sizeof detail, "%lld of %zu bytes differ (%lld by more than one code), %lld scales%s",
             (long long)diff, a.size(), (long long)far, (long long)sdiff, extra);
    report_bool(name, far == 0 && sdiff == 0 && (double)diff <= 1e-4 * (double)a.size(), detail);
}

// pg_cuda_rmsnorm_quant_fp8 against add_rmsnorm + quant_rows_fp8.
static void test_rmsnorm_quant(int m, int dim, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "rmsnorm_quant m=%d dim=%d", m, dim);
    if (!selected(name)) return;
    std::vector<uint16_t> x((size_t)m * dim), w((size_t)dim);
    fill_acts(x, m, dim, dim, r, m > 2 ? 1 : -1);
    for (auto &v : w) v = f2bf(1.0f + 0.5f * r.sym());
    DBuf dx, dw, tmp((size_t)m * dim * 2), q1((size_t)m * dim), q2((size_t)m * dim), s1((size_t)m * 4), s2((size_t)m * 4);
    dx.up(x);
    dw.up(w);
    PK(pg_cuda_add_rmsnorm(tmp.p, dx.p, nullptr, dw.p, m, dim, 1e-5f, nullptr));
    PK(pg_cuda_quant_rows_fp8(q1.p, dim, s1.as<float>(), tmp.p, dim, m, dim, nullptr));
    PK(pg_cuda_rmsnorm_quant_fp8(q2.p, dim, s2.as<float>(), dx.p, dw.p, m, dim, 1e-5f, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> a((size_t)m * dim), b((size_t)m * dim);
    std::vector<float> sa((size_t)m), sb((size_t)m);
    q2.down(a);
    q1.down(b);
    s2.down(sa);
    s1.down(sb);
    std::vector<uint16_t> x2(x.size());
    dx.down(x2);
    compare_quant(name, a, b, sa, sb, x2 == x ? "" : "; x WAS MODIFIED");
    if (x2 != x) g_fail++;
}

// pg_cuda_silu_mul_quant_fp8 against silu_mul + quant_rows_fp8.
static void test_silu_mul_quant(int m, int ffn, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "silu_mul_quant m=%d ffn=%d", m, ffn);
    if (!selected(name)) return;
    std::vector<uint16_t> gu((size_t)m * 2 * ffn);
    fill_acts(gu, m, 2 * ffn, 2 * ffn, r, -1);
    DBuf dgu, h1((size_t)m * ffn * 2), h2((size_t)m * ffn * 2), q1((size_t)m * ffn), q2((size_t)m * ffn),
        s1((size_t)m * 4), s2((size_t)m * 4);
    dgu.up(gu);
    PK(pg_cuda_silu_mul(h1.p, dgu.p, m, ffn, nullptr));
    PK(pg_cuda_quant_rows_fp8(q1.p, ffn, s1.as<float>(), h1.p, ffn, m, ffn, nullptr));
    PK(pg_cuda_silu_mul_quant_fp8(h2.p, q2.p, ffn, s2.as<float>(), dgu.p, m, ffn, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> ha((size_t)m * ffn), hb((size_t)m * ffn);
    h2.down(ha);
    h1.down(hb);
    std::vector<uint8_t> a((size_t)m * ffn), b((size_t)m * ffn);
    std::vector<float> sa((size_t)m), sb((size_t)m);
    q2.down(a);
    q1.down(b);
    s2.down(sa);
    s1.down(sb);
    int64_t hdiff = 0;
    for (size_t i = 0; i < ha.size(); i++) hdiff += ha[i] != hb[i];
    char extra[64];
    snprintf(extra, sizeof extra, "; h: %lld values differ", (long long)hdiff);
    compare_quant(name, a, b, sa, sb, extra);
    if (hdiff) g_fail++;
}

// An FP8 weight [n][k] quantized per row on the host, and on the device
// (kernels_test_common.cuh's make_fp8_weight).
struct F8Weight {
    int n, k;
    std::vector<uint8_t> q;
    std::vector<float> scales;
    DBuf dq, ds;
    F8Weight(int n_, int k_, uint64_t seed) : n(n_), k(k_) { make_fp8_weight(n, k, seed, q, scales, dq, ds); }
};

// The one-pass kernel's configurations past the default call
// (pg_cuda_gemm_fp8_cutlass_cfg) on every CUTLASS case: each configuration
// once a case, the persistent ones with the scheduler's knobs taken in turn
// from this list (so each meets swizzle 1, 2, 4, 8 and raster heuristic,
// along m, along n over the cases); the others with none (1, heuristic).
struct CfgRun {
    int cfg, swizzle, raster;
};
static const int kKnobs[][2] = {{8, 1}, {1, 2}, {2, 0}, {8, 2}, {1, 1}, {4, 2}, {8, 0}, {2, 1}};
static int g_knob_turn = 0;
static int g_n_cfgs = 0; // configurations built (0 without CUTLASS)

static std::vector<CfgRun> cutlass_runs() {
    std::vector<CfgRun> v = {{-1, 1, 0}}; // -1: pg_cuda_gemm_fp8_cutlass itself (c0, the defaults)
    const int *kn = kKnobs[g_knob_turn++ % (int)(sizeof kKnobs / sizeof kKnobs[0])];
    for (int c = 0; c < g_n_cfgs; c++) {
        // The configurations with one consumer warpgroup (" ws") have no
        // persistent scheduler, hence no knobs.
        const bool sched = !strstr(pg_cuda_gemm_fp8_cutlass_cfg_name(c), " ws");
        v.push_back({c, sched ? kn[0] : 1, sched ? kn[1] : 0});
    }
    return v;
}

static const char *raster_tag(int r) { return r == 0 ? "heur" : r == 1 ? "m" : "n"; }

// out = quant(x) . w^T through the device quantizer and pg_cuda_gemm_fp8,
// against fp64 over pg_quantize_row_fp8's values. `acc`: out starts as a
// random residual that the product adds to; else as NaN (every entry must be
// written). Columns in [n, ldo) must stay untouched. `cutlass`: the one-pass
// kernel instead, its default call and then every configuration on the same
// inputs against the same reference (names gemm_fp8_cutlass_c<i> ... sw<s>
// raster=<r>; -k selects among them).
static void test_gemm(pg_cuda_gemm *g, DBuf &ws, F8Weight &W, int m, int ldo, bool acc, bool fast, Rng &r,
                      bool cutlass = false) {
    const int n = W.n, k = W.k;
    std::vector<CfgRun> runs = cutlass ? cutlass_runs() : std::vector<CfgRun>{{-2, 1, 0}};
    std::vector<std::string> names;
    bool any = false;
    for (const CfgRun &cr : runs) {
        char name[200], tag[48] = "";
        if (cr.cfg >= 0) snprintf(tag, sizeof tag, " sw%d raster=%s", cr.swizzle, raster_tag(cr.raster));
        char kind[32] = "";
        if (cr.cfg == -1) snprintf(kind, sizeof kind, "_cutlass");
        if (cr.cfg >= 0) snprintf(kind, sizeof kind, "_cutlass_c%d", cr.cfg);
        snprintf(name, sizeof name, "gemm_fp8%s m=%d n=%d k=%d ldo=%d%s%s%s", kind, m, n, k, ldo,
                 acc ? " accumulate" : "", fast ? " fast-accum" : "", tag);
        names.push_back(name);
        any |= selected(name);
    }
    if (!any) return;
    std::vector<uint16_t> x((size_t)m * k), o0((size_t)m * ldo);
    fill_acts(x, m, k, k, r, m > 3 ? 3 : -1);
    if (acc)
        fill_bf16(o0, r, 4.0f);
    else
        std::fill(o0.begin(), o0.end(), (uint16_t)0x7fc0); // NaN
    DBuf dx, dout, dxq((size_t)m * k), dxs((size_t)m * 4);
    dx.up(x);
    PK(pg_cuda_quant_rows_fp8(dxq.p, k, dxs.as<float>(), dx.p, k, m, k, nullptr));
    // The rows checked: all when m <= 48, else 48 spread over the batch
    // (first and last included).
    std::vector<int> rows;
    const int nr = std::min(m, 48);
    for (int i = 0; i < nr; i++) rows.push_back(nr == 1 ? 0 : (int)((int64_t)i * (m - 1) / (nr - 1)));
    std::vector<std::vector<float>> xd(rows.size(), std::vector<float>((size_t)k));
    std::vector<float> xsc(rows.size());
    const float *e4m3 = e4m3_values();
    for (size_t a = 0; a < rows.size(); a++) {
        std::vector<float> row((size_t)k);
        std::vector<uint8_t> q((size_t)k);
        for (int t = 0; t < k; t++) row[(size_t)t] = bf2f(x[(size_t)rows[a] * k + t]);
        pg_quantize_row_fp8(row.data(), k, q.data(), &xsc[a]);
        for (int t = 0; t < k; t++) xd[a][(size_t)t] = e4m3[q[(size_t)t]];
    }
    std::vector<double> ref(rows.size() * (size_t)n), out(rows.size() * (size_t)n);
    parallel_for((int64_t)n, [&](int64_t j) {
        const uint8_t *wr = &W.q[(size_t)j * k];
        for (size_t a = 0; a < rows.size(); a++) {
            const double s = e4m3_dot(xd[a].data(), wr, k);
            const size_t o = (size_t)rows[a] * ldo + (size_t)j;
            ref[a * n + (size_t)j] = s * (double)xsc[a] * (double)W.scales[(size_t)j] + (acc ? bf2f(o0[o]) : 0.0);
        }
    });
    DBuf tmp(acc && !cutlass ? (size_t)m * n * 2 : 0);
    std::vector<uint16_t> go(o0.size());
    for (size_t ri = 0; ri < runs.size(); ri++) {
        const CfgRun &cr = runs[ri];
        const char *name = names[ri].c_str();
        if (!selected(name)) continue;
        dout.up(o0);
        const float *dxsf = dxs.as<float>(), *dws = W.ds.as<float>();
        int rc = cr.cfg >= 0  ? pg_cuda_gemm_fp8_cutlass_cfg(cr.cfg, cr.swizzle, cr.raster, dout.p, ldo, dxq.p, dxsf,
                                                             W.dq.p, dws, m, n, k, acc, ws.p, ws.n, nullptr)
                 : cutlass    ? pg_cuda_gemm_fp8_cutlass(dout.p, ldo, dxq.p, dxsf, W.dq.p, dws, m, n, k, acc, ws.p,
                                                         ws.n, nullptr)
                              : pg_cuda_gemm_fp8(g, dout.p, ldo, dxq.p, k, dxsf, W.dq.p, dws, m, n, k, acc, fast,
                                                 acc ? tmp.p : nullptr, acc ? tmp.n : 0, ws.p, ws.n, nullptr);
        if (rc != 0) {
            report_bool(name, false, pg_err_msg());
            continue;
        }
        CK(cudaDeviceSynchronize());
        dout.down(go);
        for (size_t a = 0; a < rows.size(); a++)
            for (int j = 0; j < n; j++) out[a * n + (size_t)j] = bf2f(go[(size_t)rows[a] * ldo + (size_t)j]);
        int touched = 0;
        for (int i = 0; i < m; i++)
            for (int j = n; j < ldo; j++) touched += go[(size_t)i * ldo + j] != o0[(size_t)i * ldo + j];
        double d = 0, mx = 0;
        for (size_t i = 0; i < out.size(); i++) {
            if (!(out[i] == out[i])) {
                d = NAN;
                break;
            }
            d = std::max(d, fabs(out[i] - ref[i]));
            mx = std::max(mx, fabs(ref[i]));
        }
        const double err = d != d ? d : mx > 0 ? d / mx : d;
        if (touched) {
            char detail[96];
            snprintf(detail, sizeof detail, "%d values past n written (max_rel %.3e)", touched, err);
            report_bool(name, false, detail);
            continue;
        }
        // CUTLASS rounds once (the scaled f32 value to bf16): half an ulp.
        // Fast accumulation (cuBLASLt's flag, the " fast" configurations)
        // keeps the tensor core's own accumulator, whose truncations add up
        // along k: 4e-3 + 8e-5 sqrt(k) (H100, session 18, c7's worst over
        // the cases: 3.4e-3 at k 576, 7.2e-3 at 4,096, 8.6e-3 at 8,192,
        // 1.17e-2 at 14,336, 1.23e-2 at 28,672; the bound is 1.4-1.7x those).
        const bool fast_cfg = cr.cfg >= 0 && strstr(pg_cuda_gemm_fp8_cutlass_cfg_name(cr.cfg), " fast");
        const double fast_bound = 4e-3 + 8e-5 * sqrt((double)k);
        report(name, err, fast || fast_cfg ? fast_bound : cutlass ? 4e-3 : 8e-3);
    }
}

// What pg_cuda_gemm_fp8_cutlass_cfg declines (PG_EUNSUPP) or rejects
// (PG_EINVAL), writing nothing: an unknown configuration, knobs on one
// without a scheduler, a swizzle or raster out of range. And the names end.
static void test_cutlass_cfg_refusals(DBuf &ws) {
    const char *name = "gemm_fp8_cutlass_cfg refusals";
    if (!selected(name) || !g_n_cfgs) return;
    DBuf o(64 * 64 * 2), x(64 * 64), w(64 * 64), s(256);
    CK(cudaMemset(o.p, 0x5a, o.n));
    float *sc = s.as<float>();
    int ws_cfg = -1; // a configuration without a scheduler
    for (int c = 0; c < g_n_cfgs && ws_cfg < 0; c++)
        if (strstr(pg_cuda_gemm_fp8_cutlass_cfg_name(c), " ws")) ws_cfg = c;
#define CF(cfg, sw, ra) \
    pg_cuda_gemm_fp8_cutlass_cfg(cfg, sw, ra, o.p, 64, x.p, sc, w.p, sc, 16, 16, 64, 0, ws.p, ws.n, nullptr)
    const Refusal c[] = {
        {"cfg -1", CF(-1, 1, 0), PG_EUNSUPP},
        {"cfg past the last", CF(g_n_cfgs, 1, 0), PG_EUNSUPP},
        {"swizzle 3", CF(0, 3, 0), PG_EINVAL},
        {"raster 3", CF(0, 1, 3), PG_EINVAL},
        {"knobs without a scheduler (swizzle)", ws_cfg < 0 ? PG_EUNSUPP : CF(ws_cfg, 8, 0), PG_EUNSUPP},
        {"knobs without a scheduler (raster)", ws_cfg < 0 ? PG_EUNSUPP : CF(ws_cfg, 1, 2), PG_EUNSUPP},
        {"name past the last", pg_cuda_gemm_fp8_cutlass_cfg_name(g_n_cfgs) ? 1 : 0, 0},
    };
#undef CF
    std::string detail;
    const bool ok = refusals_ok(o, c, detail);
    report_bool(name, ok, detail.c_str());
}

// Shapes and strides the launcher declines (PG_EUNSUPP) or rejects
// (PG_EINVAL), writing nothing.
static void test_refusals(pg_cuda_gemm *g, DBuf &ws) {
    const char *name = "gemm_fp8 refusals";
    if (!selected(name)) return;
    DBuf o(64 * 64 * 2), x(64 * 64), w(64 * 64), s(256);
    CK(cudaMemset(o.p, 0x5a, o.n));
    float *sc = s.as<float>();
    const Refusal c[] = {
#define F8(ldo, ldx, xs, k, acc, tmp, tmpn) \
    pg_cuda_gemm_fp8(g, o.p, ldo, x.p, ldx, xs, w.p, sc, 16, 16, k, acc, 0, tmp, tmpn, ws.p, ws.n, nullptr)
        {"k 24", F8(64, 24, sc, 24, 0, nullptr, 0), PG_EUNSUPP},
        {"ldx 40", F8(64, 40, sc, 32, 0, nullptr, 0), PG_EUNSUPP},
        {"ldo 20", F8(20, 32, sc, 32, 0, nullptr, 0), PG_EUNSUPP},
        {"accumulate without tmp", F8(64, 32, sc, 32, 1, nullptr, 0), PG_EUNSUPP},
        {"accumulate, tmp too small", F8(64, 32, sc, 32, 1, x.p, 16 * 16 * 2 - 2), PG_EUNSUPP},
        {"no scales", F8(64, 32, nullptr, 32, 0, nullptr, 0), PG_EINVAL},
        {"ldx < k", F8(64, 16, sc, 32, 0, nullptr, 0), PG_EINVAL},
#undef F8
        {"quant ldq < k", pg_cuda_quant_rows_fp8(x.p, 16, sc, o.p, 64, 4, 32, nullptr), PG_EINVAL},
        {"rmsnorm_quant dim 100", pg_cuda_rmsnorm_quant_fp8(x.p, 100, sc, w.p, w.p, 4, 100, 1e-5f, nullptr), PG_EUNSUPP},
        {"silu_mul_quant ffn 100", pg_cuda_silu_mul_quant_fp8(x.p, w.p, 100, sc, w.p, 4, 100, nullptr), PG_EUNSUPP},
    };
    std::string detail;
    const bool ok = refusals_ok(o, c, detail);
    report_bool(name, ok, detail.c_str());
}

// --- the FP8 GEMV for 1-8 rows (kernels/cuda/gemv.cu: pg_cuda_gemv_fp8 and its fused variants) ---
//
// Weight-only: bf16 x times the e4m3 weight (each value exact in f32), the
// row's f32 sum times its scale, (+ out,) one bf16 rounding. Against fp64
// over the same values: 4e-3 of max |y| (half a bf16 ulp). Against qgemv.cu's
// FP8 GEMV, the decode path it replaces (the same arithmetic summed in
// another order, so at most one bf16 ulp apart: 8e-3 of max |y|), with the
// count of identical outputs. The fused variants against their unfused chain
// on the device (add_rmsnorm, pg_cuda_gemv_fp8 [, silu_mul]): every output
// bit for bit, as the bf16 GEMV's fused variants (the same sums in the same
// order), and against fp64 over the bf16-rounded normalized rows (1e-2).
// Every case runs under the GEMV kinds the backend uses (0, the register
// kernel; 1 and 2, the rings, with the weights-before-wait promise).
static char g_kind_tag[48] = "";

static void test_gemv(F8Weight &W, int m, int ldx, int ldo, bool acc, Rng &r) {
    const int n = W.n, k = W.k;
    char name[160];
    snprintf(name, sizeof name, "gemv_fp8 m=%d n=%d k=%d ldx=%d ldo=%d%s%s", m, n, k, ldx, ldo,
             acc ? " accumulate" : "", g_kind_tag);
    if (!selected(name)) return;
    std::vector<uint16_t> x((size_t)m * ldx), o0((size_t)m * ldo);
    fill_bf16(x, r, 1.0f);
    if (acc) fill_bf16(o0, r, 1.0f);
    else o0.assign(o0.size(), 0xFFFF); // NaN: every entry must be written
    DBuf dx, dout, dold;
    dx.up(x);
    dout.up(o0);
    dold.up(o0);
    int rc = pg_cuda_gemv_fp8(dout.p, ldo, dx.p, ldx, W.dq.p, W.ds.as<float>(), m, n, k, acc, nullptr);
    if (rc != 0) {
        report_bool(name, false, pg_err_msg());
        return;
    }
    PK(pg_cuda_qgemv(dold.p, ldo, dx.p, ldx, W.dq.p, W.ds.as<float>(), PG_DTYPE_FP8_E4M3, m, n, k, acc, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go(o0.size()), gold(o0.size());
    dout.down(go);
    dold.down(gold);
    std::vector<double> ref((size_t)m * n), out, old;
    parallel_for((int64_t)m * n, [&](int64_t t) {
        const int i = (int)(t / n), j = (int)(t % n);
        const uint16_t *xr = &x[(size_t)i * ldx];
        const double s = e4m3_dot(xr, &W.q[(size_t)j * k], k);
        ref[(size_t)t] = s * W.scales[(size_t)j] + (acc ? (double)bf2f(o0[(size_t)i * ldo + j]) : 0.0);
    });
    const bool outside_ok = gemv_out(go, o0, m, n, ldo, out);
    report(name, outside_ok ? max_rel(out, ref) : NAN, 4e-3);
    gemv_out(gold, o0, m, n, ldo, old);
    int same = 0;
    for (size_t t = 0; t < out.size(); t++) same += out[t] == old[t];
    const double e = max_rel(out, old);
    char nm[200], detail[160];
    snprintf(nm, sizeof nm, "%s vs qgemv", name);
    snprintf(detail, sizeof detail, "%d of %d outputs identical, max_rel %.3e (bound 8e-03)", same, m * n, e);
    report_bool(nm, e == e && e <= 8e-3, detail);
}

// W: [n][k], or with silu the fused [gate|up] weight [2 ffn][k].
static void test_gemv_norm(F8Weight &W, int m, int ldx, int ldo, bool silu, Rng &r) {
    const int k = W.k, n = silu ? W.n / 2 : W.n;
    char name[160];
    snprintf(name, sizeof name, "%s m=%d %s=%d k=%d ldx=%d ldo=%d%s",
             silu ? "gemv_rmsnorm_silu_fp8" : "gemv_rmsnorm_fp8", m, silu ? "ffn" : "n", n, k, ldx, ldo,
             g_kind_tag);
    if (!selected(name)) return;
    const float eps = 1e-5f;
    std::vector<uint16_t> x((size_t)m * ldx), nw((size_t)k), o0((size_t)m * ldo, 0xFFFF);
    fill_bf16(x, r, 3.0f);
    for (auto &v : nw) v = f2bf(1.0f + 0.5f * r.sym());
    DBuf dx, dnw, dout;
    dx.up(x);
    dnw.up(nw);
    dout.up(o0);
    const float *sc = W.ds.as<float>();
    int rc = silu ? pg_cuda_gemv_rmsnorm_silu_fp8(dout.p, ldo, dx.p, ldx, dnw.p, eps, W.dq.p, sc, m, n, k, nullptr)
                  : pg_cuda_gemv_rmsnorm_fp8(dout.p, ldo, dx.p, ldx, dnw.p, eps, W.dq.p, sc, m, n, k, nullptr);
    if (rc != 0) {
        report_bool(name, false, pg_err_msg());
        return;
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go(o0.size()), gx(x.size());
    dout.down(go);
    dx.down(gx);
    // fp64 over the normalized rows rounded to bf16 (as the kernels keep them).
    const std::vector<double> xn = norm_rows_ref(x, ldx, nw, m, k, eps);
    std::vector<double> ref((size_t)m * n), out;
    parallel_for((int64_t)m * n, [&](int64_t t) {
        const int i = (int)(t / n), j = (int)(t % n);
        const double *xr = &xn[(size_t)i * k];
        auto dot = [&](int row) { return e4m3_dot(xr, &W.q[(size_t)row * k], k) * W.scales[(size_t)row]; };
        const double g = dot(j);
        ref[(size_t)t] = silu ? g / (1.0 + exp(-g)) * dot(n + j) : g;
    });
    const bool outside_ok = gemv_out(go, o0, m, n, ldo, out);
    report(name, outside_ok && gx == x ? rel_err(out, ref) : NAN, 1e-2);
    if (ldx != k) return; // add_rmsnorm takes contiguous rows
    // The unfused chain on the device.
    const int ngu = silu ? 2 * n : n;
    DBuf dxn((size_t)m * k * 2), dgu((size_t)m * ngu * 2), dh((size_t)m * n * 2);
    PK(pg_cuda_add_rmsnorm(dxn.p, dx.p, nullptr, dnw.p, m, k, eps, nullptr));
    PK(pg_cuda_gemv_fp8(dgu.p, ngu, dxn.p, k, W.dq.p, sc, m, ngu, k, 0, nullptr));
    if (silu) PK(pg_cuda_silu_mul(dh.p, dgu.p, m, n, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> gu((size_t)m * n);
    if (silu) {
        dh.down(gu);
    } else {
        gu.resize((size_t)m * ngu);
        dgu.down(gu);
    }
    int same = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) same += gu[(size_t)i * n + j] == go[(size_t)i * ldo + j];
    char nm[200], detail[96];
    snprintf(nm, sizeof nm, "%s vs unfused", name);
    snprintf(detail, sizeof detail, "%d of %d outputs bit-identical", same, m * n);
    report_bool(nm, same == m * n, detail);
}

// What the FP8 GEMV declines (PG_EUNSUPP: the backend takes qgemv.cu's) or
// rejects (PG_EINVAL), writing nothing.
static void test_gemv_refusals() {
    const char *name = "gemv_fp8 refusals";
    if (!selected(name)) return;
    DBuf o(4096), x(65536), w(65536), s(4096), nw(4096);
    CK(cudaMemset(o.p, 0x5a, o.n));
    const float *sc = s.as<float>();
    const Refusal c[] = {
        {"k 24", pg_cuda_gemv_fp8(o.p, 16, x.p, 24, w.p, sc, 1, 16, 24, 0, nullptr), PG_EUNSUPP},
        {"m 9", pg_cuda_gemv_fp8(o.p, 16, x.p, 64, w.p, sc, 9, 16, 64, 0, nullptr), PG_EUNSUPP},
        {"x misaligned", pg_cuda_gemv_fp8(o.p, 16, (char *)x.p + 2, 64, w.p, sc, 1, 16, 64, 0, nullptr), PG_EUNSUPP},
        {"no scales", pg_cuda_gemv_fp8(o.p, 16, x.p, 64, w.p, nullptr, 1, 16, 64, 0, nullptr), PG_EINVAL},
        {"norm k 40", pg_cuda_gemv_rmsnorm_fp8(o.p, 16, x.p, 40, nw.p, 1e-5f, w.p, sc, 1, 16, 40, nullptr),
         PG_EUNSUPP},
        {"silu no scales",
         pg_cuda_gemv_rmsnorm_silu_fp8(o.p, 16, x.p, 64, nw.p, 1e-5f, w.p, nullptr, 1, 8, 64, nullptr), PG_EINVAL},
        {"m 0", pg_cuda_gemv_fp8(o.p, 16, x.p, 64, w.p, sc, 0, 16, 64, 0, nullptr), 0},
    };
    std::string detail;
    const bool ok = refusals_ok(o, c, detail);
    report_bool(name, ok, detail.c_str());
}

static void gemv_tests(uint64_t seed) {
    test_gemv_refusals();
    // Llama-3-8B's decode shapes, a 70B down projection, SmolLM2-sized and tiny.
    F8Weight QKV(6144, 4096, seed + 1), O(4096, 4096, seed + 2), GU(28672, 4096, seed + 3), D(4096, 14336, seed + 4),
        D70(8192, 28672, seed + 5), S(1536, 576, seed + 6), T(14, 64, seed + 7);
    const int kinds[][2] = {{0, 0}, {1, 1}, {2, 1}};
    for (auto &kp : kinds) {
        snprintf(g_kind_tag, sizeof g_kind_tag, " [kind %d%s]", kp[0], kp[1] ? " preload" : "");
        pg_cuda_gemv_kernel_set(kp[0]);
        pg_cuda_gemv_preload_set(kp[1]);
        Rng r(20261206); // the same inputs under every kind
        for (int m = 1; m <= 8; m++) test_gemv(O, m, O.k, O.n, m % 3 == 0, r);
        for (int m : {1, 2, 5, 8}) test_gemv(D, m, D.k, D.n, true, r);
        for (int m : {1, 3}) test_gemv(D70, m, D70.k, D70.n, m == 1, r);
        test_gemv(GU, 1, GU.k, GU.n, false, r);
        for (int m = 1; m <= 8; m++) test_gemv(S, m, S.k, S.n, false, r);
        test_gemv(S, 3, S.k + 64, S.n + 24, true, r); // strides past k and n, into a residual
        for (int m : {1, 8}) test_gemv(T, m, T.k, T.n, false, r);
        for (int m : {1, 2, 4, 8}) test_gemv_norm(QKV, m, QKV.k, QKV.n, false, r);
        test_gemv_norm(QKV, 2, QKV.k + 64, QKV.n + 8, false, r);
        for (int m = 1; m <= 8; m++) test_gemv_norm(GU, m, GU.k, GU.n / 2, true, r);
        test_gemv_norm(GU, 3, GU.k + 32, GU.n / 2 + 8, true, r);
        for (int m : {2, 5}) test_gemv_norm(S, m, S.k, S.n / 2, true, r);
        for (int m : {1, 8}) test_gemv_norm(T, m, T.k, T.n / 2, true, r);
        test_gemv_norm(T, 3, T.k, T.n, false, r);
    }
    pg_cuda_gemv_kernel_set(-1);
    pg_cuda_gemv_preload_set(0);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-k") && i + 1 < argc) g_filter = argv[++i];
    if (!gpu_announce()) return 77;
    Rng r(20261205);

    test_quant(7, 4096, 4096, 4096, 0, r);
    test_quant(300, 14336, 14336, 14336, 0, r);
    test_quant(5, 8192, 8320, 8192, 0, r);  // x stride past k
    test_quant(9, 576, 576, 592, 0, r);     // q stride past k (padding untouched)
    test_quant(3, 100, 104, 100, 0, r);     // k not a multiple of 8: scalar path
    test_quant(4, 4096, 4096, 4096, 1, r);  // x not 16-byte aligned: scalar path
    test_quant(1, 28672, 28672, 28672, 0, r);
    for (int m : {1, 9, 300, 2048}) test_rmsnorm_quant(m, 4096, r);
    test_rmsnorm_quant(17, 8192, r);  // 70B's hidden: two vectors per thread
    test_rmsnorm_quant(5, 576, r);    // SmolLM2's hidden
    test_rmsnorm_quant(3, 16384, r);  // four vectors per thread
    for (int m : {1, 9, 300, 2048}) test_silu_mul_quant(m, 14336, r);
    test_silu_mul_quant(7, 28672, r);
    test_silu_mul_quant(13, 1536, r);

    pg_cuda_gemm *g = nullptr;
    PK(pg_cuda_gemm_create(&g));
    {
        DBuf ws(PG_CUDA_GEMM_WORKSPACE);
        test_refusals(g, ws);
        while (pg_cuda_gemm_fp8_cutlass_cfg_name(g_n_cfgs)) g_n_cfgs++;
        test_cutlass_cfg_refusals(ws);
        // Llama-3-8B (n x k): fused QKV, O, fused gate/up, down.
        const int s8b[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
        uint64_t seed = 1;
        for (auto &sh : s8b) {
            F8Weight W(sh[0], sh[1], seed++);
            for (int m : {9, 33, 256, 1000, 4096}) test_gemm(g, ws, W, m, W.n, false, false, r);
            test_gemm(g, ws, W, 17, W.n, true, false, r);   // into the residual stream
            test_gemm(g, ws, W, 511, W.n, false, true, r);  // fast accumulation
            for (int m : {9, 200, 1000, 4096}) test_gemm(g, ws, W, m, W.n, false, false, r, true);
            for (int m : {17, 1000}) test_gemm(g, ws, W, m, W.n, true, false, r, true); // into the residual
        }
        // Llama-3-70B at one GPU's width.
        const int s70b[][2] = {{10240, 8192}, {8192, 8192}, {57344, 8192}, {8192, 28672}};
        for (auto &sh : s70b) {
            F8Weight W(sh[0], sh[1], seed++);
            for (int m : {16, 2048}) test_gemm(g, ws, W, m, W.n, false, false, r);
            test_gemm(g, ws, W, 129, W.n, true, false, r);
            test_gemm(g, ws, W, 2048, W.n, false, false, r, true);
            test_gemm(g, ws, W, 129, W.n, true, false, r, true);
        }
        // Small and odd: SmolLM2-sized, an output stride past n.
        F8Weight S(1536, 576, seed++);
        for (int m : {1, 8, 9, 13, 64}) test_gemm(g, ws, S, m, S.n, false, false, r);
        test_gemm(g, ws, S, 13, S.n + 24, true, false, r);
        for (int m : {1, 13, 64}) test_gemm(g, ws, S, m, S.n, false, false, r, true);
        test_gemm(g, ws, S, 13, S.n + 24, false, false, r, true); // rows of D wider than n
        test_gemm(g, ws, S, 13, S.n + 24, true, false, r, true);
    }
    pg_cuda_gemm_destroy(g);
    gemv_tests(100);
    printf("%d passed, %d failed\n", g_ok, g_fail);
    return g_fail ? 1 : 0;
}
