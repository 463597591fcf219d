// tests/gpu/test_cuda_moe.cu - the mixture-of-experts feed-forward
// (kernels/cuda/moe.cu, pg_cuda_moe_ffn; contract in kernels/cuda/cuda_ops.h,
// semantics in docs/moe.md) against a host reference in fp64 that mirrors
// kernels/cpu/moe.c (the CPU backend is not linked into standalone GPU tests,
// so the reference is re-implemented here).
//
//   - routing: the device's choices read back with pg_cuda_moe_routing
//     against softmax(xn . router^T) and top-k in fp64 over xn computed as
//     the device does (pg_cuda_add_rmsnorm's f32 arithmetic, rounded to
//     bf16). Every row must select the same experts in the same order (best
//     first), weights within tol relative (1e-3; 5e-3 with a norm, where a
//     bf16 rounding of xn may land otherwise: see run_case); a row whose
//     choices differ only where fp64 p's are within tol of each other (a
//     near tie) is counted and reported, never a failure. The all-zero
//     router (every p equal) excuses nothing: sel 0..k-1 (ties to the lower
//     id), weights 1/E or, renormalised, 1/k.
//   - output: fp64 over the DEVICE's routing (its sel and f32 weights), so a
//     near tie cannot make the comparison loose, with the contract's
//     intermediate bf16 roundings mirrored (h = bf16(silu(g) * u), y_e =
//     bf16(down . h)). Bound 1e-2 of max |ref| of each row: out is rounded
//     to bf16 once (half an ulp, 2^-9 = 2e-3 of |out|); h and y_e land on
//     the other side of a rounding boundary than fp64 puts them only where
//     the f32 sum is within its error (~1e-6) of the boundary, and such a
//     flip costs one ulp of w_e * y_e (2^-8 = 3.9e-3 of |y_e|, times w_e <=
//     1); the f32 sums and weights add ~1e-6. So a correct kernel stays near
//     2-4e-3; a wrong expert, weight or missing term is off by O(1).
//     Large m checks at most 48 rows spread over the batch (first and last
//     included), every column of them.
//   - cases: Mixtral's 8 experts top 2 (renormalised) and Qwen3-MoE's 128
//     top 8 with and without renormalisation; m 1 to 4096; shapes (hidden,
//     ffn) (256, 128), (512, 96), (2048, 768) (Qwen3-30B-A3B) and (4096,
//     14336) (Mixtral-8x7B, m <= 64); norm NULL and not; accumulate off
//     (out poisoned with NaN: every entry must be written), on (out holds
//     another residual, which the result must NOT include: out = x + sum),
//     and in place (out == x); expert parallelism (every odd expert's
//     pointers NULL: its terms left out, routing unchanged); the zero
//     router; top_k == n_experts, top 1 and top 16.
//   - refusals: top_k > n_experts, top_k > 16, n_experts > 512, hidden or
//     ffn not a multiple of 8, too small or no workspace return PG_EINVAL
//     and write nothing; m = 0 returns 0 and writes nothing.
//   - FP8 experts (pg_cuda_moe_ffn_fp8; cases named "moe fp8 ..."): each
//     expert's bf16 weights quantized per output row as --quantization fp8
//     does (pg_quantize_row_fp8: scale = max|row| / 448, e4m3 rounded to
//     nearest even, saturating), the e4m3 bytes and the f32 scales uploaded
//     as separate allocations per expert. The same routing check, and the
//     same output reference and bound over the DEQUANTIZED weights (q *
//     scale in fp64: the contract's result; e4m3 is exact in bf16 and the
//     scale costs one f32 rounding, ~1e-7). Mixtral 8/top 2 and Qwen3-MoE
//     128/top 8 on (256, 128) and (2048, 768), m 1 to 2048, norm, in place
//     with accumulate; expert parallelism (odd experts' pointers and scales
//     NULL); refusals: a held expert whose gate_up or down scale array is
//     NULL returns PG_EINVAL and writes nothing (with the bf16 limits).
//
// Usage: build/gpu/test_cuda_moe [-k FILTER]   exit 0 pass, 1 fail, 77 no GPU.
#include <string.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tests/gpu/gpu_util.h"
extern "C" {
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dtype.h"
}

static const char *g_filter = "";
static int g_fail = 0, g_ok = 0;
static bool selected(const char *name) { return strstr(name, g_filter) != nullptr; }

static void report_case(const char *name, bool ok, double err, double bound, const char *detail) {
    printf("%-4s %-66s max_rel %.3e (bound %.0e)%s%s\n", ok ? "ok" : "FAIL", name, err, bound, *detail ? "; " : "",
           detail);
    fflush(stdout);
    ok ? g_ok++ : g_fail++;
}

static void report_bool(const char *name, bool ok, const char *detail) {
    printf("%-4s %-66s %s\n", ok ? "ok" : "FAIL", name, detail);
    fflush(stdout);
    ok ? g_ok++ : g_fail++;
}

// rows x cols values N(0, sd^2) as bf16, each row from its own seed: the same
// values for any thread count, and generated on every core (the largest
// shape holds 1.4 G weights).
static void fill_normal(uint16_t *p, int64_t rows, int64_t cols, double sd, uint64_t seed) {
    parallel_for(rows, [&](int64_t i) {
        Rng rr(seed * 0x100000001b3ull + (uint64_t)i);
        for (int64_t j = 0; j < cols; j++) p[i * cols + j] = f2bf((float)(rr.normal() * sd));
    });
}

static double dot_bf(const double *a, const uint16_t *w, int n) {
    double s = 0;
    for (int j = 0; j < n; j++) s += a[j] * (double)bf2f(w[j]);
    return s;
}

// e4m3 byte -> its value (pg_fp8_e4m3_to_f32), filled in main.
static double g_e4m3[256];

static double dot_q(const double *a, const uint8_t *q, int n) {
    double s = 0;
    for (int j = 0; j < n; j++) s += a[j] * g_e4m3[q[j]];
    return s;
}

// An FP8 weight from bf16 [rows][cols]: e4m3 bytes and a scale per row, as
// the loader's --quantization fp8 makes them from a bf16 checkpoint.
static void quantize_fp8(const std::vector<uint16_t> &w, int64_t rows, int64_t cols, std::vector<uint8_t> &q,
                         std::vector<float> &scales) {
    q.resize((size_t)(rows * cols));
    scales.resize((size_t)rows);
    parallel_for(rows, [&](int64_t i) {
        std::vector<float> f((size_t)cols);
        for (int64_t j = 0; j < cols; j++) f[(size_t)j] = bf2f(w[(size_t)(i * cols + j)]);
        pg_quantize_row_fp8(f.data(), cols, &q[(size_t)(i * cols)], &scales[(size_t)i]);
    });
}

// The weights of one shape: host copies (the reference reads them) and one
// device allocation per expert matrix, as the runner holds a checkpoint's
// tensors. Scaled as an init that keeps activations near unit size:
// N(0, 1/fan_in), norm weight 1 + N(0, 0.1^2). fp8: the experts quantized
// (quantize_fp8), dgu/ddn the e4m3 bytes, dsgu/dsdn their scales; the host
// keeps q and the scales (not the bf16 values) and the reference reads q *
// scale.
struct Experts {
    int hidden, ffn, E;
    bool fp8;
    std::vector<uint16_t> router, norm;
    std::vector<std::vector<uint16_t>> gu, dn; // bf16 [E][2 ffn][hidden], [E][hidden][ffn]
    std::vector<std::vector<uint8_t>> qgu, qdn; // fp8: the same as e4m3
    std::vector<std::vector<float>> sgu, sdn;   // fp8: their row scales [E][2 ffn], [E][hidden]
    std::vector<std::unique_ptr<DBuf>> dgu, ddn, dsgu, dsdn;
    DBuf drouter, dnorm, dzero; // dzero: an all-zero router
    Experts(int hidden_, int ffn_, int E_, uint64_t seed, bool fp8_)
        : hidden(hidden_), ffn(ffn_), E(E_), fp8(fp8_) {
        router.resize((size_t)E * hidden);
        norm.resize((size_t)hidden);
        fill_normal(router.data(), E, hidden, 1.0 / sqrt((double)hidden), seed);
        Rng r(seed + 1);
        for (auto &v : norm) v = f2bf((float)(1.0 + 0.1 * r.normal()));
        drouter.up(router);
        dnorm.up(norm);
        dzero.up(std::vector<uint16_t>(router.size(), 0));
        gu.resize((size_t)E);
        dn.resize((size_t)E);
        for (int e = 0; e < E; e++) {
            gu[e].resize((size_t)2 * ffn * hidden);
            dn[e].resize((size_t)hidden * ffn);
            fill_normal(gu[e].data(), 2 * ffn, hidden, 1.0 / sqrt((double)hidden), seed + 1000 + 2 * (uint64_t)e);
            fill_normal(dn[e].data(), hidden, ffn, 1.0 / sqrt((double)ffn), seed + 1001 + 2 * (uint64_t)e);
            dgu.emplace_back(new DBuf());
            ddn.emplace_back(new DBuf());
            if (!fp8) {
                dgu.back()->up(gu[e]);
                ddn.back()->up(dn[e]);
                continue;
            }
            qgu.emplace_back();
            qdn.emplace_back();
            sgu.emplace_back();
            sdn.emplace_back();
            quantize_fp8(gu[e], 2 * ffn, hidden, qgu.back(), sgu.back());
            quantize_fp8(dn[e], hidden, ffn, qdn.back(), sdn.back());
            std::vector<uint16_t>().swap(gu[e]);
            std::vector<uint16_t>().swap(dn[e]);
            dsgu.emplace_back(new DBuf());
            dsdn.emplace_back(new DBuf());
            dgu.back()->up(qgu.back());
            ddn.back()->up(qdn.back());
            dsgu.back()->up(sgu.back());
            dsdn.back()->up(sdn.back());
        }
    }
    // Row r of expert e's gate_up (down) . a in fp64 over the weights the
    // kernel is given: bf16, or e4m3 times the row's scale.
    double gu_dot(int e, int64_t r, const double *a) const {
        return fp8 ? sgu[(size_t)e][(size_t)r] * dot_q(a, &qgu[(size_t)e][(size_t)(r * hidden)], hidden)
                   : dot_bf(a, &gu[(size_t)e][(size_t)(r * hidden)], hidden);
    }
    double dn_dot(int e, int64_t r, const double *a) const {
        return fp8 ? sdn[(size_t)e][(size_t)r] * dot_q(a, &qdn[(size_t)e][(size_t)(r * ffn)], ffn)
                   : dot_bf(a, &dn[(size_t)e][(size_t)(r * ffn)], ffn);
    }
};

// Where the result goes: a fresh output (poisoned), a separate output with
// accumulate (must add x, not its old contents), or x itself.
enum Mode { OUT_NEW, OUT_ACC, IN_PLACE_ACC, IN_PLACE };
static const char *mode_tag[] = {"", " accumulate", " in-place accumulate", " in-place"};

struct Case {
    int64_t m;
    int k;
    bool renorm, norm, ep, zero; // ep: odd experts held elsewhere; zero: all-zero router
    Mode mode;
};

static std::string case_name(int hidden, int ffn, int E, bool fp8, const Case &c) {
    char s[200];
    snprintf(s, sizeof s, "moe%s %dx%d E=%d k=%d%s m=%lld%s%s%s%s", fp8 ? " fp8" : "", hidden, ffn, E, c.k,
             c.renorm ? " renorm" : "", (long long)c.m, c.norm ? " norm" : "", mode_tag[c.mode],
             c.ep ? " ep" : "", c.zero ? " zero-router" : "");
    return s;
}

static void run_case(Experts &X, const Case &c, Rng &r) {
    const std::string nm = case_name(X.hidden, X.ffn, X.E, X.fp8, c);
    if (!selected(nm.c_str())) return;
    const int H = X.hidden, F = X.ffn, E = X.E, k = c.k;
    const int64_t m = c.m;
    const float eps = 1e-6f;
    const bool acc = c.mode == OUT_ACC || c.mode == IN_PLACE_ACC, inplace = c.mode >= IN_PLACE_ACC;

    // x: with a norm, rows of very different size (RMSNorm must even them
    // out); without one, unit rows (x itself is routed).
    std::vector<uint16_t> x((size_t)m * H), o0((size_t)m * H, 0x7fc0); // NaN: every entry must be written
    for (int64_t i = 0; i < m; i++) {
        const double mag = !c.norm ? 1.0 : i % 5 == 1 ? 0.05 : i % 3 == 2 ? 8.0 : 1.0;
        for (int d = 0; d < H; d++) x[(size_t)i * H + d] = f2bf((float)(r.normal() * mag));
    }
    if (c.mode == OUT_ACC)
        for (auto &v : o0) v = f2bf((float)r.normal());
    DBuf dx, dout;
    dx.up(x);
    if (!inplace) dout.up(o0);
    void *outp = inplace ? dx.p : dout.p;
    std::vector<const void *> gu((size_t)E), dn((size_t)E);
    std::vector<const float *> gus((size_t)E), dns((size_t)E); // fp8: NULL with the expert
    for (int e = 0; e < E; e++) {
        const bool held = !(c.ep && e % 2);
        gu[(size_t)e] = held ? X.dgu[(size_t)e]->p : nullptr;
        dn[(size_t)e] = held ? X.ddn[(size_t)e]->p : nullptr;
        gus[(size_t)e] = held && X.fp8 ? X.dsgu[(size_t)e]->as<float>() : nullptr;
        dns[(size_t)e] = held && X.fp8 ? X.dsdn[(size_t)e]->as<float>() : nullptr;
    }
    const size_t wsn = pg_cuda_moe_workspace_size(m, H, F, E, k);
    DBuf ws(wsn);
    const void *normp = c.norm ? X.dnorm.p : nullptr, *routerp = c.zero ? X.dzero.p : X.drouter.p;
    int rc = X.fp8 ? pg_cuda_moe_ffn_fp8(outp, dx.p, m, H, F, normp, eps, routerp, gu.data(), gus.data(), dn.data(),
                                         dns.data(), E, k, c.renorm, acc, ws.p, wsn, nullptr)
                   : pg_cuda_moe_ffn(outp, dx.p, m, H, F, normp, eps, routerp, gu.data(), dn.data(), E, k, c.renorm,
                                     acc, ws.p, wsn, nullptr);
    if (rc != 0) {
        report_bool(nm.c_str(), false, pg_err_msg());
        return;
    }
    CK(cudaDeviceSynchronize());
    std::vector<int32_t> gsel((size_t)m * k, -1);
    std::vector<float> gw((size_t)m * k);
    PK(pg_cuda_moe_routing(gsel.data(), gw.data(), ws.p, m, H, F, E, k, nullptr));
    std::vector<uint16_t> go((size_t)m * H), gx((size_t)m * H);
    (inplace ? dx : dout).down(go);
    bool x_ok = true;
    if (!inplace) {
        dx.down(gx);
        x_ok = gx == x;
    }

    // xn as the device computes it (pg_cuda_add_rmsnorm's arithmetic: f32
    // mean of squares, 1 / sqrtf, x * rs * w in f32, rounded to bf16); the
    // sum of squares in fp64 (the device's f32 tree sum is within ~1e-7).
    std::vector<double> xn(x.size());
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *xr = &x[(size_t)i * H];
        double ss = 0;
        for (int d = 0; d < H; d++) ss += (double)bf2f(xr[d]) * bf2f(xr[d]);
        const float rs = 1.0f / sqrtf((float)ss / (float)H + eps);
        for (int d = 0; d < H; d++)
            xn[(size_t)i * H + d] = c.norm ? bf2f(f2bf(bf2f(xr[d]) * rs * bf2f(X.norm[(size_t)d]))) : bf2f(xr[d]);
    }

    // Routing, every row. tol: xn is bf16, and where the device's f32 sum of
    // squares puts an element of xn on the other side of a rounding boundary
    // than the host's does (a few rows in a hundred), that element moves by
    // one ulp (2^-7 of it), a logit by up to ~1e-3 and p_e by as much
    // relatively; without a norm xn is x exactly and only the f32 sums
    // differ (~1e-6). A row the device routes otherwise than the fp64 top-k
    // is a near tie when each of its choices has an fp64 p within tol of the
    // fp64 choice at that place (neighbours closer than tol swapped, or the
    // k-th and the (k+1)-th): counted, not failed. Weights are compared with
    // the fp64 p of the device's own choice (renormalised over its set).
    // The zero router ties everything exactly: nothing is excused there.
    const double tol = c.zero ? 1e-6 : c.norm ? 5e-3 : 1e-3;
    std::vector<int> verdict((size_t)m); // 0 same, 1 near tie otherwise ordered, 2 different
    std::vector<char> host_tie((size_t)m);
    std::vector<std::vector<int>> horder((size_t)m);
    std::vector<std::vector<double>> hw((size_t)m);
    const int kk = std::min(k + 1, E); // the top k and the first one left out
    parallel_for(m, [&](int64_t i) {
        std::vector<double> p((size_t)E);
        double mx = -1e300, sum = 0;
        for (int e = 0; e < E; e++) {
            p[(size_t)e] = c.zero ? 0.0 : dot_bf(&xn[(size_t)i * H], &X.router[(size_t)e * H], H);
            mx = std::max(mx, p[(size_t)e]);
        }
        for (auto &v : p) sum += v = exp(v - mx);
        for (auto &v : p) v /= sum;
        std::vector<int> ord((size_t)E);
        for (int e = 0; e < E; e++) ord[(size_t)e] = e;
        std::partial_sort(ord.begin(), ord.begin() + kk, ord.end(), [&](int a, int b) {
            return p[(size_t)a] > p[(size_t)b] || (p[(size_t)a] == p[(size_t)b] && a < b);
        });
        bool tie = false;
        for (int t = 0; t + 1 < kk; t++) tie |= p[(size_t)ord[t]] - p[(size_t)ord[t + 1]] < tol * p[(size_t)ord[t]];
        const int32_t *gs = &gsel[(size_t)i * k];
        const float *gwr = &gw[(size_t)i * k];
        bool same = true, near = !c.zero, valid = true;
        double s_host = 0, s_dev = 0;
        for (int t = 0; t < k; t++) {
            valid &= gs[t] >= 0 && gs[t] < E && std::count(gs, gs + k, gs[t]) == 1;
            s_host += p[(size_t)ord[t]];
        }
        for (int t = 0; t < k && valid; t++) s_dev += p[(size_t)gs[t]];
        for (int t = 0; t < k && valid; t++) {
            const double ph = p[(size_t)ord[t]], pd = p[(size_t)gs[t]];
            const double wd = pd / (c.renorm ? s_dev : 1.0); // fp64 weight of the device's choice
            const bool w_ok = fabs((double)gwr[t] - wd) <= tol * wd;
            same &= gs[t] == ord[(size_t)t] && w_ok;
            near &= fabs(pd - ph) <= tol * ph && w_ok;
        }
        verdict[(size_t)i] = !valid ? 2 : same ? 0 : near ? 1 : 2;
        host_tie[(size_t)i] = tie;
        ord.resize((size_t)k);
        horder[(size_t)i] = ord;
        hw[(size_t)i].resize((size_t)k);
        for (int t = 0; t < k; t++) hw[(size_t)i][(size_t)t] = p[(size_t)ord[t]] / (c.renorm ? s_host : 1.0);
    });
    int64_t n_tie = 0, n_other = 0, n_bad = 0, first_bad = -1;
    for (int64_t i = 0; i < m; i++) {
        n_tie += host_tie[(size_t)i];
        n_other += verdict[(size_t)i] == 1;
        if (verdict[(size_t)i] == 2 && n_bad++ == 0) first_bad = i;
    }

    // The rows checked: all when m <= 48, else 48 spread over the batch.
    std::vector<int64_t> rows;
    const int64_t nr = std::min<int64_t>(m, 48);
    for (int64_t a = 0; a < nr; a++) rows.push_back(nr == 1 ? 0 : a * (m - 1) / (nr - 1));
    // The (checked row, expert) pairs of the device's routing on this rank,
    // sorted by expert so that neighbouring tasks share a weight row.
    struct Pair {
        int a, e;
        double w;
    };
    std::vector<Pair> pairs;
    bool sel_range_ok = true;
    for (int a = 0; a < (int)rows.size(); a++)
        for (int t = 0; t < k; t++) {
            const int e = gsel[(size_t)rows[(size_t)a] * k + t];
            if (e < 0 || e >= E) {
                sel_range_ok = false;
                continue;
            }
            if (!(c.ep && e % 2)) pairs.push_back({a, e, (double)gw[(size_t)rows[(size_t)a] * k + t]});
        }
    std::stable_sort(pairs.begin(), pairs.end(), [](const Pair &p, const Pair &q) { return p.e < q.e; });
    const int64_t np = (int64_t)pairs.size();
    std::vector<double> h((size_t)(np * F)), y((size_t)(np * H));
    parallel_for(np * F, [&](int64_t t) {
        const int64_t j = t / np, q = t % np;
        const Pair &P = pairs[(size_t)q];
        const double *xr = &xn[(size_t)rows[(size_t)P.a] * H];
        const double g = X.gu_dot(P.e, j, xr), u = X.gu_dot(P.e, F + j, xr);
        h[(size_t)(q * F + j)] = bf2f(f2bf((float)(g / (1.0 + exp(-g)) * u)));
    });
    parallel_for(np * H, [&](int64_t t) {
        const int64_t d = t / np, q = t % np;
        const Pair &P = pairs[(size_t)q];
        y[(size_t)(q * H + d)] = bf2f(f2bf((float)X.dn_dot(P.e, d, &h[(size_t)(q * F)])));
    });
    std::vector<double> sum(rows.size() * (size_t)H, 0.0);
    for (int64_t q = 0; q < np; q++)
        for (int d = 0; d < H; d++)
            sum[(size_t)pairs[(size_t)q].a * H + d] += pairs[(size_t)q].w * y[(size_t)(q * H + d)];

    // Worst over the checked rows of max |out - ref| / max |ref| (absolute for
    // an all-zero row: an EP row whose experts are all elsewhere). Also
    // against out's old contents + sum: names the likely bug when accumulate
    // adds into out instead of x.
    auto worst = [&](bool old_out) {
        double worst_err = 0;
        for (size_t a = 0; a < rows.size(); a++) {
            double d = 0, mx = 0;
            for (int j = 0; j < H; j++) {
                const size_t o = (size_t)rows[a] * H + j;
                const double base = !acc ? 0.0 : old_out ? bf2f(o0[o]) : bf2f(x[o]);
                const double ref = base + sum[a * H + j], out = bf2f(go[o]);
                if (!(out == out)) return (double)NAN;
                d = std::max(d, fabs(out - ref));
                mx = std::max(mx, fabs(ref));
            }
            worst_err = std::max(worst_err, mx > 0 ? d / mx : d);
        }
        return worst_err;
    };
    const double err = worst(false), bound = 1e-2;
    std::string detail;
    char buf[256];
    snprintf(buf, sizeof buf, "routing: %lld of %lld rows equal; %lld near ties, %lld of them ordered otherwise",
             (long long)(m - n_other - n_bad), (long long)m, (long long)n_tie, (long long)n_other);
    detail += buf;
    if (n_bad) {
        const int64_t i = first_bad;
        snprintf(buf, sizeof buf, "; %lld DIFFER (row %lld, device/fp64:", (long long)n_bad, (long long)i);
        detail += buf;
        for (int t = 0; t < std::min(k, 4); t++) {
            snprintf(buf, sizeof buf, " e%d %.5f/e%d %.5f", gsel[(size_t)i * k + t], gw[(size_t)i * k + t],
                     horder[(size_t)i][(size_t)t], hw[(size_t)i][(size_t)t]);
            detail += buf;
        }
        detail += k > 4 ? " ...)" : ")";
    }
    if (!sel_range_ok) detail += ", an expert id OUT OF RANGE";
    if (!x_ok) detail += ", x WAS MODIFIED";
    const bool out_ok = err == err && err <= bound;
    if (!out_ok && c.mode == OUT_ACC && worst(true) <= bound) detail += ", out = old out + sum (wants x + sum)";
    report_case(nm.c_str(), out_ok && n_bad == 0 && sel_range_ok && x_ok, err, bound, detail.c_str());
}

// What the launcher must reject (PG_EINVAL) writing nothing, and m = 0
// (nothing to do: 0, nothing written).
static void test_refusals() {
    const char *name = "moe refusals";
    if (!selected(name)) return;
    const int H = 64, F = 32, m = 4;
    DBuf o((size_t)m * 128 * 2), x((size_t)m * 128 * 2), nw(128 * 2), router(600 * 128 * 2), gw(2 * 64 * 128 * 2),
        dw(128 * 64 * 2);
    CK(cudaMemset(o.p, 0x5a, o.n));
    CK(cudaMemset(x.p, 0, x.n));
    CK(cudaMemset(nw.p, 0, nw.n));
    CK(cudaMemset(router.p, 0, router.n));
    CK(cudaMemset(gw.p, 0, gw.n));
    CK(cudaMemset(dw.p, 0, dw.n));
    // 513 experts' pointers, all to one pair of matrices (large enough for
    // every shape below); nothing here may be read anyway.
    std::vector<const void *> gu(600, gw.p), dn(600, dw.p);
    const size_t need = pg_cuda_moe_workspace_size(m, H, F, 8, 2);
    const size_t big = std::max<size_t>(need, (size_t)64 << 20);
    DBuf ws(big);
#define MOE(mm, h, f, E, k, wsp, wsn) \
    pg_cuda_moe_ffn(o.p, x.p, mm, h, f, nw.p, 1e-6f, router.p, gu.data(), dn.data(), E, k, 1, 0, wsp, wsn, nullptr)
    const Refusal c[] = {
        {"top_k 9 of 8", MOE(m, H, F, 8, 9, ws.p, big), PG_EINVAL},
        {"top_k 17 of 32", MOE(m, H, F, 32, 17, ws.p, big), PG_EINVAL},
        {"513 experts", MOE(m, H, F, PG_CUDA_MOE_MAX_EXPERTS + 1, 2, ws.p, big), PG_EINVAL},
        {"hidden 60", MOE(m, 60, F, 8, 2, ws.p, big), PG_EINVAL},
        {"ffn 36", MOE(m, H, 36, 8, 2, ws.p, big), PG_EINVAL},
        {"workspace 1 byte short", MOE(m, H, F, 8, 2, ws.p, need - 1), PG_EINVAL},
        {"no workspace", MOE(m, H, F, 8, 2, nullptr, 0), PG_EINVAL},
        {"m 0", MOE(0, H, F, 8, 2, ws.p, big), 0},
    };
#undef MOE
    std::string detail;
    const bool ok = refusals_ok(o, c, detail);
    report_bool(name, ok, detail.c_str());
}

// pg_cuda_moe_ffn_fp8's own refusal: a held expert (its weight pointer
// set) without its scales; with some of the bf16 limits, which it shares.
static void test_refusals_fp8() {
    const char *name = "moe fp8 refusals";
    if (!selected(name)) return;
    const int H = 64, F = 32, m = 4, E = 8;
    DBuf o((size_t)m * H * 2), x((size_t)m * H * 2), nw(H * 2), router(E * H * 2), gw(2 * F * H), dw(H * F),
        gs(2 * F * 4), ds(H * 4);
    CK(cudaMemset(o.p, 0x5a, o.n));
    for (DBuf *b : {&x, &nw, &router, &gw, &dw, &gs, &ds}) CK(cudaMemset(b->p, 0, b->n));
    std::vector<const void *> gu(E, gw.p), dn(E, dw.p);
    const std::vector<const float *> gsc(E, gs.as<float>()), dsc(E, ds.as<float>());
    std::vector<const float *> gs3 = gsc, ds5 = dsc, none(E, nullptr);
    gs3[3] = nullptr;
    ds5[5] = nullptr;
    const size_t need = pg_cuda_moe_workspace_size(m, H, F, E, 2);
    DBuf ws(need);
#define MOE(mm, k, g, d, wsp, wsn)                                                                                  \
    pg_cuda_moe_ffn_fp8(o.p, x.p, mm, H, F, nw.p, 1e-6f, router.p, gu.data(), g.data(), dn.data(), d.data(), E, k, 1, \
                        1, wsp, wsn, nullptr)
    const Refusal c[] = {
        {"expert 3 held, gate_up scales NULL", MOE(m, 2, gs3, dsc, ws.p, need), PG_EINVAL},
        {"expert 5 held, down scales NULL", MOE(m, 2, gsc, ds5, ws.p, need), PG_EINVAL},
        {"every expert held, no scales", MOE(m, 2, none, none, ws.p, need), PG_EINVAL},
        {"top_k 9 of 8", MOE(m, 9, gsc, dsc, ws.p, need), PG_EINVAL},
        {"workspace 1 byte short", MOE(m, 2, gsc, dsc, ws.p, need - 1), PG_EINVAL},
        {"m 0", MOE(0, 2, gsc, dsc, ws.p, need), 0},
    };
#undef MOE
    std::string detail;
    const bool ok = refusals_ok(o, c, detail);
    report_bool(name, ok, detail.c_str());
}

// Whether any case of `cs` is selected: a shape's weights (up to 2.8 GB)
// are made only when needed.
static bool any_selected(int hidden, int ffn, int E, bool fp8, const std::vector<Case> &cs) {
    for (auto &c : cs)
        if (selected(case_name(hidden, ffn, E, fp8, c).c_str())) return true;
    return false;
}

static void run_shape(int hidden, int ffn, int E, uint64_t seed, const std::vector<Case> &cs, Rng &r,
                      bool fp8 = false) {
    if (!any_selected(hidden, ffn, E, fp8, cs)) return;
    Experts X(hidden, ffn, E, seed, fp8);
    for (auto &c : cs) run_case(X, c, r);
}

// The batch sizes, cycling the norm and the output mode over them so that
// every combination meets several m.
static void sweep(std::vector<Case> &cs, std::initializer_list<int64_t> ms, int k, bool renorm, int phase) {
    int i = phase;
    for (int64_t m : ms) {
        cs.push_back({m, k, renorm, i % 2 == 0, false, false, (Mode)(i % 3)});
        i++;
    }
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-k") && i + 1 < argc) g_filter = argv[++i];
    if (!gpu_announce()) return 77;
    for (int v = 0; v < 256; v++) g_e4m3[v] = pg_fp8_e4m3_to_f32((uint8_t)v);
    Rng r(20261231);
    test_refusals();
    test_refusals_fp8();
    {   // Mixtral's routing (8 experts, top 2, renormalised) on small experts.
        std::vector<Case> cs;
        sweep(cs, {1, 2, 5, 8, 9, 64, 333, 1024, 4096}, 2, true, 0);
        cs.push_back({64, 2, true, true, true, false, OUT_ACC});   // expert parallel
        cs.push_back({9, 2, true, false, true, false, IN_PLACE_ACC});
        cs.push_back({5, 2, true, true, false, true, OUT_NEW});    // zero router
        cs.push_back({333, 2, true, true, false, false, IN_PLACE}); // in place, nothing added
        cs.push_back({9, 8, true, true, false, false, OUT_NEW});   // top_k == n_experts
        run_shape(256, 128, 8, 11, cs, r);
    }
    {   // Qwen3-MoE's routing (128 experts, top 8) on narrow experts.
        std::vector<Case> cs;
        sweep(cs, {1, 2, 5, 8, 9, 64, 333, 1024, 4096}, 8, true, 0);
        sweep(cs, {1, 2, 5, 8, 9, 64, 333, 1024, 4096}, 8, false, 1);
        cs.push_back({64, 8, true, true, true, false, OUT_ACC});
        cs.push_back({333, 8, false, false, true, false, IN_PLACE_ACC});
        cs.push_back({9, 8, false, true, false, true, OUT_NEW});
        cs.push_back({9, 8, true, false, false, true, OUT_ACC});
        cs.push_back({64, 16, true, true, false, false, OUT_NEW});  // the largest top_k
        cs.push_back({33, 1, false, true, false, false, OUT_ACC});  // top 1
        run_shape(512, 96, 128, 12, cs, r);
    }
    {   // Qwen3-30B-A3B: hidden 2048, 128 experts of 768, top 8 (norm_topk_prob).
        std::vector<Case> cs;
        sweep(cs, {1, 2, 5, 8, 9, 64, 333, 1024, 4096}, 8, true, 1);
        sweep(cs, {1, 8, 9, 64, 1024}, 8, false, 0);
        cs.push_back({64, 8, true, true, true, false, IN_PLACE_ACC});
        cs.push_back({5, 8, true, true, false, true, OUT_ACC});
        run_shape(2048, 768, 128, 13, cs, r);
    }
    {   // Mixtral-8x7B's experts: hidden 4096, 8 experts of 14336, top 2 (host time: m <= 64).
        std::vector<Case> cs;
        sweep(cs, {1, 2, 5, 8, 9, 64}, 2, true, 2);
        cs.push_back({9, 2, true, true, true, false, IN_PLACE_ACC});
        run_shape(4096, 14336, 8, 14, cs, r);
    }
    // FP8 experts: Mixtral's routing (8, top 2) and Qwen3-MoE's (128, top 8)
    // on small experts and on Qwen3-30B-A3B's, norm, in place with
    // accumulate (the model's step); expert parallelism on the latter.
    for (int s = 0; s < 2; s++)
        for (int E : {8, 128}) {
            const int hidden = s ? 2048 : 256, ffn = s ? 768 : 128, k = E == 8 ? 2 : 8;
            std::vector<Case> cs;
            for (int64_t m : {1, 8, 64, 333, 2048}) cs.push_back({m, k, true, true, false, false, IN_PLACE_ACC});
            if (s == 1 && E == 128) cs.push_back({64, k, true, true, true, false, OUT_ACC});
            run_shape(hidden, ffn, E, 15 + 2 * (uint64_t)s + (E == 128), cs, r, true);
        }
    printf("%d passed, %d failed\n", g_ok, g_fail);
    return g_fail ? 1 : 0;
}
