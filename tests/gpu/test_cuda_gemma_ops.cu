// tests/gpu/test_cuda_gemma_ops.cu - Gemma's element-wise ops
// (kernels/cuda/gemma_ops.cu: pg_cuda_scale, pg_cuda_rmsnorm_add,
// pg_cuda_gelu_mul, pg_cuda_softcap; contracts in kernels/cuda/cuda_ops.h)
// against host references that round to bf16 where the contracts do
// (kernels/cpu/gemma_ops.c's formulas, re-implemented here: the CPU backend
// is not linked into standalone GPU tests).
//
// Bounds, per value, in bf16 units in the last place (ulp):
//   - scale: exact. One f32 multiply by bf16(s) and one rounding, on the
//     device as on the host.
//   - rmsnorm_add: x must equal bf16(x + n) EXACTLY, n being the device's
//     normalised row read back from pg_cuda_add_rmsnorm(n, y, NULL, w) (the
//     contract: the same norm bit for bit); n itself within 1 ulp of an fp64
//     reference: the device's f32 sum of squares (another order) and its
//     two f32 products move the value by a few f32 ulps, 2^-16 of a bf16
//     ulp each, which can carry it across one bf16 rounding boundary, never
//     two.
//   - gelu_mul, softcap: within 1 ulp of the same f32 formula on the host.
//     The device's tanhf (2 ulp at most) and glibc's may differ in the last
//     f32 bits; that moves the f32 result by far less than a bf16 ulp, so
//     the rounding may flip once. For gelu, 1 + tanh(inner) loses relative
//     precision as g goes negative (at g = -3 it is 2.4e-3, so 2 f32 ulps of
//     tanh are 5e-5 of it, still under a bf16 ulp); g is kept in [-3, 3)
//     so that the bound holds (deeper in the tail the output is tiny and
//     its relative error is tanhf's business, not the kernel's).
//   Every case reports how many values were exact and how many 1 ulp off.
// Also checked: columns past n (rows ld apart) and memory past the output
// untouched, y not written, every output written (poisoned first), the
// 16-byte and the scalar paths (odd sizes, unaligned pointers), two
// rmsnorm_adds in a row with PDL on and off, and refusals (null pointers,
// bad sizes, cap <= 0 or NaN, y == x) that return PG_EINVAL and write
// nothing; m == 0 returns 0 and writes nothing.
//
// Usage: build/gpu/test_cuda_gemma_ops [-k FILTER]   exit 0 pass, 1 fail, 77 no GPU.
#include <string.h>

#include <string>
#include <vector>

#include "tests/gpu/gpu_util.h"
#include "kernels/cuda/cuda_common.cuh" // pg_cuda_pdl_set

static const char *g_filter = "";
static int g_fail = 0, g_ok = 0;
static bool selected(const char *name) { return strstr(name, g_filter) != nullptr; }
static const uint16_t POISON = 0xFFFF; // a bf16 NaN

static void report_bool(const char *name, bool ok, const char *detail) {
    printf("%-4s %-58s %s\n", ok ? "ok" : "FAIL", name, detail);
    fflush(stdout);
    ok ? g_ok++ : g_fail++;
}

// Values compared in bf16 ulps: bit patterns mapped to a monotone integer
// line (+0 and -0 both 0); a NaN is never within any bound.
static int bf_ord(uint16_t h) { return (h & 0x8000) ? -(int)(h & 0x7fff) : (int)h; }

struct Cmp {
    int64_t n = 0, off1 = 0, bad = 0;
    std::string first; // the first value out of bounds
    void add(uint16_t got, uint16_t want, int max_ulp, int64_t i, int64_t j) {
        n++;
        const bool nan = bf2f(got) != bf2f(got) || bf2f(want) != bf2f(want);
        const int d = abs(bf_ord(got) - bf_ord(want));
        if (!nan && d == 0) return;
        if (!nan && d <= max_ulp) {
            off1++;
            return;
        }
        if (bad++ == 0) {
            char b[160];
            snprintf(b, sizeof b, "[%lld][%lld] %.6g (0x%04x), want %.6g (0x%04x)", (long long)i, (long long)j,
                     bf2f(got), got, bf2f(want), want);
            first = b;
        }
    }
    // "N exact, N 1 ulp off (bound)" or the first miss.
    std::string str(const char *bound) const {
        char b[256];
        snprintf(b, sizeof b, "%lld exact, %lld 1 ulp off (%s)", (long long)(n - off1 - bad), (long long)off1, bound);
        std::string s = b;
        if (bad) s += "; " + std::to_string(bad) + " beyond, first " + first;
        return s;
    }
};

// Each case's data from its own seed (the same with or without -k).
static Rng case_rng(int op, int64_t a, int64_t b, int64_t c) {
    return Rng(((uint64_t)op << 56) ^ ((uint64_t)a << 36) ^ ((uint64_t)b << 12) ^ (uint64_t)c);
}

// --- host references (f32 as kernels/cpu/gemma_ops.c; g++ without -march emits no fma) -------

static float gelu_tanh_ref(float x) { // pg_cpu_gelu_tanh
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    const float inner = beta * (x + kappa * (x * x * x));
    return 0.5f * x * (1.0f + tanhf(inner));
}

// --- scale and softcap: in place over [m][ld], n columns ------------------------------------

// off: x starts `off` elements into its allocation (odd: the scalar path).
static void test_map(bool softcap, int64_t m, int64_t n, int64_t ld, float a, int64_t off) {
    char name[160];
    snprintf(name, sizeof name, "%s m %lld n %lld ld %lld %s %g%s", softcap ? "softcap" : "scale", (long long)m,
             (long long)n, (long long)ld, softcap ? "cap" : "s", (double)a, off ? " unaligned" : "");
    if (!selected(name)) return;
    Rng r = case_rng(softcap ? 1 : 2, m, n, ld + off);
    std::vector<uint16_t> h((size_t)(m * ld + off));
    fill_bf16(h, r, softcap ? 3.0f * a : 2.0f); // softcap: the saturated region too
    DBuf d;
    d.up(h);
    uint16_t *x = d.as<uint16_t>() + off;
    PK(softcap ? pg_cuda_softcap(x, ld, m, n, a, nullptr) : pg_cuda_scale(x, ld, m, n, a, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> o(h.size());
    d.down(o);
    const float sb = bf2f(f2bf(a)), inv = 1.0f / a;
    Cmp c;
    bool untouched = true;
    for (int64_t e = 0; e < off; e++) untouched &= o[e] == h[e];
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ld; j++) {
            const size_t k = (size_t)(off + i * ld + j);
            if (j >= n) {
                untouched &= o[k] == h[k];
                continue;
            }
            const float v = bf2f(h[k]);
            c.add(o[k], f2bf(softcap ? a * tanhf(v * inv) : v * sb), softcap ? 1 : 0, i, j);
        }
    std::string detail = c.str(softcap ? "bound 1 ulp: tanhf" : "bound: exact");
    if (!untouched) detail += "; written outside the m x n values";
    report_bool(name, c.bad == 0 && untouched, detail.c_str());
}

// --- rmsnorm_add ----------------------------------------------------------------------------

// yoff: y starts that many elements into its allocation (odd: both this and
// pg_cuda_add_rmsnorm take their scalar path). twice: two launches in a row
// on the stream (x += n twice; the second reads the first's x), PDL on or
// off.
static void test_rmsnorm_add(int64_t m, int64_t dim, int64_t yoff, int twice_pdl = -1) {
    char name[160];
    snprintf(name, sizeof name, "rmsnorm_add m %lld dim %lld%s%s", (long long)m, (long long)dim,
             yoff ? " y unaligned" : "", twice_pdl < 0 ? "" : twice_pdl ? " twice, PDL on" : " twice, PDL off");
    if (!selected(name)) return;
    Rng r = case_rng(3, m, dim, yoff * 2 + twice_pdl + 1);
    const int64_t guard = 64, md = m * dim;
    const float eps = 1e-6f;
    std::vector<uint16_t> hx((size_t)(md + guard)), hy((size_t)(md + yoff)), hw((size_t)dim);
    fill_bf16(hx, r, 4.0f);
    for (int64_t i = 0; i < m; i++) { // each row its own scale, as the residual stream's rows vary
        const double sd = 0.02 * (1 + i % 9) * (i % 3 ? 1.0 : 50.0);
        for (int64_t e = 0; e < dim; e++) hy[(size_t)(yoff + i * dim + e)] = f2bf((float)(r.normal() * sd));
    }
    for (auto &w : hw) w = f2bf(1.0f + 0.5f * r.sym()); // Gemma's weight is 1 + w
    DBuf dx, dy, dw, dn((size_t)md * 2);
    dx.up(hx), dy.up(hy), dw.up(hw);
    const uint16_t *y = dy.as<uint16_t>() + yoff;
    PK(pg_cuda_add_rmsnorm(dn.p, (void *)y, nullptr, dw.p, m, dim, eps, nullptr)); // n: x not written
    if (twice_pdl >= 0) pg_cuda_pdl_set(twice_pdl);
    PK(pg_cuda_rmsnorm_add(dx.p, y, dw.p, m, dim, eps, nullptr));
    if (twice_pdl >= 0) PK(pg_cuda_rmsnorm_add(dx.p, y, dw.p, m, dim, eps, nullptr));
    CK(cudaDeviceSynchronize());
    pg_cuda_pdl_set(-1);
    std::vector<uint16_t> ox(hx.size()), oy(hy.size()), on((size_t)md);
    dx.down(ox), dy.down(oy), dn.down(on);
    Cmp cn, cx;
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *yr = &hy[(size_t)(yoff + i * dim)];
        double ss = 0;
        for (int64_t e = 0; e < dim; e++) ss += (double)bf2f(yr[e]) * bf2f(yr[e]);
        const double rs = 1.0 / sqrt(ss / (double)dim + eps);
        for (int64_t e = 0; e < dim; e++) {
            const size_t k = (size_t)(i * dim + e);
            cn.add(on[k], f2bf((float)(bf2f(yr[e]) * rs * bf2f(hw[(size_t)e]))), 1, i, e);
            uint16_t want = f2bf(bf2f(hx[k]) + bf2f(on[k]));
            if (twice_pdl >= 0) want = f2bf(bf2f(want) + bf2f(on[k]));
            cx.add(ox[k], want, 0, i, e);
        }
    }
    const bool untouched = std::equal(ox.begin() + md, ox.end(), hx.begin() + md) && oy == hy;
    std::string detail = "x " + cx.str("exact, from add_rmsnorm's n") + "; n " + cn.str("1 ulp of fp64");
    if (!untouched) detail += "; y or memory past x written";
    report_bool(name, cx.bad == 0 && cn.bad == 0 && untouched, detail.c_str());
}

// --- gelu_mul -------------------------------------------------------------------------------

// off: gate_up starts that many elements into its allocation (odd: the
// scalar path).
static void test_gelu_mul(int64_t m, int64_t ffn, int64_t off) {
    char name[160];
    snprintf(name, sizeof name, "gelu_mul m %lld ffn %lld%s", (long long)m, (long long)ffn, off ? " unaligned" : "");
    if (!selected(name)) return;
    Rng r = case_rng(4, m, ffn, off);
    const int64_t guard = 64, mf = m * ffn;
    std::vector<uint16_t> hgu((size_t)(2 * mf + off)), ho((size_t)(mf + guard), POISON);
    fill_bf16(hgu, r, 3.0f); // g and u in [-3, 3): see the bound above
    DBuf dgu, dout;
    dgu.up(hgu), dout.up(ho);
    PK(pg_cuda_gelu_mul(dout.p, dgu.as<uint16_t>() + off, m, ffn, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> o(ho.size());
    dout.down(o);
    Cmp c;
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *g = &hgu[(size_t)(off + i * 2 * ffn)], *u = g + ffn;
        for (int64_t j = 0; j < ffn; j++)
            c.add(o[(size_t)(i * ffn + j)], f2bf(gelu_tanh_ref(bf2f(g[j])) * bf2f(u[j])), 1, i, j);
    }
    const bool untouched = std::equal(o.begin() + mf, o.end(), ho.begin() + mf);
    std::string detail = c.str("bound 1 ulp: tanhf");
    if (!untouched) detail += "; written past out";
    report_bool(name, c.bad == 0 && untouched, detail.c_str());
}

// --- refusals -------------------------------------------------------------------------------

static void test_refusals() {
    const char *name = "refusals: null, sizes, cap <= 0 or NaN, y == x; m 0";
    if (!selected(name)) return;
    DBuf o(8192), in(8192);
    CK(cudaMemset(o.p, 0x5a, o.n));
    CK(cudaMemset(in.p, 0x3f, in.n)); // y, w, gate_up: bf16 0.75
    void *x = o.p, *v = in.p;
    const Refusal c[] = {
        {"scale x NULL", pg_cuda_scale(nullptr, 64, 2, 64, 2.0f, nullptr), PG_EINVAL},
        {"scale ld < n", pg_cuda_scale(x, 63, 2, 64, 2.0f, nullptr), PG_EINVAL},
        {"scale n 0", pg_cuda_scale(x, 64, 2, 0, 2.0f, nullptr), PG_EINVAL},
        {"scale m -1", pg_cuda_scale(x, 64, -1, 64, 2.0f, nullptr), PG_EINVAL},
        {"scale m 0", pg_cuda_scale(x, 64, 0, 64, 2.0f, nullptr), 0},
        {"softcap x NULL", pg_cuda_softcap(nullptr, 64, 2, 64, 30.0f, nullptr), PG_EINVAL},
        {"softcap cap 0", pg_cuda_softcap(x, 64, 2, 64, 0.0f, nullptr), PG_EINVAL},
        {"softcap cap -30", pg_cuda_softcap(x, 64, 2, 64, -30.0f, nullptr), PG_EINVAL},
        {"softcap cap NaN", pg_cuda_softcap(x, 64, 2, 64, NAN, nullptr), PG_EINVAL},
        {"softcap ld < n", pg_cuda_softcap(x, 13, 2, 64, 30.0f, nullptr), PG_EINVAL},
        {"softcap m 0", pg_cuda_softcap(x, 64, 0, 64, 30.0f, nullptr), 0},
        {"rmsnorm_add x NULL", pg_cuda_rmsnorm_add(nullptr, v, v, 2, 64, 1e-6f, nullptr), PG_EINVAL},
        {"rmsnorm_add y NULL", pg_cuda_rmsnorm_add(x, nullptr, v, 2, 64, 1e-6f, nullptr), PG_EINVAL},
        {"rmsnorm_add w NULL", pg_cuda_rmsnorm_add(x, v, nullptr, 2, 64, 1e-6f, nullptr), PG_EINVAL},
        {"rmsnorm_add y == x", pg_cuda_rmsnorm_add(x, x, v, 2, 64, 1e-6f, nullptr), PG_EINVAL},
        {"rmsnorm_add dim 0", pg_cuda_rmsnorm_add(x, v, v, 2, 0, 1e-6f, nullptr), PG_EINVAL},
        {"rmsnorm_add m -1", pg_cuda_rmsnorm_add(x, v, v, -1, 64, 1e-6f, nullptr), PG_EINVAL},
        {"rmsnorm_add m 0", pg_cuda_rmsnorm_add(x, v, v, 0, 64, 1e-6f, nullptr), 0},
        {"gelu_mul out NULL", pg_cuda_gelu_mul(nullptr, v, 2, 64, nullptr), PG_EINVAL},
        {"gelu_mul gate_up NULL", pg_cuda_gelu_mul(x, nullptr, 2, 64, nullptr), PG_EINVAL},
        {"gelu_mul ffn 0", pg_cuda_gelu_mul(x, v, 2, 0, nullptr), PG_EINVAL},
        {"gelu_mul m -1", pg_cuda_gelu_mul(x, v, -1, 64, nullptr), PG_EINVAL},
        {"gelu_mul m 0", pg_cuda_gelu_mul(x, v, 0, 64, nullptr), 0},
    };
    std::string detail;
    const bool ok = refusals_ok(o, c, detail);
    report_bool(name, ok, detail.c_str());
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-k") && i + 1 < argc) g_filter = argv[++i];
    if (!gpu_announce()) return 77;
    test_refusals();
    const int64_t ms[] = {1, 2, 7, 64, 300};
    // Gemma 3's hidden sizes (270M, 1B, 4B, 27B) and FFN widths (1B, 4B, 27B).
    const int64_t dims[] = {640, 1152, 2560, 5376}, ffns[] = {2048, 6912, 21504};
    // scale by sqrt(hidden) and soft-cap at Gemma 2's 30 and 50 and a small
    // cap: n odd or not a multiple of 8, ld == n, ld past n by a vector and
    // by an odd count (the scalar path).
    const int64_t ns[] = {1, 13, 640, 4097};
    const float caps[] = {30.0f, 50.0f, 0.3f};
    int k = 0;
    for (int64_t m : ms)
        for (int64_t n : ns)
            for (int64_t pad : {0, 8, 3}) {
                test_map(false, m, n, n + pad, sqrtf((float)dims[k % 4]), 0);
                test_map(true, m, n, n + pad, caps[k % 3], 0);
                k++;
            }
    test_map(false, 7, 640, 640, sqrtf(2560.0f), 1);
    test_map(true, 7, 640, 648, 30.0f, 1);
    for (int64_t m : ms)
        for (int64_t dim : dims) test_rmsnorm_add(m, dim, 0);
    for (int64_t m : {1, 7, 300}) {
        test_rmsnorm_add(m, 645, 0); // dim not a multiple of 8: the scalar path
        test_rmsnorm_add(m, 2560, 1);
    }
    test_rmsnorm_add(64, 2560, 0, 1);
    test_rmsnorm_add(64, 2560, 0, 0);
    for (int64_t m : ms)
        for (int64_t ffn : ffns) test_gelu_mul(m, ffn, 0);
    for (int64_t m : {1, 7, 64}) {
        test_gelu_mul(m, 13, 0); // ffn not a multiple of 8
        test_gelu_mul(m, 6912, 1);
    }
    printf("%d passed, %d failed\n", g_ok, g_fail);
    return g_fail ? 1 : 0;
}
