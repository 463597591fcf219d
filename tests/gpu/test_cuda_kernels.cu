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

// --- fp8 e4m3 on the host ----------------------------------------------------------------

// e4m3 (bias 7, no infinities, 0x7F/0xFF NaN, max 448) -> float, exact.
static float e4m3_to_f(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return (b & 0x80) ? -v : v;
}
// float -> e4m3, round to nearest even, saturating to +-448 (NaN -> 0x7F),
// as the device's cvt.rn.satfinite.e4m3x2.f32.
static uint8_t f_to_e4m3(float f) {
    if (f != f) return 0x7F;
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    const float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7E;
    if (a < 0.015625f) return sign | (uint8_t)nearbyintf(a * 512.0f); // subnormals (step 2^-9); 8 = 2^-6
    int e;
    frexpf(a, &e); // a = 1.x * 2^(e-1)
    int E = e - 1, mq = (int)nearbyintf(ldexpf(a, 3 - E)); // 8..16
    if (mq == 16) {
        mq = 8;
        E++;
    }
    int code = ((E + 7) << 3) | (mq - 8);
    return sign | (uint8_t)(code > 0x7E ? 0x7E : code);
}
// Signed order of an e4m3 code (-0 and +0 both 0): neighbours differ by 1.
static int e4m3_order(uint8_t b) { return (b & 0x80) ? -(int)(b & 0x7F) : (int)(b & 0x7F); }

// --- paged KV fixture ----------------------------------------------------------------

// Sequences with `ctx[s]` tokens in a paged cache whose blocks are a random
// permutation; block-table padding holds an id far out of range, so any
// read past a sequence's blocks would fault or poison the result.
// f8: the device cache holds e4m3 bytes, and k / v (what the references
// read) hold the same values as bf16 (exact: e4m3 is a subset of bf16).
struct Paged {
    int n_seqs, n_kv, hd, bs, n_blocks, bt_stride;
    bool f8;
    std::vector<int> ctx;
    std::vector<int32_t> bt;
    std::vector<uint16_t> k, v; // [n_blocks][bs][n_kv][hd]
    DBuf dk, dv, dbt;
    // fp8 layer scales (pg_kv_shape.scales), set by scale(): the cache's
    // codes then stand for ks[h] * k and vs[h] * v.
    std::vector<float> sc; // [2][n_kv]
    DBuf dsc;
    // A sliding window and a soft-cap (pg_kv_shape.window, .softcap).
    int window = 0;
    float softcap = 0.0f;

    Paged(const std::vector<int> &ctx_, int n_kv_, int hd_, int bs_, Rng &r, bool f8_ = false)
        : n_seqs((int)ctx_.size()), n_kv(n_kv_), hd(hd_), bs(bs_), f8(f8_), ctx(ctx_) {
        int need = 0, maxb = 0;
        for (int c : ctx) {
            int b = (c + bs - 1) / bs;
            need += b;
            maxb = std::max(maxb, b);
        }
        n_blocks = need + 5;
        bt_stride = maxb + 3;
        std::vector<int32_t> perm(n_blocks);
        std::iota(perm.begin(), perm.end(), 0);
        for (int i = n_blocks - 1; i > 0; i--) std::swap(perm[i], perm[r.below(i + 1)]);
        bt.assign((size_t)n_seqs * bt_stride, 0x3fffffff);
        int at = 0;
        for (int s = 0; s < n_seqs; s++)
            for (int b = 0; b < (ctx[s] + bs - 1) / bs; b++) bt[(size_t)s * bt_stride + b] = perm[at++];
        size_t n = (size_t)n_blocks * bs * n_kv * hd;
        k.resize(n);
        v.resize(n);
        fill_bf16(k, r, 1.0f);
        fill_bf16(v, r, 1.0f);
        if (f8) {
            // Uniform [-1, 1): ~1.6% land on e4m3 subnormals (< 2^-6); a few
            // larger values (x 40, up to the top binades) as well.
            std::vector<uint8_t> k8(n), v8(n);
            for (size_t i = 0; i < n; i++) {
                float kf = bf2f(k[i]) * (i % 997 == 5 ? 40.0f : 1.0f), vf = bf2f(v[i]) * (i % 991 == 7 ? 40.0f : 1.0f);
                k8[i] = f_to_e4m3(kf);
                v8[i] = f_to_e4m3(vf);
                k[i] = f2bf(e4m3_to_f(k8[i]));
                v[i] = f2bf(e4m3_to_f(v8[i]));
            }
            dk.up(k8);
            dv.up(v8);
        } else {
            dk.up(k);
            dv.up(v);
        }
        dbt.up(bt);
    }
    pg_kv_shape shape() const {
        pg_kv_shape s{n_blocks, bs, n_kv, hd, f8 ? PG_KV_FP8_E4M3 : PG_KV_BF16};
        s.scales = sc.empty() ? nullptr : dsc.as<float>();
        s.window = window;
        s.softcap = softcap;
        return s;
    }
    // Sequence s's blocks wholly before key first_key given back, as the
    // pool does for a sliding-window layer: their entries point far out of
    // range, so a kernel that read one would fault. Call upload_bt() after.
    void drop_before(int s, int first_key) {
        for (int b = 0; b < first_key / bs; b++) bt[(size_t)s * bt_stride + b] = 0x3fffffff;
    }
    void upload_bt() { dbt.up(bt); }
    // Random K and V scales per KV head over three decades (0.01 to 10).
    void scale(Rng &r) {
        sc.resize(2 * (size_t)n_kv);
        for (auto &x : sc) x = (float)pow(10.0, -2.0 + 3.0 * (double)r.below(1000) / 1000.0);
        dsc.up(sc);
    }
    double kscale(int h) const { return sc.empty() ? 1.0 : (double)sc[(size_t)h]; }
    double vscale(int h) const { return sc.empty() ? 1.0 : (double)sc[(size_t)(n_kv + h)]; }
    const uint16_t *krow(int s, int t, int h) const {
        size_t slot = (size_t)bt[(size_t)s * bt_stride + t / bs] * bs + t % bs;
        return &k[(slot * n_kv + h) * hd];
    }
    const uint16_t *vrow(int s, int t, int h) const {
        size_t slot = (size_t)bt[(size_t)s * bt_stride + t / bs] * bs + t % bs;
        return &v[(slot * n_kv + h) * hd];
    }
};

// fp64 causal attention of one query row over keys [0, n_keys), or in a
// sliding-window layer (pc.window) over its last pc.window keys; scores
// soft-capped when pc.softcap > 0.
static void ref_attend(const Paged &pc, int s, int kvh, const uint16_t *q, int n_keys, double scale, double *out) {
    const int hd = pc.hd;
    const int first = pc.window > 0 ? std::max(0, n_keys - pc.window) : 0;
    std::vector<double> sc(n_keys);
    double mx = -1e300;
    for (int t = first; t < n_keys; t++) {
        const uint16_t *kr = pc.krow(s, t, kvh);
        double d = 0;
        for (int e = 0; e < hd; e++) d += (double)bf2f(q[e]) * bf2f(kr[e]);
        sc[t] = d * scale * pc.kscale(kvh);
        if (pc.softcap > 0) sc[t] = pc.softcap * tanh(sc[t] / pc.softcap);
        mx = std::max(mx, sc[t]);
    }
    double l = 0;
    for (int e = 0; e < hd; e++) out[e] = 0;
    for (int t = first; t < n_keys; t++) {
        double p = exp(sc[t] - mx);
        l += p;
        const uint16_t *vr = pc.vrow(s, t, kvh);
        for (int e = 0; e < hd; e++) out[e] += p * bf2f(vr[e]);
    }
    for (int e = 0; e < hd; e++) out[e] *= pc.vscale(kvh) / l;
}

// --- decode attention ----------------------------------------------------------------

struct DecodeCase {
    const char *tag;
    std::vector<int> ctx;
    int n_heads, n_kv, hd, bs;
    float qscale;
};

// pg_cuda_paged_decode_attention_v's contract through a numbered version:
// 2 and 4 from the library, 1 and 3 from bench/cuda/.
static int decode_v(int version, void *out, const void *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                    pg_kv_shape kv, const int32_t *block_tables, int32_t bt_stride, const int32_t *seq_lens,
                    int32_t n_seqs, int32_t n_heads, float scale, int32_t max_seq_len, void *workspace,
                    size_t workspace_bytes) {
    if (version == 1)
        return bench_decode_v1(out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride, seq_lens, n_seqs,
                               n_heads, scale, nullptr);
    if (version == 3)
        return bench_decode_v3(out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride, seq_lens, n_seqs,
                               n_heads, scale, max_seq_len, workspace, workspace_bytes, nullptr);
    return pg_cuda_paged_decode_attention_v(version, out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride,
                                            seq_lens, n_seqs, n_heads, scale, max_seq_len, workspace,
                                            workspace_bytes, nullptr);
}

// window > 0 / cap > 0: a sliding-window or soft-capped layer, through the
// library's versions only (bench/cuda/'s v1 and v3 take neither).
static void test_decode(const DecodeCase &c, Rng &r, bool f8 = false, bool scaled = false, int window = 0,
                        float cap = 0.0f) {
    char name[160], wtag[48] = "";
    if (window > 0 || cap > 0) snprintf(wtag, sizeof wtag, " window=%d cap=%g", window, (double)cap);
    snprintf(name, sizeof name, "decode%s %s b=%zu h=%d/%d d=%d bs=%d%s", scaled ? " fp8 scaled" : f8 ? " fp8" : "",
             c.tag, c.ctx.size(), c.n_heads, c.n_kv, c.hd, c.bs, wtag);
    if (!selected(name)) return;
    Paged pc(c.ctx, c.n_kv, c.hd, c.bs, r, f8);
    if (scaled) pc.scale(r);
    pc.window = window;
    pc.softcap = cap;
    if (window > 0) {
        for (int s = 0; s < pc.n_seqs; s++) pc.drop_before(s, std::max(0, c.ctx[s] - window));
        pc.upload_bt();
    }
    const bool lib_only = window > 0 || cap > 0;
    const int n = pc.n_seqs, H = c.n_heads, hd = c.hd, G = H / c.n_kv;
    // q as part of a fused QKV row (stride > n_heads * hd) on odd cases.
    const int64_t q_stride = (n % 2) ? (int64_t)(H + 2 * c.n_kv) * hd : (int64_t)H * hd;
    std::vector<uint16_t> q((size_t)n * q_stride);
    fill_bf16(q, r, c.qscale);
    DBuf dq, dlen, dout((size_t)n * H * hd * 2);
    dq.up(q);
    std::vector<int32_t> lens(c.ctx.begin(), c.ctx.end());
    dlen.up(lens);
    const int max_len = *std::max_element(c.ctx.begin(), c.ctx.end());
    const double scale = 1.0 / sqrt((double)hd);

    std::vector<double> ref((size_t)n * H * hd);
    parallel_for((int64_t)n * H, [&](int64_t i) {
        int s = (int)(i / H), h = (int)(i % H);
        ref_attend(pc, s, h / G, &q[(size_t)s * q_stride + (size_t)h * hd], c.ctx[s], scale, &ref[(size_t)i * hd]);
    });

    size_t ws_bytes = bench_decode_v3_workspace_size(n, H, c.n_kv, hd, max_len); // v3's and the library's need
    DBuf ws(ws_bytes);
    std::vector<uint16_t> out((size_t)n * H * hd);
    std::vector<double> o(out.size());
    auto check = [&](const char *what) {
        CK(cudaDeviceSynchronize());
        dout.down(out);
        for (size_t i = 0; i < out.size(); i++) o[i] = bf2f(out[i]);
        char nm[200];
        snprintf(nm, sizeof nm, "%s %s", name, what);
        report(nm, rel_err(o, ref), 1e-2);
    };
    // One key: out = its V row exactly (p = 1, l = 1), so every decoded
    // e4m3 value, subnormals included, must come back bit for bit.
    auto check_exact = [&](const char *ver) {
        int n_sub = 0;
        bool exact = true;
        for (size_t i = 0; i < out.size(); i++) {
            exact &= out[i] == f2bf((float)ref[i]);
            n_sub += ref[i] != 0.0 && fabs(ref[i]) < 0.015625;
        }
        char nm[200], detail[96];
        snprintf(nm, sizeof nm, "%s %s single key exact", name, ver);
        snprintf(detail, sizeof detail, "every value bit for bit (%d e4m3 subnormals)", n_sub);
        report_bool(nm, exact && n_sub > 0, exact ? detail : "a decoded value differs");
    };
    // v4 (keys on the MMA M side) takes GQA groups <= 8 on sm_89+ and says
    // PG_EUNSUPP elsewhere.
    int cc_major = 0, cc_minor = 0, dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
    const bool v4_ok = G <= 8 && cc_major * 10 + cc_minor >= 89;
    for (int version = 1; version <= 4; version++) {
        if (lib_only && (version == 1 || version == 3)) continue;
        if ((f8 && (version == 1 || version == 3)) || (version == 4 && !v4_ok)) {
            int rc = decode_v(version, dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(), pc.dbt.as<int32_t>(),
                              pc.bt_stride, dlen.as<int32_t>(), n, H, (float)scale, max_len, ws.p, ws_bytes);
            char nm[200];
            snprintf(nm, sizeof nm, "%s v%d refuses %s", name, version, version == 4 ? "the shape" : "fp8");
            report_bool(nm, rc == PG_EUNSUPP, rc == PG_EUNSUPP ? "PG_EUNSUPP" : "wrong return code");
            continue;
        }
        CK(cudaMemset(dout.p, 0xFF, dout.n));
        PK(decode_v(version, dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(), pc.dbt.as<int32_t>(), pc.bt_stride,
                    dlen.as<int32_t>(), n, H, (float)scale, max_len, ws.p, ws_bytes));
        const char *ver = version == 1 ? "v1" : version == 2 ? "v2 split" : version == 3 ? "v3 persistent" : "v4 kn split";
        check(ver);
        if (f8 && !scaled && max_len == 1) check_exact(version == 2 ? "v2" : "v4");
    }
    if (v4_ok) { // the v4 split counters were left at zero too
        CK(cudaMemset(dout.p, 0xFF, dout.n));
        PK(pg_cuda_paged_decode_attention_v(4, dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(),
                                            pc.dbt.as<int32_t>(), pc.bt_stride, dlen.as<int32_t>(), n, H,
                                            (float)scale, max_len, ws.p, ws_bytes, nullptr));
        check("v4 split, second launch");
    }
    // The same launch again: the split counters were left at zero.
    CK(cudaMemset(dout.p, 0xFF, dout.n));
    PK(pg_cuda_paged_decode_attention(dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(), pc.dbt.as<int32_t>(),
                                      pc.bt_stride, dlen.as<int32_t>(), n, H, (float)scale, max_len, ws.p, ws_bytes,
                                      nullptr));
    check("default split, second launch");
    // A batch with empty sequences (length 0 -> zero rows) through v4, v3 and v2.
    if (n >= 3) {
        std::vector<int32_t> z = lens;
        z[1] = 0;
        DBuf dz;
        dz.up(z);
        for (int version = 4; version >= 2; version--) {
            if ((version == 3 && (f8 || lib_only)) || (version == 4 && !v4_ok)) continue;
            CK(cudaMemset(dout.p, 0xFF, dout.n));
            PK(decode_v(version, dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(), pc.dbt.as<int32_t>(),
                        pc.bt_stride, dz.as<int32_t>(), n, H, (float)scale, max_len, ws.p, ws_bytes));
            CK(cudaDeviceSynchronize());
            dout.down(out);
            std::vector<double> rz = ref, oz(out.size());
            for (size_t i = 0; i < out.size(); i++) oz[i] = bf2f(out[i]);
            for (int i = 0; i < H * hd; i++) rz[(size_t)H * hd + i] = 0.0;
            char nm[200];
            snprintf(nm, sizeof nm, "%s v%d with an empty sequence", name, version);
            report(nm, rel_err(oz, rz), 1e-2);
        }
    }
    // No workspace: the same kernel without splits.
    CK(cudaMemset(dout.p, 0xFF, dout.n));
    PK(pg_cuda_paged_decode_attention(dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(), pc.dbt.as<int32_t>(),
                                      pc.bt_stride, dlen.as<int32_t>(), n, H, (float)scale, max_len, nullptr, 0,
                                      nullptr));
    check("default, no workspace (no split)");
    // The prefill kernel with one query per sequence computes the same.
    std::vector<int32_t> cu(n + 1), sp(n);
    for (int s = 0; s < n; s++) {
        cu[s] = s;
        sp[s] = c.ctx[s] - 1;
    }
    cu[n] = n;
    DBuf dcu, dsp;
    dcu.up(cu);
    dsp.up(sp);
    CK(cudaMemset(dout.p, 0xFF, dout.n));
    PK(pg_cuda_paged_prefill_attention(dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(), pc.dbt.as<int32_t>(),
                                       pc.bt_stride, dcu.as<int32_t>(), dsp.as<int32_t>(), n, H, (float)scale, 1,
                                       nullptr));
    check("prefill-path");
}

static std::vector<int> rand_lens(Rng &r, int n, int lo, int hi) {
    std::vector<int> v(n);
    for (auto &x : v) x = lo + r.below(hi - lo + 1);
    return v;
}

static void decode_tests(Rng &r) {
    std::vector<DecodeCase> cases = {
        {"len1", {1}, 8, 8, 128, 16, 1.0f},
        {"edges", {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129}, 32, 8, 128, 16, 2.0f},
        {"edges", {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129}, 32, 8, 128, 32, 2.0f},
        {"gqa1", rand_lens(r, 5, 1, 700), 8, 8, 128, 16, 3.0f},
        {"gqa1", rand_lens(r, 5, 1, 700), 4, 4, 64, 32, 3.0f},
        {"gqa3", rand_lens(r, 7, 1, 500), 9, 3, 64, 16, 3.0f}, // SmolLM2-135M's heads
        {"gqa4", rand_lens(r, 16, 1, 5000), 32, 8, 128, 16, 2.0f},
        {"gqa4", rand_lens(r, 3, 100, 3000), 32, 8, 64, 32, 2.0f},
        {"gqa8", rand_lens(r, 9, 1, 2000), 64, 8, 128, 16, 2.0f},
        {"gqa8", rand_lens(r, 9, 1, 2000), 16, 2, 64, 32, 2.0f},
        {"gqa16", rand_lens(r, 4, 1, 900), 16, 1, 128, 16, 2.0f},
        {"gqa32", rand_lens(r, 3, 1, 900), 32, 1, 128, 32, 2.0f},
        {"batch64", rand_lens(r, 64, 1, 600), 8, 2, 128, 16, 2.0f},
        {"batch256", rand_lens(r, 256, 1, 300), 8, 2, 64, 16, 2.0f},
        {"batch256", rand_lens(r, 256, 1, 200), 8, 2, 128, 32, 2.0f},
        {"long", {20011, 33001}, 32, 8, 128, 16, 4.0f},
        {"long", {4096, 4095, 9999}, 16, 4, 64, 32, 4.0f},
        {"long", {16384, 1, 7001}, 64, 8, 128, 32, 4.0f},        // v4 split at G = 8
        {"w5", rand_lens(r, 16, 3000, 4096), 32, 8, 128, 16, 2.0f}, // Llama-3-8B shape, batch 16
        {"sharp", rand_lens(r, 4, 1000, 3000), 8, 2, 128, 16, 12.0f},
    };
    for (auto &c : cases) test_decode(c, r);
    for (auto &c : cases) test_decode(c, r, true); // the fp8 e4m3 cache
    for (auto &c : cases) test_decode(c, r, true, true); // with a K and V scale per layer and KV head
    // v1 and v3 left the library for bench/cuda/: its dispatcher refuses them.
    const char *name = "decode v1/v3 not in the library";
    if (selected(name)) {
        Paged pc({17, 40}, 2, 128, 16, r);
        DBuf dq((size_t)2 * 8 * 128 * 2), dout(dq.n), dlen;
        dlen.up(std::vector<int32_t>{17, 40});
        int rc[2];
        for (int i = 0; i < 2; i++)
            rc[i] = pg_cuda_paged_decode_attention_v(1 + 2 * i, dout.p, dq.p, 8 * 128, pc.dk.p, pc.dv.p, pc.shape(),
                                                     pc.dbt.as<int32_t>(), pc.bt_stride, dlen.as<int32_t>(), 2, 8,
                                                     0.088f, 40, nullptr, 0, nullptr);
        char detail[96];
        snprintf(detail, sizeof detail, "v1 rc %d, v3 rc %d (PG_EUNSUPP %d)", rc[0], rc[1], PG_EUNSUPP);
        report_bool(name, rc[0] == PG_EUNSUPP && rc[1] == PG_EUNSUPP, detail);
    }
}

// --- prefill attention ---------------------------------------------------------------

struct PrefillCase {
    const char *tag;
    std::vector<int> n_q, start;
    int n_heads, n_kv, hd, bs;
};

static void test_prefill(const PrefillCase &c, Rng &r, bool f8 = false, bool scaled = false, int window = 0,
                         float cap = 0.0f) {
    const int n = (int)c.n_q.size(), H = c.n_heads, hd = c.hd, G = H / c.n_kv;
    char name[160], wtag[48] = "";
    if (window > 0 || cap > 0) snprintf(wtag, sizeof wtag, " window=%d cap=%g", window, (double)cap);
    snprintf(name, sizeof name, "prefill%s %s seqs=%d h=%d/%d d=%d bs=%d%s", scaled ? " fp8 scaled" : f8 ? " fp8" : "",
             c.tag, n, H, c.n_kv, hd, c.bs, wtag);
    if (!selected(name)) return;
    std::vector<int> ctx(n);
    std::vector<int32_t> cu(n + 1, 0), sp(n);
    int max_q = 0;
    for (int s = 0; s < n; s++) {
        ctx[s] = c.start[s] + c.n_q[s];
        cu[s + 1] = cu[s] + c.n_q[s];
        sp[s] = c.start[s];
        max_q = std::max(max_q, c.n_q[s]);
    }
    Paged pc(ctx, c.n_kv, hd, c.bs, r, f8);
    if (scaled) pc.scale(r);
    pc.window = window;
    pc.softcap = cap;
    if (window > 0) { // the chunk's first query sees keys from start - window + 1
        for (int s = 0; s < n; s++) pc.drop_before(s, std::max(0, c.start[s] - window + 1));
        pc.upload_bt();
    }
    const int T = cu[n];
    const int64_t q_stride = (n % 2) ? (int64_t)(H + 2 * c.n_kv) * hd : (int64_t)H * hd;
    std::vector<uint16_t> q((size_t)T * q_stride);
    fill_bf16(q, r, 3.0f);
    DBuf dq, dcu, dsp, dout((size_t)T * H * hd * 2);
    dq.up(q);
    dcu.up(cu);
    dsp.up(sp);
    const double scale = 1.0 / sqrt((double)hd);
    std::vector<double> ref((size_t)T * H * hd);
    std::vector<int> row_seq(T);
    for (int s = 0; s < n; s++)
        for (int i = cu[s]; i < cu[s + 1]; i++) row_seq[i] = s;
    parallel_for((int64_t)T * H, [&](int64_t i) {
        int t = (int)(i / H), h = (int)(i % H), s = row_seq[t];
        int pos = sp[s] + (t - cu[s]);
        ref_attend(pc, s, h / G, &q[(size_t)t * q_stride + (size_t)h * hd], pos + 1, scale, &ref[(size_t)i * hd]);
    });
    std::vector<uint16_t> out((size_t)T * H * hd);
    std::vector<double> o(out.size());
    for (int version = 1; version <= 2; version++) {
        CK(cudaMemset(dout.p, 0xFF, dout.n));
        PK(pg_cuda_paged_prefill_attention_v(version, dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(),
                                             pc.dbt.as<int32_t>(), pc.bt_stride, dcu.as<int32_t>(),
                                             dsp.as<int32_t>(), n, H, (float)scale, max_q, nullptr));
        CK(cudaDeviceSynchronize());
        dout.down(out);
        for (size_t i = 0; i < out.size(); i++) o[i] = bf2f(out[i]);
        char nm[200];
        snprintf(nm, sizeof nm, "%s v%d", name, version);
        report(nm, rel_err(o, ref), 1e-2);
    }
}

static void prefill_tests(Rng &r) {
    std::vector<PrefillCase> cases = {
        {"single", {1}, {0}, 8, 8, 128, 16},
        {"chunk0", {17}, {0}, 8, 2, 128, 16},
        {"mixed", {1, 17, 64, 100, 1, 65, 300}, {0, 0, 0, 37, 500, 15, 1000}, 32, 8, 128, 16},
        {"mixed", {1, 17, 64, 100, 1, 65, 300}, {0, 0, 0, 37, 500, 15, 1000}, 32, 8, 128, 32},
        {"mixed", {3, 129, 64, 250}, {5, 0, 64, 900}, 16, 4, 64, 16},
        {"gqa1", {70, 33, 1}, {0, 31, 7}, 4, 4, 128, 32},
        {"gqa1", {70, 33, 1}, {0, 31, 7}, 4, 4, 64, 16},
        {"gqa3", {50, 200, 9}, {0, 100, 3}, 9, 3, 64, 16},
        {"gqa8", {40, 130, 2}, {16, 0, 1000}, 16, 2, 128, 16},
        {"gqa8", {40, 130, 2}, {16, 0, 1000}, 64, 8, 64, 32},
        {"gqa16", {20, 9}, {0, 300}, 16, 1, 128, 16},
        {"long", {512, 256}, {0, 3000}, 8, 2, 128, 16},
        {"decode-mix", {1, 1, 1, 128, 1}, {4000, 17, 64, 512, 1}, 32, 8, 128, 16},
    };
    for (auto &c : cases) test_prefill(c, r);
    for (auto &c : cases) test_prefill(c, r, true); // the fp8 e4m3 cache
    for (auto &c : cases) test_prefill(c, r, true, true); // with layer scales
}

// Sliding windows (Mistral, Gemma 2/3) and soft-capped scores (Gemma 2) in
// every library kernel: decode v2, v4 (splits from the window's first tile,
// lengths around tile and block edges, windows shorter than a tile and
// longer than the context) and prefill v1, v2 (chunks that start past the
// window, rows whose windows start in different tiles); the blocks before
// each window point out of range, as the pool leaves them.
static void window_tests(Rng &r) {
    struct W { int window; float cap; };
    const std::vector<DecodeCase> dec = {
        {"edges", {1, 15, 16, 17, 63, 64, 65, 127, 129, 200}, 32, 8, 128, 16, 2.0f},
        {"gqa4", rand_lens(r, 9, 1, 3000), 32, 8, 128, 16, 2.0f},
        {"gqa2", rand_lens(r, 5, 1, 2000), 8, 4, 64, 32, 3.0f},
        {"gqa16", rand_lens(r, 4, 1, 900), 16, 1, 128, 16, 2.0f}, // v2 (group > 8)
        {"long", {20011, 33001, 5000}, 32, 16, 128, 16, 4.0f},    // Gemma 3 27B's heads, splits
    };
    const std::vector<W> dw = {{1, 0}, {16, 0}, {64, 0}, {100, 0}, {1024, 0}, {4096, 0}, {0, 5.0f}, {512, 2.0f}};
    for (int f8 = 0; f8 < 2; f8++)
        for (auto &c : dec)
            for (auto &w : dw) test_decode(c, r, f8 != 0, false, w.window, w.cap);
    const std::vector<PrefillCase> pre = {
        {"chunk0", {300}, {0}, 8, 2, 128, 16},
        {"mixed", {1, 17, 64, 100, 1, 65, 300}, {0, 0, 0, 37, 500, 15, 1000}, 32, 8, 128, 16},
        {"mixed", {3, 129, 64, 250}, {5, 0, 64, 900}, 16, 4, 64, 32},
        {"gqa2", {600, 40}, {0, 2000}, 32, 16, 128, 16},
        {"decode-mix", {1, 1, 1, 128, 1}, {4000, 17, 64, 512, 1}, 32, 8, 128, 16},
    };
    const std::vector<W> pw = {{1, 0}, {8, 0}, {64, 0}, {100, 0}, {512, 0}, {0, 3.0f}, {100, 2.0f}};
    for (int f8 = 0; f8 < 2; f8++)
        for (auto &c : pre)
            for (auto &w : pw) test_prefill(c, r, f8 != 0, false, w.window, w.cap);
}

// --- RoPE + KV write -------------------------------------------------------------------

static void test_rope(int m, int H, int n_kv, int hd, int bs, bool fused, Rng &r, bool f8 = false,
                      bool scaled = false) {
    char name[160];
    snprintf(name, sizeof name, "rope_kv_write%s m=%d h=%d/%d d=%d %s", scaled ? " fp8 scaled" : f8 ? " fp8" : "", m,
             H, n_kv, hd, fused ? "fused-qkv" : "split");
    if (!selected(name)) return;
    const size_t esz = f8 ? 1 : 2; // cache bytes per element
    const int n_blocks = (m + bs - 1) / bs + 4;
    const int64_t row = (int64_t)(H + 2 * n_kv) * hd;
    const int64_t qs = fused ? row : (int64_t)H * hd, ks = fused ? row : (int64_t)n_kv * hd, vs = ks;
    std::vector<uint16_t> qkv((size_t)m * row), q((size_t)m * qs), k((size_t)m * ks), v((size_t)m * vs);
    fill_bf16(qkv, r, 2.0f);
    fill_bf16(q, r, 2.0f);
    fill_bf16(k, r, 2.0f);
    fill_bf16(v, r, 2.0f);
    if (f8) // some values past e4m3's 448 (saturation) and some tiny ones (subnormals)
        for (auto *vec : {&qkv, &q, &k, &v})
            for (size_t i = 0; i < vec->size(); i++)
                if (i % 101 == 3) (*vec)[i] = f2bf(bf2f((*vec)[i]) * 400.0f);
                else if (i % 103 == 5) (*vec)[i] = f2bf(bf2f((*vec)[i]) * 0.004f);
    std::vector<int32_t> pos(m), slots(m);
    std::vector<int> perm(n_blocks * bs);
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = (int)perm.size() - 1; i > 0; i--) std::swap(perm[i], perm[r.below(i + 1)]);
    for (int i = 0; i < m; i++) {
        pos[i] = r.below(131072);
        slots[i] = (i % 7 == 3) ? -1 : perm[i]; // some padding tokens
    }
    std::vector<float> inv(hd / 2);
    for (int j = 0; j < hd / 2; j++) inv[j] = (float)(1.0 / pow(500000.0, 2.0 * j / hd));
    DBuf dq, dk, dv, dpos, dsl, dinv, dkc((size_t)n_blocks * bs * n_kv * hd * esz), dvc(dkc.n);
    uint16_t *hq, *hk, *hv; // the host views the kernel sees
    if (fused) {
        dq.up(qkv);
        hq = qkv.data();
        hk = qkv.data() + (size_t)H * hd;
        hv = qkv.data() + (size_t)(H + n_kv) * hd;
    } else {
        dq.up(q);
        dk.up(k);
        dv.up(v);
        hq = q.data();
        hk = k.data();
        hv = v.data();
    }
    uint16_t *dqp = dq.as<uint16_t>(), *dkp = fused ? dqp + (size_t)H * hd : dk.as<uint16_t>(),
             *dvp = fused ? dqp + (size_t)(H + n_kv) * hd : dv.as<uint16_t>();
    dpos.up(pos);
    dsl.up(slots);
    dinv.up(inv);
    CK(cudaMemset(dkc.p, 0xFF, dkc.n));
    CK(cudaMemset(dvc.p, 0xFF, dvc.n));
    // scaled: a K and a V scale per KV head (0.01 to 10); the cache holds x / s.
    std::vector<float> sc(scaled ? 2 * (size_t)n_kv : 0);
    for (auto &x : sc) x = (float)pow(10.0, -2.0 + 3.0 * (double)r.below(1000) / 1000.0);
    DBuf dsc;
    if (scaled) dsc.up(sc);
    auto ksc = [&](int h) { return scaled ? sc[(size_t)h] : 1.0f; };
    auto vsc = [&](int h) { return scaled ? sc[(size_t)(n_kv + h)] : 1.0f; };
    pg_kv_shape shp{n_blocks, bs, n_kv, hd, f8 ? PG_KV_FP8_E4M3 : PG_KV_BF16};
    shp.scales = scaled ? dsc.as<float>() : nullptr;
    PK(pg_cuda_rope_kv_write(dqp, qs, dkp, ks, dvp, vs, dpos.as<int32_t>(), dsl.as<int32_t>(), m, H, dinv.as<float>(),
                             dkc.p, dvc.p, shp, nullptr));
    CK(cudaDeviceSynchronize());
    // Reference: the CPU's float angle, rotation in fp64.
    std::vector<double> ref_q, out_q, ref_k, out_k;
    std::vector<uint16_t> gq(fused ? qkv.size() : q.size()), gk(fused ? 0 : k.size());
    dq.down(gq);
    if (!fused) dk.down(gk);
    const uint16_t *gqp = gq.data(), *gkp = fused ? gq.data() + (size_t)H * hd : gk.data();
    for (int i = 0; i < m; i++) {
        for (int h = 0; h < H + n_kv; h++) {
            bool isq = h < H;
            const uint16_t *x = isq ? hq + (size_t)i * qs + (size_t)h * hd : hk + (size_t)i * ks + (size_t)(h - H) * hd;
            const uint16_t *g = isq ? gqp + (size_t)i * qs + (size_t)h * hd : gkp + (size_t)i * ks + (size_t)(h - H) * hd;
            for (int j = 0; j < hd / 2; j++) {
                float a = (float)pos[i] * inv[j];
                double c = cos((double)a), s = sin((double)a);
                double x0 = bf2f(x[j]), x1 = bf2f(x[j + hd / 2]);
                auto &rr = isq ? ref_q : ref_k;
                auto &oo = isq ? out_q : out_k;
                rr.push_back(x0 * c - x1 * s);
                rr.push_back(x1 * c + x0 * s);
                oo.push_back(bf2f(g[j]));
                oo.push_back(bf2f(g[j + hd / 2]));
            }
        }
    }
    report((std::string(name) + " q").c_str(), rel_err(out_q, ref_q), 1e-2);
    report((std::string(name) + " k").c_str(), rel_err(out_k, ref_k), 1e-2);
    if (f8) {
        // The cache: v = e4m3(bf16 v) bit for bit; k within one e4m3 step of
        // e4m3(fp64 rotation) (the kernel rounds its fp32 rotation); padding
        // and other slots untouched (0xFF).
        std::vector<uint8_t> kc(dkc.n), vc(dvc.n);
        dkc.down(kc);
        dvc.down(vc);
        bool ok = true;
        int k_off = 0, worst = 0;
        std::vector<char> written((size_t)n_blocks * bs, 0);
        for (int i = 0; i < m && ok; i++) {
            if (slots[i] < 0) continue;
            written[slots[i]] = 1;
            for (int h = 0; h < n_kv; h++) {
                const uint16_t *x = hk + (size_t)i * ks + (size_t)h * hd;
                for (int e = 0; e < hd; e++) {
                    const int half = hd / 2, j = e % half;
                    float a = (float)pos[i] * inv[j];
                    double c = cos((double)a), sn = sin((double)a), x0 = bf2f(x[j]), x1 = bf2f(x[j + half]);
                    double rk = e < half ? x0 * c - x1 * sn : x1 * c + x0 * sn;
                    size_t ci = ((size_t)slots[i] * n_kv + h) * hd + e;
                    int d = abs(e4m3_order(kc[ci]) - e4m3_order(f_to_e4m3((float)(rk / ksc(h)))));
                    worst = std::max(worst, d);
                    k_off += d != 0;
                    ok &= d <= 1;
                    ok &= vc[ci] == f_to_e4m3(bf2f(hv[(size_t)i * vs + (size_t)h * hd + e]) / vsc(h));
                }
            }
        }
        for (size_t sl = 0; sl < written.size() && ok; sl++)
            if (!written[sl])
                for (int e = 0; e < n_kv * hd; e++) ok &= kc[sl * n_kv * hd + e] == 0xFF && vc[sl * n_kv * hd + e] == 0xFF;
        char detail[160];
        snprintf(detail, sizeof detail, "v exact, k: %d of the bytes one e4m3 step off (max %d), padding skipped",
                 k_off, worst);
        report_bool((std::string(name) + " cache").c_str(), ok, ok ? detail : "cache mismatch");
        return;
    }
    // The cache: rotated k and v at each slot, bit for bit; other slots untouched.
    std::vector<uint16_t> kc(dkc.n / 2), vc(dvc.n / 2);
    dkc.down(kc);
    dvc.down(vc);
    bool ok = true;
    std::vector<char> written((size_t)n_blocks * bs, 0);
    for (int i = 0; i < m && ok; i++) {
        if (slots[i] < 0) continue;
        written[slots[i]] = 1;
        for (int h = 0; h < n_kv; h++)
            for (int e = 0; e < hd; e++) {
                size_t ci = ((size_t)slots[i] * n_kv + h) * hd + e;
                ok &= kc[ci] == gkp[(size_t)i * ks + (size_t)h * hd + e];
                ok &= vc[ci] == hv[(size_t)i * vs + (size_t)h * hd + e];
            }
    }
    for (size_t sl = 0; sl < written.size() && ok; sl++)
        if (!written[sl])
            for (int e = 0; e < n_kv * hd; e++) ok &= kc[sl * n_kv * hd + e] == POISON && vc[sl * n_kv * hd + e] == POISON;
    report_bool((std::string(name) + " cache").c_str(), ok, ok ? "slots exact, padding skipped" : "cache mismatch");
}

// --- add + RMSNorm, SiLU*mul, embedding, block copy, conversions -------------------------

static void test_rmsnorm(int m, int dim, bool residual, bool alias, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "add_rmsnorm m=%d dim=%d%s%s", m, dim, residual ? " +residual" : "", alias ? " in-place" : "");
    if (!selected(name)) return;
    std::vector<uint16_t> x((size_t)m * dim), res(x.size()), w(dim);
    fill_bf16(x, r, 3.0f);
    fill_bf16(res, r, 3.0f);
    fill_bf16(w, r, 1.0f);
    DBuf dx, dr, dw, dout(x.size() * 2);
    dx.up(x);
    dr.up(res);
    dw.up(w);
    CK(cudaMemset(dout.p, 0xFF, dout.n));
    void *outp = alias ? dx.p : dout.p;
    PK(pg_cuda_add_rmsnorm(outp, dx.p, residual ? dr.p : nullptr, dw.p, m, dim, 1e-5f, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> gx(x.size()), go(x.size());
    dx.down(gx);
    if (alias) go = gx;
    else dout.down(go);
    std::vector<double> ref(x.size()), out(x.size());
    bool x_ok = true;
    for (int i = 0; i < m; i++) {
        std::vector<double> xs(dim);
        double ss = 0;
        for (int e = 0; e < dim; e++) {
            size_t k = (size_t)i * dim + e;
            uint16_t nx = residual ? f2bf(bf2f(x[k]) + bf2f(res[k])) : x[k];
            if (!alias) x_ok &= gx[k] == nx;
            xs[e] = bf2f(nx);
            ss += xs[e] * xs[e];
        }
        double rs = 1.0 / sqrt(ss / dim + 1e-5);
        for (int e = 0; e < dim; e++) {
            ref[(size_t)i * dim + e] = xs[e] * rs * bf2f(w[e]);
            out[(size_t)i * dim + e] = bf2f(go[(size_t)i * dim + e]);
        }
    }
    report(name, rel_err(out, ref), 1e-2);
    if (!alias) report_bool((std::string(name) + " x").c_str(), x_ok, x_ok ? "x = bf16(x + residual) exact" : "x mismatch");
}

// Qwen2's QKV bias: out[i][j] = bf16(out[i][j] + bias[j]) for j < n, in
// place; the fp32 add of two bf16 then one rounding is the host's too, so
// every element must match bit for bit, and columns [n, ldo) (poisoned)
// must stay untouched. col_off shifts out off 16-byte alignment (scalar path).
static void test_add_bias(int m, int n, int ldo, int col_off, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "add_bias m=%d n=%d ldo=%d%s", m, n, ldo, col_off ? " unaligned" : "");
    if (!selected(name)) return;
    std::vector<uint16_t> buf((size_t)m * ldo + col_off), bias(n);
    fill_bf16(buf, r, 4.0f);
    fill_bf16(bias, r, 1.0f);
    for (int i = 0; i < m; i++)
        for (int j = n; j < ldo; j++) buf[col_off + (size_t)i * ldo + j] = POISON;
    DBuf db, dbias;
    db.up(buf);
    dbias.up(bias);
    PK(pg_cuda_add_bias(db.as<uint16_t>() + col_off, ldo, dbias.p, m, n, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(buf.size());
    db.down(got);
    int bad = 0, touched = 0;
    for (size_t k = 0; k < buf.size(); k++) {
        const int64_t e = (int64_t)k - col_off, j = e % ldo;
        if (e < 0 || j >= n) touched += got[k] != buf[k];
        else bad += got[k] != f2bf(bf2f(buf[k]) + bf2f(bias[j]));
    }
    char detail[128];
    snprintf(detail, sizeof detail, "%d of %lld values differ, %d padding values touched", bad, (long long)m * n,
             touched);
    report_bool(name, bad == 0 && touched == 0, bad || touched ? detail : "every value bit for bit, padding untouched");
}

// Qwen3's q_norm / k_norm: each head_dim slice of n_heads heads at
// x = row + off, rows `stride` apart, normalized in place against fp64.
// Heads get different scales (so each must use its own sum); everything
// else in the buffer is poisoned and must stay so. Checks every value
// within one bf16 ulp of the reference (one rounding of an fp32 result)
// and the usual relative error.
static void test_head_rmsnorm(int m, int n_heads, int hd, int64_t stride, int64_t off, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "head_rmsnorm m=%d heads=%d d=%d stride=%lld off=%lld", m, n_heads, hd,
             (long long)stride, (long long)off);
    if (!selected(name)) return;
    const float eps = 1e-6f;
    std::vector<uint16_t> buf((size_t)m * stride + off, POISON), w(hd);
    auto in_head = [&](size_t k, int64_t &row, int64_t &h, int64_t &d) {
        const int64_t e = (int64_t)k - off;
        if (e < 0) return false;
        row = e / stride;
        const int64_t c = e % stride;
        h = c / hd;
        d = c % hd;
        return h < n_heads;
    };
    std::vector<float> head_scale((size_t)m * n_heads);
    for (auto &hs : head_scale) hs = (float)pow(10.0, 3.0 * r.uni() - 2.0); // 0.01 .. 10
    for (size_t k = 0; k < buf.size(); k++) {
        int64_t row, h, d;
        if (in_head(k, row, h, d)) buf[k] = f2bf(r.sym() * head_scale[row * n_heads + h]);
    }
    for (auto &x : w) x = f2bf(1.0f + 0.5f * r.sym());
    DBuf db, dw;
    db.up(buf);
    dw.up(w);
    PK(pg_cuda_head_rmsnorm(db.as<uint16_t>() + off, stride, n_heads, hd, dw.p, eps, m, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(buf.size());
    db.down(got);
    std::vector<double> rs((size_t)m * n_heads), ref, out;
    for (int i = 0; i < m; i++)
        for (int h = 0; h < n_heads; h++) {
            double ss = 0;
            for (int d = 0; d < hd; d++) {
                double v = bf2f(buf[off + (size_t)i * stride + (size_t)h * hd + d]);
                ss += v * v;
            }
            rs[(size_t)i * n_heads + h] = 1.0 / sqrt(ss / hd + eps);
        }
    int touched = 0;
    double worst_ulp = 0;
    for (size_t k = 0; k < buf.size(); k++) {
        int64_t row, h, d;
        if (!in_head(k, row, h, d)) {
            touched += got[k] != buf[k];
            continue;
        }
        const double x = bf2f(buf[k]) * rs[row * n_heads + h] * bf2f(w[d]), g = bf2f(got[k]);
        ref.push_back(x);
        out.push_back(g);
        int e = 0;
        frexp(x, &e); // |x| in [2^(e-1), 2^e): a bf16 ulp there is 2^(e-8)
        const double ulp = x != 0 ? ldexp(1.0, e - 8) : 0x1p-133;
        worst_ulp = std::max(worst_ulp, g == g ? fabs(g - x) / ulp : 1e9);
    }
    report(name, rel_err(out, ref), 1e-2);
    char detail[128];
    snprintf(detail, sizeof detail, "worst %.2f bf16 ulp (bound 1), %d values outside the heads touched", worst_ulp,
             touched);
    report_bool((std::string(name) + " every value").c_str(), worst_ulp <= 1.0 && touched == 0, detail);
}

// Shapes head_rmsnorm does not build, and add_bias's argument checks.
static void test_norm_bias_refusals() {
    const char *name = "head_rmsnorm/add_bias refusals";
    if (!selected(name)) return;
    DBuf d(4096), dw(1024);
    const int a = pg_cuda_head_rmsnorm(d.p, 2 * 258, 2, 258, dw.p, 1e-6f, 1, nullptr);
    const int b = pg_cuda_head_rmsnorm(d.p, 2 * 63, 2, 63, dw.p, 1e-6f, 1, nullptr);
    const int c = pg_cuda_head_rmsnorm(d.p, 100, 2, 64, dw.p, 1e-6f, 1, nullptr); // stride < 2 heads
    const int e = pg_cuda_add_bias(d.p, 100, dw.p, 1, 128, nullptr);             // ldo < n
    const bool ok = a == PG_EUNSUPP && b == PG_EUNSUPP && c == PG_EINVAL && e == PG_EINVAL;
    char detail[128];
    snprintf(detail, sizeof detail, "head_dim 258 %d, 63 %d, short stride %d, ldo < n %d", a, b, c, e);
    report_bool(name, ok, detail);
}

static void test_silu(int m, int ffn, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "silu_mul m=%d ffn=%d", m, ffn);
    if (!selected(name)) return;
    std::vector<uint16_t> gu((size_t)m * 2 * ffn);
    fill_bf16(gu, r, 6.0f);
    DBuf dg, dout((size_t)m * ffn * 2);
    dg.up(gu);
    CK(cudaMemset(dout.p, 0xFF, dout.n));
    PK(pg_cuda_silu_mul(dout.p, dg.p, m, ffn, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go((size_t)m * ffn);
    dout.down(go);
    std::vector<double> ref(go.size()), out(go.size());
    for (int i = 0; i < m; i++)
        for (int e = 0; e < ffn; e++) {
            double g = bf2f(gu[(size_t)i * 2 * ffn + e]), u = bf2f(gu[(size_t)i * 2 * ffn + ffn + e]);
            ref[(size_t)i * ffn + e] = g / (1 + exp(-g)) * u;
            out[(size_t)i * ffn + e] = bf2f(go[(size_t)i * ffn + e]);
        }
    report(name, rel_err(out, ref), 1e-2);
}

// id0 > 0: a vocabulary shard (tensor parallelism) holding ids [id0, id0 +
// vocab): ids below and above it give zero rows.
static void test_embed(int m, int dim, int vocab, Rng &r, int id0 = 0) {
    char name[160];
    snprintf(name, sizeof name, "embed m=%d dim=%d vocab=%d id0=%d", m, dim, vocab, id0);
    if (!selected(name)) return;
    std::vector<uint16_t> table((size_t)vocab * dim);
    fill_bf16(table, r, 1.0f);
    std::vector<int32_t> ids(m);
    for (int i = 0; i < m; i++)
        ids[i] = (i == 5) ? id0 + vocab + 3 : (i == 6 ? -1 : (i == 7 && id0 ? id0 - 1 : id0 + r.below(vocab)));
    if (id0)
        for (int i = 8; i < m; i += 3) ids[i] = r.below(id0 + 2 * vocab); // in and out of the shard
    DBuf dt, di, dout((size_t)m * dim * 2);
    dt.up(table);
    di.up(ids);
    CK(cudaMemset(dout.p, 0xFF, dout.n));
    PK(pg_cuda_embed_shard(dout.p, dt.p, di.as<int32_t>(), m, dim, vocab, id0, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go((size_t)m * dim);
    dout.down(go);
    bool ok = true;
    for (int i = 0; i < m; i++)
        for (int e = 0; e < dim; e++) {
            const int64_t row = (int64_t)ids[i] - id0;
            bool valid = row >= 0 && row < vocab;
            ok &= go[(size_t)i * dim + e] == (valid ? table[(size_t)row * dim + e] : (uint16_t)0);
        }
    report_bool(name, ok, ok ? "rows exact, ids outside the table zero" : "mismatch");
}

// Tensor-parallel greedy sampling: per-rank row maxima of bf16 logits
// (with planted ties, which go to the lower column) and the pick across
// ranks (ties to the lower rank), against a host loop, exactly.
static void test_argmax(int ranks, int rows, int cols, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "argmax ranks=%d rows=%d cols=%d", ranks, rows, cols);
    if (!selected(name)) return;
    std::vector<uint16_t> x((size_t)ranks * rows * cols);
    fill_bf16(x, r, 4.0f);
    for (int i = 0; i < ranks * rows; i += 3) { // a tie inside the row: the lower column wins
        uint16_t *row = &x[(size_t)i * cols];
        int a = r.below(cols), b = r.below(cols);
        uint16_t mx = row[0];
        for (int j = 1; j < cols; j++)
            if (bf2f(row[j]) > bf2f(mx)) mx = row[j];
        row[a] = row[b] = mx;
    }
    DBuf dx, dc((size_t)ranks * rows * sizeof(pg_argmax)), dout((size_t)rows * sizeof(pg_sample_out));
    dx.up(x);
    for (int k = 0; k < ranks; k++)
        PK(pg_cuda_argmax_rows((pg_argmax *)dc.p + (size_t)k * rows, (const uint16_t *)dx.p + (size_t)k * rows * cols,
                               PG_DTYPE_BF16, rows, cols, cols, nullptr));
    PK(pg_cuda_argmax_pick((pg_sample_out *)dout.p, (const pg_argmax *)dc.p, ranks, rows, cols, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<pg_argmax> cand((size_t)ranks * rows);
    std::vector<pg_sample_out> out(rows);
    CK(cudaMemcpy(cand.data(), dc.p, cand.size() * sizeof(pg_argmax), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(out.data(), dout.p, out.size() * sizeof(pg_sample_out), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < rows; i++) {
        // The whole vocabulary row (rank k's slice is columns k * cols ..):
        // the first maximum is the greedy token.
        int best = -1;
        float bv = 0;
        for (int k = 0; k < ranks; k++)
            for (int j = 0; j < cols; j++) {
                float v = bf2f(x[((size_t)k * rows + i) * cols + j]);
                if (best < 0 || v > bv) best = k * cols + j, bv = v;
            }
        ok &= out[i].token == best && out[i].n_top == 0;
        for (int k = 0; k < ranks; k++) {
            const pg_argmax &c = cand[(size_t)k * rows + i];
            ok &= c.index >= 0 && c.index < cols && c.value == bf2f(x[((size_t)k * rows + i) * cols + c.index]);
            for (int j = 0; j < cols; j++) {
                float v = bf2f(x[((size_t)k * rows + i) * cols + j]);
                ok &= v < c.value || (v == c.value && j >= c.index);
            }
        }
    }
    report_bool(name, ok, ok ? "maxima, ties and picks exact" : "mismatch");
}

// Tensor-parallel top-k: each rank's best k entries of its slice of bf16
// (or f32) logits in the sampler's order, s = (x - mx) * (1 / T) (mx the
// largest over all ranks, scale 1 for greedy rows), ties to the lower
// column, (-inf, -1) past the slice; then the exchanged entries scattered
// into rows of -inf. Against a host loop with the same float ops, exactly;
// planted ties, rows of stride > cols with NaN padding (never read).
static void test_topk(int ranks, int rows, int cols, int k, Rng &r, bool f32 = false) {
    char name[160];
    snprintf(name, sizeof name, "topk%s ranks=%d rows=%d cols=%d k=%d", f32 ? " f32" : "", ranks, rows, cols, k);
    std::string sname = std::string(name) + " scatter";
    if (!selected(name) && !selected(sname.c_str())) return;
    const int64_t ld = cols + 5, nr = (int64_t)ranks * rows;
    std::vector<float> xf((size_t)(nr * ld), NAN);
    for (int64_t q = 0; q < nr; q++) {
        float *row = &xf[(size_t)(q * ld)];
        for (int j = 0; j < cols; j++) row[j] = f32 ? r.sym() * 4.0f : bf2f(f2bf(r.sym() * 4.0f));
        // Ties: the row maximum at two more columns, and copies of other values.
        float mx = row[0];
        for (int j = 1; j < cols; j++) mx = std::max(mx, row[j]);
        row[r.below(cols)] = mx;
        row[r.below(cols)] = mx;
        for (int t = 0; t < 8; t++) row[r.below(cols)] = row[r.below(cols)];
    }
    DBuf dx;
    if (f32) {
        dx.up(xf);
    } else {
        std::vector<uint16_t> xb(xf.size());
        for (size_t e = 0; e < xf.size(); e++) xb[e] = f2bf(xf[e]); // NaN padding stays NaN
        dx.up(xb);
    }
    // The ranks' row maxima (what argmax_rows exchanges), from the data.
    std::vector<pg_argmax> cand((size_t)nr);
    for (int64_t q = 0; q < nr; q++) {
        const float *row = &xf[(size_t)(q * ld)];
        pg_argmax a{row[0], 0};
        for (int j = 1; j < cols; j++)
            if (row[j] > a.value) a = pg_argmax{row[j], j};
        cand[(size_t)q] = a;
    }
    // Temperatures; row 1 greedy (T = 0), row 4 greedy by top_k = 1.
    const float temps[] = {0.7f, 0.0f, 1.3f, 1.0f, 0.55f, 1.7f, 0.3f};
    std::vector<pg_sample_params> params(rows);
    for (int i = 0; i < rows; i++) {
        memset(&params[i], 0, sizeof params[i]);
        params[i].temperature = temps[i % 7];
        params[i].top_p = 1.0f;
        params[i].repetition_penalty = 1.0f;
        params[i].top_k = i % 7 == 4 ? 1 : 40;
        params[i].logprobs = -1;
    }
    DBuf dc, dp, dout((size_t)nr * k * sizeof(pg_argmax));
    dc.up(cand);
    dp.up(params);
    const int dt = f32 ? PG_DTYPE_F32 : PG_DTYPE_BF16;
    const size_t esz = f32 ? 4 : 2;
    for (int q = 0; q < ranks; q++)
        PK(pg_cuda_topk_rows((pg_argmax *)dout.p + (size_t)q * rows * k, (const char *)dx.p + (size_t)q * rows * ld * esz,
                             dt, rows, cols, ld, k, (const pg_argmax *)dc.p, ranks, (const pg_sample_params *)dp.p,
                             q * cols, nullptr));
    // The scatter into full-vocabulary rows (stride > vocab, padding poisoned).
    const int64_t vocab = (int64_t)ranks * cols, lv = vocab + 3;
    DBuf dl((size_t)(rows * lv) * esz);
    CK(cudaMemset(dl.p, 0xFF, dl.n)); // NaN in bf16 and f32
    PK(pg_cuda_topk_scatter(dl.p, dt, rows, vocab, lv, (const pg_argmax *)dout.p, ranks, k, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<pg_argmax> out((size_t)nr * k);
    dout.down(out);

    bool ok = true;
    int n_ties = 0;
    // Row i of the scatter, built from the host order.
    std::vector<std::vector<float>> ref_rows(rows, std::vector<float>((size_t)vocab, -INFINITY));
    for (int i = 0; i < rows; i++) {
        float mx = cand[(size_t)i].value;
        for (int q = 1; q < ranks; q++) mx = std::max(mx, cand[(size_t)q * rows + i].value);
        const float t = params[i].temperature;
        volatile float inv_t = (t <= 0.0f || params[i].top_k == 1) ? 1.0f : 1.0f / t;
        for (int q = 0; q < ranks; q++) {
            const float *row = &xf[((size_t)q * rows + i) * ld];
            std::vector<std::pair<float, int>> sc(cols);
            for (int j = 0; j < cols; j++) {
                volatile float d = row[j] - mx; // separate float ops: no contraction
                volatile float sv = d * inv_t;
                float s_ = sv;
                if (s_ != s_) s_ = -INFINITY;
                sc[j] = {s_, j};
            }
            std::sort(sc.begin(), sc.end(), [](const std::pair<float, int> &a, const std::pair<float, int> &b) {
                return a.first > b.first || (a.first == b.first && a.second < b.second);
            });
            const pg_argmax *o = &out[((size_t)q * rows + i) * k];
            for (int e = 0; e < k; e++) {
                if (e < cols) {
                    const int j = sc[e].second;
                    ok &= o[e].index == q * cols + j && memcmp(&o[e].value, &row[j], 4) == 0;
                    if (e > 0 && sc[e].first == sc[e - 1].first) n_ties++;
                    ref_rows[i][(size_t)q * cols + j] = row[j];
                } else {
                    ok &= o[e].index == -1 && o[e].value == -INFINITY;
                }
            }
        }
    }
    char detail[160];
    snprintf(detail, sizeof detail, "order, values, ids and padding exact (%d ties inside the top k)", n_ties);
    report_bool(name, ok && n_ties > 0, ok ? (n_ties > 0 ? detail : "no ties were tested") : "mismatch");

    bool sok = true;
    int64_t n_kept = 0;
    if (f32) {
        std::vector<float> got((size_t)(rows * lv));
        dl.down(got);
        for (int i = 0; i < rows; i++) {
            for (int64_t c = 0; c < vocab; c++) {
                const float g = got[(size_t)(i * lv + c)], w = ref_rows[i][(size_t)c];
                sok &= memcmp(&g, &w, 4) == 0;
                n_kept += w != -INFINITY;
            }
            for (int64_t c = vocab; c < lv; c++) sok &= got[(size_t)(i * lv + c)] != got[(size_t)(i * lv + c)];
        }
    } else {
        std::vector<uint16_t> got((size_t)(rows * lv));
        dl.down(got);
        for (int i = 0; i < rows; i++) {
            for (int64_t c = 0; c < vocab; c++) {
                sok &= got[(size_t)(i * lv + c)] == f2bf(ref_rows[i][(size_t)c]);
                n_kept += ref_rows[i][(size_t)c] != -INFINITY;
            }
            for (int64_t c = vocab; c < lv; c++) sok &= got[(size_t)(i * lv + c)] == 0xFFFF;
        }
    }
    snprintf(detail, sizeof detail, "%lld candidates placed, every other column -inf, padding untouched",
             (long long)n_kept);
    report_bool(sname.c_str(), sok, sok ? detail : "mismatch");
}

// Async scheduling: tokens[row] = prev[j].token for (row, j) pairs; the other
// rows keep their value. Against a host loop, exactly.
static void test_feed_tokens(int n_tokens, int n_prev, int n_feed, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "feed_tokens tokens=%d prev=%d fed=%d", n_tokens, n_prev, n_feed);
    if (!selected(name)) return;
    std::vector<int32_t> tok(n_tokens), pairs(2 * (size_t)n_feed);
    for (auto &t : tok) t = r.below(50000);
    std::vector<pg_sample_out> prev(n_prev);
    memset(prev.data(), 0, prev.size() * sizeof prev[0]);
    for (auto &o : prev) o.token = r.below(128000), o.n_top = 3;
    // Distinct rows, any sample indices.
    std::vector<int32_t> rows(n_tokens);
    for (int i = 0; i < n_tokens; i++) rows[i] = i;
    for (int i = n_tokens - 1; i > 0; i--) std::swap(rows[i], rows[r.below(i + 1)]);
    std::vector<int32_t> want = tok;
    for (int i = 0; i < n_feed; i++) {
        pairs[2 * i] = rows[i];
        pairs[2 * i + 1] = r.below(n_prev);
        want[rows[i]] = prev[pairs[2 * i + 1]].token;
    }
    DBuf dt, dp, dq;
    dt.up(tok);
    dp.up(prev);
    dq.up(pairs);
    PK(pg_cuda_feed_tokens(dt.as<int32_t>(), dp.as<pg_sample_out>(), dq.as<int32_t>(), n_feed, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<int32_t> got(n_tokens);
    dt.down(got);
    report_bool(name, got == want, got == want ? "fed rows exact, others untouched" : "mismatch");
}

static void test_copy_blocks(Rng &r) {
    const char *name = "copy_blocks layers=3 pairs=5 (cow)";
    if (!selected(name)) return;
    const int L = 3, nb = 40, bs = 16, nkv = 8, hd = 128;
    const size_t blk = (size_t)bs * nkv * hd;
    std::vector<std::vector<uint16_t>> hk(L), hv(L);
    std::vector<DBuf> dk(L), dv(L);
    std::vector<void *> pk(L), pv(L);
    for (int l = 0; l < L; l++) {
        hk[l].resize(nb * blk);
        hv[l].resize(nb * blk);
        fill_bf16(hk[l], r, 1.0f);
        fill_bf16(hv[l], r, 1.0f);
        dk[l].up(hk[l]);
        dv[l].up(hv[l]);
        pk[l] = dk[l].p;
        pv[l] = dv[l].p;
    }
    // Destinations are fresh blocks (never a source in the same call), as COW makes them.
    std::vector<int32_t> pairs = {3, 10, 0, 39, 17, 18, 25, 1, 38, 2};
    std::vector<void *> ptrs(pk);
    ptrs.insert(ptrs.end(), pv.begin(), pv.end()); // K pointers then V pointers, as the KV cache keeps them
    DBuf dptrs, dpairs;
    dptrs.up(ptrs);
    dpairs.up(pairs);
    PK(pg_cuda_move_blocks(dptrs.as<void *>(), dptrs.as<void *>(), 2 * L, dpairs.as<int32_t>(), 5, (int64_t)blk * 2,
                           nullptr));
    CK(cudaDeviceSynchronize());
    bool ok = true;
    for (int l = 0; l < L; l++) {
        std::vector<uint16_t> ek = hk[l], ev = hv[l], gk(ek.size()), gv(ev.size());
        for (int p = 0; p < 5; p++) {
            memcpy(&ek[pairs[2 * p + 1] * blk], &hk[l][pairs[2 * p] * blk], blk * 2);
            memcpy(&ev[pairs[2 * p + 1] * blk], &hv[l][pairs[2 * p] * blk], blk * 2);
        }
        dk[l].down(gk);
        dv[l].down(gv);
        ok &= gk == ek && gv == ev;
    }
    report_bool(name, ok, ok ? "all layers exact, other blocks untouched" : "mismatch");
}

// Swap through the host mirror as cu_kv_swap's kernel path makes it: the
// device cache's blocks to scattered blocks of a mapped pinned mirror and
// back to other device blocks, the pairs read from pinned memory by the
// kernel, against plain copies made here.
static void test_move_blocks_host(Rng &r) {
    const char *name = "move_blocks swap layers=4 pairs=300 (device <-> mapped host)";
    if (!selected(name)) return;
    const int L = 4, T = 2 * L, nb = 700, nh = 400, np = 300;
    const size_t bb = (size_t)16 * 8 * 128; // fp8 bytes of one block of one tensor
    std::vector<std::vector<uint8_t>> hd(T);
    std::vector<DBuf> dd(T);
    std::vector<void *> dptr(T), hptr(T);
    char *host = nullptr;
    int32_t *pairs = nullptr;
    CK(cudaHostAlloc((void **)&host, (size_t)T * nh * bb, cudaHostAllocMapped | cudaHostAllocPortable));
    CK(cudaHostAlloc((void **)&pairs, (size_t)np * 8, cudaHostAllocMapped | cudaHostAllocPortable));
    memset(host, 0, (size_t)T * nh * bb);
    for (int t = 0; t < T; t++) {
        hd[t].resize(nb * bb);
        for (auto &b : hd[t]) b = (uint8_t)r.below(256);
        dd[t].up(hd[t]);
        dptr[t] = dd[t].p;
        void *hp = nullptr;
        CK(cudaHostGetDevicePointer(&hp, host + (size_t)t * nh * bb, 0));
        hptr[t] = hp;
    }
    DBuf dd_ptrs, dh_ptrs;
    dd_ptrs.up(dptr);
    dh_ptrs.up(hptr);
    // Out: np distinct device blocks to np distinct host blocks, both in random order.
    std::vector<int32_t> src(nb), dst(nh);
    for (int i = 0; i < nb; i++) src[i] = i;
    for (int i = 0; i < nh; i++) dst[i] = i;
    for (int i = nb - 1; i > 0; i--) std::swap(src[i], src[r.below(i + 1)]);
    for (int i = nh - 1; i > 0; i--) std::swap(dst[i], dst[r.below(i + 1)]);
    for (int p = 0; p < np; p++) pairs[2 * p] = src[p], pairs[2 * p + 1] = dst[p];
    int32_t *dpairs = nullptr;
    CK(cudaHostGetDevicePointer((void **)&dpairs, pairs, 0));
    PK(pg_cuda_move_blocks(dd_ptrs.as<void *>(), dh_ptrs.as<void *>(), T, dpairs, np, (int64_t)bb, nullptr));
    CK(cudaDeviceSynchronize());
    bool ok = true;
    for (int t = 0; t < T && ok; t++)
        for (int p = 0; p < np && ok; p++)
            ok = !memcmp(host + ((size_t)t * nh + dst[p]) * bb, &hd[t][(size_t)src[p] * bb], bb);
    const bool out_ok = ok;
    // In: those host blocks to the device blocks the first 300 did not use.
    for (int p = 0; p < np; p++) pairs[2 * p] = dst[p], pairs[2 * p + 1] = src[np + p];
    PK(pg_cuda_move_blocks(dh_ptrs.as<void *>(), dd_ptrs.as<void *>(), T, dpairs, np, (int64_t)bb, nullptr));
    CK(cudaDeviceSynchronize());
    for (int t = 0; t < T && ok; t++) {
        std::vector<uint8_t> want = hd[t], got(want.size());
        for (int p = 0; p < np; p++)
            memcpy(&want[(size_t)src[np + p] * bb], &hd[t][(size_t)src[p] * bb], bb);
        dd[t].down(got);
        ok = got == want;
    }
    cudaFreeHost(host);
    cudaFreeHost(pairs);
    report_bool(name, ok, ok ? "out and back exact, other blocks untouched"
                              : (out_ok ? "swap-in mismatch" : "swap-out mismatch"));
}

static void test_convert(Rng &r) {
    const char *name = "f32<->bf16 n=1000003";
    if (!selected(name)) return;
    const int n = 1000003;
    std::vector<float> f(n);
    for (int i = 0; i < n; i++) f[i] = (float)(r.normal() * pow(2.0, r.below(60) - 30));
    f[0] = INFINITY;
    f[1] = -INFINITY;
    f[2] = NAN;
    f[3] = 1e-40f; // denormal
    f[4] = 3.3895314e38f; // rounds to inf
    DBuf df, db(n * 2), dback(n * 4);
    df.up(f);
    PK(pg_cuda_f32_to_bf16(db.p, df.as<float>(), n, nullptr));
    PK(pg_cuda_bf16_to_f32(dback.as<float>(), db.p, n, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> gb(n);
    std::vector<float> gf(n);
    db.down(gb);
    dback.down(gf);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        uint16_t e = f2bf(f[i]);
        bool nan = f[i] != f[i];
        if (nan ? (gb[i] & 0x7fff) <= 0x7f80 : gb[i] != e) bad++;
        float back = bf2f(gb[i]);
        if (!(nan ? gf[i] != gf[i] : memcmp(&back, &gf[i], 4) == 0)) bad++;
    }
    char d[64];
    snprintf(d, sizeof d, "%d mismatches (round to nearest even)", bad);
    report_bool(name, bad == 0, d);
}

// --- GEMM ------------------------------------------------------------------------------

static void test_gemm(pg_cuda_gemm *g, DBuf &ws, int m, int n, int k, int col_off, int ldo, bool acc, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "gemm m=%d n=%d k=%d ldo=%d col=%d%s", m, n, k, ldo, col_off, acc ? " accumulate" : "");
    if (!selected(name)) return;
    std::vector<uint16_t> x((size_t)m * k), w((size_t)n * k), o0((size_t)m * ldo);
    fill_bf16(x, r, 1.0f);
    fill_bf16(w, r, 1.0f);
    fill_bf16(o0, r, 4.0f);
    DBuf dx, dw, dout;
    dx.up(x);
    dw.up(w);
    dout.up(o0);
    uint16_t *op = dout.as<uint16_t>() + col_off;
    for (int rep = 0; rep < (acc ? 1 : 2); rep++) { // the second call takes the cached plan
        int rc = pg_cuda_gemm_bf16(g, op, ldo, dx.p, k, dw.p, m, n, k, acc, ws.p, ws.n, nullptr);
        if (rc != 0) {
            report_bool(name, false, pg_err_msg());
            return;
        }
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go(o0.size());
    dout.down(go);
    std::vector<double> ref((size_t)m * n), out((size_t)m * n);
    parallel_for(m, [&](int64_t i) {
        for (int j = 0; j < n; j++) {
            double s = acc ? bf2f(o0[(size_t)i * ldo + col_off + j]) : 0.0;
            for (int e = 0; e < k; e++) s += (double)bf2f(x[(size_t)i * k + e]) * bf2f(w[(size_t)j * k + e]);
            ref[(size_t)i * n + j] = s;
            out[(size_t)i * n + j] = bf2f(go[(size_t)i * ldo + col_off + j]);
        }
    });
    bool outside_ok = true; // columns outside [col_off, col_off + n) untouched
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldo; j++)
            if (j < col_off || j >= col_off + n) outside_ok &= go[(size_t)i * ldo + j] == o0[(size_t)i * ldo + j];
    report(name, outside_ok ? rel_err(out, ref) : NAN, 1e-2);
}

// --- GEMV (small m) ----------------------------------------------------------------------

// Uniform bf16 in [-scale, scale) on all host cores (the LM-head weight has
// 525M entries).
static void fill_bf16_par(std::vector<uint16_t> &v, uint64_t seed, float scale) {
    const int64_t chunk = 1 << 20, n = (int64_t)v.size();
    parallel_for((n + chunk - 1) / chunk, [&](int64_t c) {
        Rng r(seed + (uint64_t)c);
        const int64_t end = std::min(n, (c + 1) * chunk);
        for (int64_t i = c * chunk; i < end; i++) v[(size_t)i] = f2bf(r.sym() * scale);
    });
}

// A weight [rows][k], host and device, shared by the cases of one shape and
// made on first use (a -k filter skips the big ones).
struct GemvWeight {
    int rows, k;
    uint64_t seed;
    std::vector<uint16_t> h;
    DBuf d;
    GemvWeight(int rows_, int k_, Rng &r) : rows(rows_), k(k_), seed(r.next()) {}
    const GemvWeight &get() {
        if (h.empty()) {
            h.resize((size_t)rows * k);
            fill_bf16_par(h, seed, 1.0f);
            d.up(h);
        }
        return *this;
    }
};

// The GEMV kernel kind under test (pg_cuda_gemv_kernel_set) and whether the
// weights-before-wait promise is on, appended to every GEMV case name.
static char g_gemv_tag[48] = "";

// pg_cuda_gemv_bf16 against fp64, and against cuBLASLt on the same inputs.
// Without `acc` the output starts as NaN (every entry must be written).
static void test_gemv(pg_cuda_gemm *g, DBuf &ws, GemvWeight &wt, int m, int ldx, int ldo, bool acc, Rng &r) {
    const int n = wt.rows, k = wt.k;
    char name[160];
    snprintf(name, sizeof name, "gemv m=%d n=%d k=%d ldx=%d ldo=%d%s%s", m, n, k, ldx, ldo, acc ? " accumulate" : "",
             g_gemv_tag);
    if (!selected(name)) return;
    const GemvWeight &W = wt.get();
    std::vector<uint16_t> x((size_t)m * ldx), o0((size_t)m * ldo);
    fill_bf16(x, r, 1.0f);
    if (acc) fill_bf16(o0, r, 4.0f);
    else o0.assign(o0.size(), POISON);
    DBuf dx, dout, dlt;
    dx.up(x);
    dout.up(o0);
    dlt.up(o0);
    int rc = pg_cuda_gemv_bf16(dout.p, ldo, dx.p, ldx, W.d.p, m, n, k, acc, nullptr);
    if (rc != 0) {
        report_bool(name, false, pg_err_msg());
        return;
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go(o0.size());
    dout.down(go);
    std::vector<double> ref((size_t)m * n), out;
    parallel_for((int64_t)m * n, [&](int64_t t) {
        const int i = (int)(t / n), j = (int)(t % n);
        double s = acc ? bf2f(o0[(size_t)i * ldo + j]) : 0.0;
        const uint16_t *xr = &x[(size_t)i * ldx], *wr = &W.h[(size_t)j * k];
        for (int e = 0; e < k; e++) s += (double)bf2f(xr[e]) * bf2f(wr[e]);
        ref[(size_t)t] = s;
    });
    const bool outside_ok = gemv_out(go, o0, m, n, ldo, out);
    report(name, outside_ok ? rel_err(out, ref) : NAN, 1e-2);
    rc = pg_cuda_gemm_bf16(g, dlt.p, ldo, dx.p, ldx, W.d.p, m, n, k, acc, ws.p, ws.n, nullptr);
    char nm[200];
    snprintf(nm, sizeof nm, "%s vs cuBLASLt", name);
    if (rc != 0) {
        printf("skip %-68s cuBLASLt: %s\n", nm, pg_err_msg());
        return;
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> gl(o0.size());
    dlt.down(gl);
    std::vector<double> lt;
    gemv_out(gl, o0, m, n, ldo, lt);
    report(nm, rel_err(out, lt), 1e-2);
}

// The fused RMSNorm (and SiLU*mul) variants against fp64 on the normalized
// rows, and against the unfused kernels (add_rmsnorm, gemv[, silu_mul]) on
// the GPU, which they should equal bit for bit (checked within 1e-3, with the
// count of identical outputs printed). wt: [n][k], or [2 ffn][k] with silu.
static void test_gemv_norm(GemvWeight &wt, int m, int ldx, int ldo, bool silu, Rng &r) {
    const int k = wt.k, n = silu ? wt.rows / 2 : wt.rows;
    char name[160];
    snprintf(name, sizeof name, "%s m=%d %s=%d k=%d ldx=%d ldo=%d%s", silu ? "gemv_rmsnorm_silu" : "gemv_rmsnorm",
             m, silu ? "ffn" : "n", n, k, ldx, ldo, g_gemv_tag);
    if (!selected(name)) return;
    const GemvWeight &W = wt.get();
    const float eps = 1e-5f;
    std::vector<uint16_t> x((size_t)m * ldx), nw(k), o0((size_t)m * ldo, POISON);
    fill_bf16(x, r, 3.0f);
    for (auto &v : nw) v = f2bf(1.0f + 0.5f * r.sym());
    DBuf dx, dnw, dout;
    dx.up(x);
    dnw.up(nw);
    dout.up(o0);
    int rc = silu ? pg_cuda_gemv_rmsnorm_silu_bf16(dout.p, ldo, dx.p, ldx, dnw.p, eps, W.d.p, m, n, k, nullptr)
                  : pg_cuda_gemv_rmsnorm_bf16(dout.p, ldo, dx.p, ldx, dnw.p, eps, W.d.p, m, n, k, nullptr);
    if (rc != 0) {
        report_bool(name, false, pg_err_msg());
        return;
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go(o0.size()), gx(x.size());
    dout.down(go);
    dx.down(gx);
    // Reference: rows normalized in fp64, rounded to bf16 (as the kernels store them).
    const std::vector<double> xn = norm_rows_ref(x, ldx, nw, m, k, eps);
    std::vector<double> ref((size_t)m * n), out;
    parallel_for((int64_t)m * n, [&](int64_t t) {
        const int i = (int)(t / n), j = (int)(t % n);
        const double *xr = &xn[(size_t)i * k];
        double s0 = 0, s1 = 0;
        const uint16_t *w0 = &W.h[(size_t)j * k], *w1 = silu ? &W.h[(size_t)(n + j) * k] : w0;
        for (int e = 0; e < k; e++) s0 += xr[e] * bf2f(w0[e]);
        if (silu)
            for (int e = 0; e < k; e++) s1 += xr[e] * bf2f(w1[e]);
        ref[(size_t)t] = silu ? s0 / (1.0 + exp(-s0)) * s1 : s0;
    });
    const bool outside_ok = gemv_out(go, o0, m, n, ldo, out);
    const bool x_ok = gx == x;
    report(name, outside_ok && x_ok ? rel_err(out, ref) : NAN, 1e-2);
    if (ldx != k) return; // add_rmsnorm takes contiguous rows
    // The unfused path on the GPU.
    DBuf dxn((size_t)m * k * 2), dgu((size_t)m * (silu ? 2 * n : ldo) * 2), dh;
    PK(pg_cuda_add_rmsnorm(dxn.p, dx.p, nullptr, dnw.p, m, k, eps, nullptr));
    std::vector<uint16_t> gu_init((size_t)m * (silu ? 2 * n : ldo), POISON);
    dgu.up(gu_init);
    if (silu) {
        PK(pg_cuda_gemv_bf16(dgu.p, 2 * n, dxn.p, k, W.d.p, m, 2 * n, k, 0, nullptr));
        dh.up(o0);
        PK(pg_cuda_silu_mul(dh.p, dgu.p, m, n, nullptr)); // contiguous [m][ffn]
    } else {
        PK(pg_cuda_gemv_bf16(dgu.p, ldo, dxn.p, k, W.d.p, m, n, k, 0, nullptr));
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> gu((size_t)m * (silu ? n : ldo));
    (silu ? dh : dgu).down(gu);
    const int ldu = silu ? n : ldo;
    std::vector<double> un((size_t)m * n);
    int same = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            un[(size_t)i * n + j] = bf2f(gu[(size_t)i * ldu + j]);
            same += gu[(size_t)i * ldu + j] == go[(size_t)i * ldo + j];
        }
    const double e = rel_err(out, un);
    char nm[200], detail[160];
    snprintf(nm, sizeof nm, "%s vs unfused", name);
    snprintf(detail, sizeof detail, "%d of %d outputs bit-identical, rel_err %.3e (bound 1e-03)", same, m * n, e);
    report_bool(nm, e == e && e <= 1e-3, detail);
}

// Shapes the GEMV declines (PG_EUNSUPP, so the caller takes cuBLASLt) or
// rejects (PG_EINVAL), and m = 0 (nothing written).
static void test_gemv_unsupported() {
    const char *name = "gemv unsupported shapes";
    if (!selected(name)) return;
    const int K = 40960;
    DBuf dx((size_t)9 * K * 2 + 64), dw((size_t)16 * K * 2 + 64), dnw((size_t)K * 2 + 64), dout(4096);
    CK(cudaMemset(dx.p, 0, dx.n));
    CK(cudaMemset(dw.p, 0, dw.n));
    CK(cudaMemset(dnw.p, 0, dnw.n));
    CK(cudaMemset(dout.p, 0xFF, dout.n));
    char *x = dx.as<char>(), *w = dw.as<char>(), *nw = dnw.as<char>();
    void *o = dout.p;
    const Refusal c[] = {
        {"k % 8", pg_cuda_gemv_bf16(o, 16, x, 16, w, 1, 16, 12, 0, nullptr), PG_EUNSUPP},
        {"ldx % 8", pg_cuda_gemv_bf16(o, 16, x, 4100, w, 2, 16, 4096, 0, nullptr), PG_EUNSUPP},
        {"x misaligned", pg_cuda_gemv_bf16(o, 16, x + 2, 64, w, 1, 16, 64, 0, nullptr), PG_EUNSUPP},
        {"w misaligned", pg_cuda_gemv_bf16(o, 16, x, 64, w + 8, 1, 16, 64, 0, nullptr), PG_EUNSUPP},
        {"m 9", pg_cuda_gemv_bf16(o, 16, x, 64, w, 9, 16, 64, 0, nullptr), PG_EUNSUPP},
        {"m 8 k 16384 (x over shared memory)", pg_cuda_gemv_bf16(o, 16, x, 16384, w, 8, 16, 16384, 0, nullptr),
         PG_EUNSUPP},
        {"norm k 40960", pg_cuda_gemv_rmsnorm_bf16(o, 16, x, K, nw, 1e-5f, w, 1, 16, K, nullptr), PG_EUNSUPP},
        {"norm_w misaligned", pg_cuda_gemv_rmsnorm_bf16(o, 16, x, 64, nw + 2, 1e-5f, w, 1, 16, 64, nullptr),
         PG_EUNSUPP},
        {"silu m 9", pg_cuda_gemv_rmsnorm_silu_bf16(o, 16, x, 64, nw, 1e-5f, w, 9, 8, 64, nullptr), PG_EUNSUPP},
        {"null x", pg_cuda_gemv_bf16(o, 16, nullptr, 64, w, 1, 16, 64, 0, nullptr), PG_EINVAL},
        {"ldo < n", pg_cuda_gemv_bf16(o, 8, x, 64, w, 1, 16, 64, 0, nullptr), PG_EINVAL},
        {"null norm_w", pg_cuda_gemv_rmsnorm_bf16(o, 16, x, 64, nullptr, 1e-5f, w, 1, 16, 64, nullptr), PG_EINVAL},
        {"m 0", pg_cuda_gemv_bf16(o, 16, x, 64, w, 0, 16, 64, 0, nullptr), 0},
    };
    std::string detail;
    const bool ok = refusals_ok(dout, c, detail, 0xFF);
    report_bool(name, ok, detail.c_str());
}

static void gemv_tests(pg_cuda_gemm *g, DBuf &ws, Rng &r) {
    const int MAXM = PG_CUDA_GEMV_MAX_M;
    GemvWeight w1024(1024, 4096, r), w7(7, 64, r), w1(1, 8, r), wqkv(6144, 4096, r), wdown(4096, 14336, r),
        wgu(28672, 4096, r), wlm(128256, 4096, r), w7k(7, 14336, r), w1k(1, 14336, r), w1024s(1024, 64, r),
        w1024t(1024, 8, r);
    for (int m = 1; m <= MAXM; m++) {
        test_gemv(g, ws, w1024, m, 4096, 1024, false, r);
        test_gemv(g, ws, w7, m, 72, 9, m % 2 == 0, r);
        test_gemv(g, ws, w1, m, m % 2 ? 8 : 16, m % 2 ? 1 : 3, m % 3 == 0, r);
    }
    test_gemv(g, ws, w1024, 3, 4096 + 64, 1024 + 24, false, r); // strides past k and n
    test_gemv(g, ws, w1024, 8, 4096 + 8, 1030, true, r);
    test_gemv(g, ws, w1024, 1, 4096, 1024, true, r);
    for (int m : {1, 2, 4, 8}) test_gemv(g, ws, wqkv, m, 4096, 6144, false, r);   // fused QKV
    test_gemv(g, ws, wdown, 1, 14336, 4096, true, r);                            // down into the residual
    test_gemv(g, ws, wdown, 3, 14336, 4096, false, r);
    test_gemv(g, ws, wdown, 8, 14336, 4096, true, r);
    test_gemv(g, ws, wgu, 1, 4096, 28672, false, r);                             // fused gate/up
    test_gemv(g, ws, wgu, 5, 4096, 28672, false, r);
    test_gemv(g, ws, wlm, 1, 4096, 128256 + 8, false, r);                        // LM head, ld_logits
    test_gemv(g, ws, wlm, 8, 4096, 128256, false, r);
    test_gemv(g, ws, w7k, 1, 14336, 7, false, r);
    test_gemv(g, ws, w7k, 8, 14336, 8, true, r);
    test_gemv(g, ws, w1k, 2, 14336, 1, false, r);
    test_gemv(g, ws, w1024s, 4, 64, 1024, false, r);
    test_gemv(g, ws, w1024t, 4, 8, 1024, false, r);

    GemvWeight w64v(64, 20480, r), w2k(2048, 14336, r), w14(14, 64, r), w2(2, 8, r);
    for (int m = 1; m <= MAXM; m++) test_gemv_norm(wqkv, m, 4096, 6144, false, r);
    test_gemv_norm(wqkv, 2, 4096 + 64, 6144 + 8, false, r);
    test_gemv_norm(w7, 3, 64, 7, false, r);
    test_gemv_norm(w1, 1, 8, 1, false, r);
    test_gemv_norm(w1, 8, 8, 2, false, r);
    test_gemv_norm(w7k, 2, 14336, 7, false, r);  // add_rmsnorm's 2-chunk rows
    test_gemv_norm(w64v, 1, 20480, 64, false, r); // ... and its 4-chunk rows
    test_gemv_norm(w64v, 4, 20480, 64, false, r);
    test_gemv_norm(wlm, 1, 4096, 128256, false, r);
    for (int m = 1; m <= MAXM; m++) test_gemv_norm(wgu, m, 4096, 14336, true, r);
    test_gemv_norm(wgu, 3, 4096 + 32, 14336 + 8, true, r);
    test_gemv_norm(w14, 1, 64, 7, true, r);
    test_gemv_norm(w14, 5, 64, 7, true, r);
    test_gemv_norm(w14, 8, 64, 9, true, r);
    test_gemv_norm(w2, 1, 8, 1, true, r);
    test_gemv_norm(w2, 8, 8, 1, true, r);
    test_gemv_norm(w2k, 4, 14336, 1024, true, r);
    test_gemv_unsupported();
}

// --- quantized weights: FP8 e4m3 per row, int4 groups (kernels/cuda/qgemv.cu) ---------
//
// Weights quantized on the host with the repository's own quantizers
// (pg_quantize_row_fp8 / pg_quantize_row_int4, kernels/dtype.c), so the
// device reads exactly the bytes the CPU backend runs; the references are
// fp64 over pg_dequantize_row's values (times the row scale for fp8) and the
// same bf16 activations. Bounds, relative to the output's max |y| (max_rel):
// 4e-3 for the GEMV: its output is rounded to bf16 (8 significant bits, so
// half an ulp is up to 2^-8 = 3.9e-3 of |y|; the first GPU run measured
// 1.7e-3 .. 3.7e-3 against a bound of 2e-3 that had taken 2^-9 for it) and
// its f32 sums add ~1e-6; 1e-2 for dequantize + bf16 cuBLASLt (the weight
// is rounded to bf16 too). The FP8 GEMV is weight-only; the CPU twin's quant
// numerics are W8A8 (activations to e4m3 per token), recomputed here from
// pg_quantize_row_fp8: that difference is the activations' e4m3 rounding (3
// mantissa bits, ~3% rms per element), far above bf16 noise, so that
// comparison is a sanity bound (rel_err 6e-2), not an equality.
static bool qdtype_fp8(int dtype) { return dtype == PG_DTYPE_FP8_E4M3; }

// A quantized weight [n][k], host and device, made on first use.
struct QWeight {
    int dtype, n, k;
    uint64_t seed;
    size_t rb = 0;
    std::vector<uint8_t> q;     // [n][rb] as stored
    std::vector<float> scales;  // fp8: [n]
    std::vector<float> deq;     // [n][k] pg_dequantize_row (fp8: unscaled)
    DBuf dq, ds;
    QWeight(int dtype_, int n_, int k_, Rng &r) : dtype(dtype_), n(n_), k(k_), seed(r.next()) {}
    const char *tname() const { return pg_dtype_name(dtype); }
    QWeight &get() {
        if (!q.empty()) return *this;
        rb = pg_dtype_row_bytes(dtype, k);
        const bool f8 = qdtype_fp8(dtype);
        const int G = f8 ? 0 : pg_dtype_block_elems(dtype);
        q.assign((size_t)n * rb, 0);
        deq.resize((size_t)n * k);
        if (f8) scales.resize((size_t)n);
        parallel_for(n, [&](int64_t row) {
            Rng rr(seed + (uint64_t)row);
            std::vector<float> w((size_t)k);
            const float mag = 0.02f * (float)(1 + row % 7); // rows of different ranges
            for (int j = 0; j < k; j++) w[(size_t)j] = rr.sym() * mag * (j % 61 == row % 61 ? 8.0f : 1.0f);
            uint8_t *qr = &q[(size_t)row * rb];
            if (f8) {
                pg_quantize_row_fp8(w.data(), k, qr, &scales[(size_t)row]);
            } else {
                pg_quantize_row_int4(w.data(), k, G, qr);
                // GPTQ v1's real zero 0 arrives as z = 16: a whole byte.
                const size_t bb = pg_dtype_block_bytes(dtype);
                for (int b = 0; b < k / G; b++)
                    if ((row + b) % 5 == 0) qr[(size_t)b * bb + 2] = 16;
            }
            pg_dequantize_row(dtype, qr, &deq[(size_t)row * k], k);
        });
        dq.up(q);
        if (f8) ds.up(scales);
        return *this;
    }
    const float *dscales() const { return qdtype_fp8(dtype) ? ds.as<float>() : nullptr; }
    double scale(int row) const { return qdtype_fp8(dtype) ? (double)scales[(size_t)row] : 1.0; }
};

// pg_cuda_qgemv against fp64 on the dequantized weight (and, for fp8,
// against the CPU twin's W8A8 numerics). Without `acc` the output starts as
// NaN (every entry must be written); columns in [n, ldo) must stay untouched.
static void test_qgemv(QWeight &wt, int m, int ldx, int ldo, bool acc, Rng &r) {
    const int n = wt.n, k = wt.k;
    char name[160];
    snprintf(name, sizeof name, "qgemv %s m=%d n=%d k=%d ldx=%d ldo=%d%s", wt.tname(), m, n, k, ldx, ldo,
             acc ? " accumulate" : "");
    if (!selected(name)) return;
    QWeight &W = wt.get();
    std::vector<uint16_t> x((size_t)m * ldx), o0((size_t)m * ldo);
    fill_bf16(x, r, 1.0f);
    if (acc) fill_bf16(o0, r, 1.0f);
    else o0.assign(o0.size(), POISON);
    DBuf dx, dout;
    dx.up(x);
    dout.up(o0);
    int rc = pg_cuda_qgemv(dout.p, ldo, dx.p, ldx, W.dq.p, W.dscales(), W.dtype, m, n, k, acc, nullptr);
    if (rc != 0) {
        report_bool(name, false, pg_err_msg());
        return;
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go(o0.size());
    dout.down(go);
    std::vector<double> ref((size_t)m * n), out;
    parallel_for((int64_t)m * n, [&](int64_t t) {
        const int i = (int)(t / n), j = (int)(t % n);
        const uint16_t *xr = &x[(size_t)i * ldx];
        const float *wr = &W.deq[(size_t)j * k];
        double s = 0;
        for (int e = 0; e < k; e++) s += (double)bf2f(xr[e]) * (double)wr[e];
        ref[(size_t)t] = s * W.scale(j) + (acc ? (double)bf2f(o0[(size_t)i * ldo + j]) : 0.0);
    });
    const bool outside_ok = gemv_out(go, o0, m, n, ldo, out);
    report(name, outside_ok ? max_rel(out, ref) : NAN, 4e-3, "max_rel");
    if (!qdtype_fp8(W.dtype) || acc) return;
    // The CPU twin (pg_cpu_matmul, quant numerics): x quantized per token.
    std::vector<double> ref8((size_t)m * n);
    std::vector<uint8_t> xq((size_t)m * k);
    std::vector<float> xs((size_t)m);
    for (int i = 0; i < m; i++) {
        std::vector<float> xf((size_t)k);
        for (int e = 0; e < k; e++) xf[(size_t)e] = bf2f(x[(size_t)i * ldx + e]);
        pg_quantize_row_fp8(xf.data(), k, &xq[(size_t)i * k], &xs[(size_t)i]);
    }
    parallel_for((int64_t)m * n, [&](int64_t t) {
        const int i = (int)(t / n), j = (int)(t % n);
        const uint8_t *xr = &xq[(size_t)i * k];
        const float *wr = &W.deq[(size_t)j * k];
        double s = 0;
        for (int e = 0; e < k; e++) s += (double)pg_fp8_e4m3_to_f32(xr[e]) * (double)wr[e];
        ref8[(size_t)t] = s * W.scale(j) * (double)xs[(size_t)i];
    });
    char nm[200];
    snprintf(nm, sizeof nm, "%s vs W8A8", name);
    report(nm, rel_err(out, ref8), 6e-2);
}

// pg_cuda_qdequant_bf16 bit for bit against pg_dequantize_row's values
// (times the row scale, an f32 product, for fp8) rounded to bf16.
static void test_qdequant(QWeight &wt) {
    char name[160];
    snprintf(name, sizeof name, "qgemm dequant %s n=%d k=%d (bit-exact)", wt.tname(), wt.n, wt.k);
    if (!selected(name)) return;
    QWeight &W = wt.get();
    const size_t ne = (size_t)W.n * W.k;
    DBuf dout(ne * 2);
    CK(cudaMemset(dout.p, 0xff, ne * 2));
    int rc = pg_cuda_qdequant_bf16(dout.p, W.dq.p, W.dscales(), W.dtype, W.n, W.k, nullptr);
    if (rc != 0) {
        report_bool(name, false, pg_err_msg());
        return;
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go(ne);
    dout.down(go);
    std::atomic<int64_t> bad{0};
    parallel_for(W.n, [&](int64_t row) {
        const float sc = (float)W.scale((int)row);
        int64_t b = 0;
        for (int j = 0; j < W.k; j++) {
            const size_t e = (size_t)row * W.k + j;
            const float v = qdtype_fp8(W.dtype) ? W.deq[e] * sc : W.deq[e];
            const uint16_t want = f2bf(v), got = go[e];
            const bool both_nan = v != v && (got & 0x7fff) > 0x7f80;
            if (got != want && !both_nan) b++;
        }
        bad += b;
    });
    char detail[96];
    snprintf(detail, sizeof detail, "%lld of %zu values differ", (long long)bad.load(), ne);
    report_bool(name, bad.load() == 0, detail);
}

// Every e4m3 code (NaN included) through the dequantizer, at four scales.
static void test_qdequant_codes() {
    const char *name = "qgemm dequant fp8_e4m3 every code (bit-exact)";
    if (!selected(name)) return;
    const int n = 4, k = 512;
    std::vector<uint8_t> q((size_t)n * k);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) q[(size_t)r * k + j] = (uint8_t)((j + 37 * r) & 255);
    const std::vector<float> sc = {1.0f, 0.37f, 1e-3f, 300.0f};
    DBuf dq, ds, dout((size_t)n * k * 2);
    dq.up(q);
    ds.up(sc);
    PK(pg_cuda_qdequant_bf16(dout.p, dq.p, ds.as<float>(), PG_DTYPE_FP8_E4M3, n, k, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go((size_t)n * k);
    dout.down(go);
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            const float v = pg_fp8_e4m3_to_f32(q[(size_t)r * k + j]) * sc[(size_t)r];
            const uint16_t got = go[(size_t)r * k + j];
            if (v != v ? (got & 0x7fff) <= 0x7f80 : got != f2bf(v)) bad++;
        }
    char detail[64];
    snprintf(detail, sizeof detail, "%d of %d values differ", bad, n * k);
    report_bool(name, bad == 0, detail);
}

// The large-batch path as the backend runs it: pg_cuda_qdequant_bf16 into a
// bf16 scratch, then pg_cuda_gemm_bf16. m > 64: every 8th row is checked.
static void test_qgemm(pg_cuda_gemm *g, DBuf &ws, QWeight &wt, int m, Rng &r) {
    const int n = wt.n, k = wt.k;
    char name[160];
    snprintf(name, sizeof name, "qgemm %s m=%d n=%d k=%d", wt.tname(), m, n, k);
    if (!selected(name)) return;
    QWeight &W = wt.get();
    std::vector<uint16_t> x((size_t)m * k), o0((size_t)m * n, POISON);
    fill_bf16(x, r, 1.0f);
    DBuf dx, dout, scratch((size_t)n * k * 2);
    dx.up(x);
    dout.up(o0);
    PK(pg_cuda_qdequant_bf16(scratch.p, W.dq.p, W.dscales(), W.dtype, n, k, nullptr));
    int rc = pg_cuda_gemm_bf16(g, dout.p, n, dx.p, k, scratch.p, m, n, k, 0, ws.p, ws.n, nullptr);
    if (rc != 0) {
        report_bool(name, false, pg_err_msg());
        return;
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go(o0.size());
    dout.down(go);
    const int step = m > 64 ? 8 : 1, mr = (m + step - 1) / step;
    std::vector<double> ref((size_t)mr * n), out((size_t)mr * n);
    parallel_for((int64_t)mr * n, [&](int64_t t) {
        const int i = (int)(t / n) * step, j = (int)(t % n);
        const uint16_t *xr = &x[(size_t)i * k];
        const float *wr = &W.deq[(size_t)j * k];
        double s = 0;
        for (int e = 0; e < k; e++) s += (double)bf2f(xr[e]) * (double)wr[e];
        ref[(size_t)t] = s * W.scale(j);
        out[(size_t)t] = bf2f(go[(size_t)i * n + j]);
    });
    report(name, max_rel(out, ref), 1e-2, "max_rel");
}

// Shapes and arguments the launchers decline (PG_EUNSUPP: the backend falls
// back to dequantize + GEMM) or reject (PG_EINVAL), without writing.
static void test_qgemv_refusals() {
    const char *name = "qgemv refusals";
    if (!selected(name)) return;
    DBuf o(4096), x(65536), w(65536), s(4096);
    CK(cudaMemset(o.p, 0x5a, o.n));
    const float *sc = s.as<float>();
    const Refusal c[] = {
        {"m 9", pg_cuda_qgemv(o.p, 16, x.p, 64, w.p, sc, PG_DTYPE_FP8_E4M3, 9, 16, 64, 0, nullptr), PG_EUNSUPP},
        {"fp8 k 24", pg_cuda_qgemv(o.p, 16, x.p, 24, w.p, sc, PG_DTYPE_FP8_E4M3, 1, 16, 24, 0, nullptr), PG_EUNSUPP},
        {"x misaligned", pg_cuda_qgemv(o.p, 16, (char *)x.p + 2, 64, w.p, sc, PG_DTYPE_FP8_E4M3, 1, 16, 64, 0, nullptr),
         PG_EUNSUPP},
        {"m 8 k 16384 (x over shared memory)",
         pg_cuda_qgemv(o.p, 16, x.p, 16384, w.p, sc, PG_DTYPE_INT4_G128, 8, 1, 16384, 0, nullptr), PG_EUNSUPP},
        {"fp8 without scales", pg_cuda_qgemv(o.p, 16, x.p, 64, w.p, nullptr, PG_DTYPE_FP8_E4M3, 1, 16, 64, 0, nullptr),
         PG_EINVAL},
        {"int4_g128 k 64", pg_cuda_qgemv(o.p, 16, x.p, 64, w.p, nullptr, PG_DTYPE_INT4_G128, 1, 16, 64, 0, nullptr),
         PG_EINVAL},
        {"bf16 weight", pg_cuda_qgemv(o.p, 16, x.p, 64, w.p, nullptr, PG_DTYPE_BF16, 1, 16, 64, 0, nullptr), PG_EINVAL},
        {"dequant int4_g64 k 96", pg_cuda_qdequant_bf16(o.p, w.p, nullptr, PG_DTYPE_INT4_G64, 4, 96, nullptr),
         PG_EINVAL},
        {"m 0", pg_cuda_qgemv(o.p, 16, x.p, 64, w.p, sc, PG_DTYPE_FP8_E4M3, 0, 16, 64, 0, nullptr), 0},
    };
    std::string detail;
    const bool ok = refusals_ok(o, c, detail);
    report_bool(name, ok, detail.c_str());
}

static void qgemv_tests(pg_cuda_gemm *g, DBuf &ws, Rng &r) {
    const int types[] = {PG_DTYPE_FP8_E4M3, PG_DTYPE_INT4_G128, PG_DTYPE_INT4_G64};
    // Llama-3-8B's shapes (n x k): Q|K|V-, gate/up- and down-sized, and a KV
    // projection; every m of the GEMV on the small one.
    const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {1024, 4096}};
    for (auto &sh : shapes)
        for (int t : types) {
            QWeight W(t, sh[0], sh[1], r); // freed after its cases
            for (int m : {1, 3, 8}) test_qgemv(W, m, W.k, W.n, false, r);
            if (sh[0] == 1024) {
                for (int m : {2, 4, 5, 6, 7}) test_qgemv(W, m, W.k, W.n, false, r);
                test_qgemv(W, 3, W.k + 64, W.n + 24, true, r); // strides past k and n, into a residual
                test_qgemv(W, 8, W.k, W.n, true, r);
            }
            test_qgemm(g, ws, W, 64, r);
            if (sh[1] == 4096 && sh[0] >= 4096) test_qgemm(g, ws, W, 512, r);
            test_qdequant(W);
        }
    // Odd group counts (SmolLM2's 576 = 9 groups of 64; 1152 = 9 of 128) and
    // 1536 = 12 of 128; fp8 at k = 576 (36 chunks of 16).
    const int odd[][3] = {{PG_DTYPE_INT4_G64, 1536, 576},
                          {PG_DTYPE_INT4_G128, 576, 1152},
                          {PG_DTYPE_INT4_G128, 576, 1536},
                          {PG_DTYPE_FP8_E4M3, 1536, 576}};
    for (auto &o : odd) {
        QWeight W(o[0], o[1], o[2], r);
        for (int m : {1, 3, 8}) test_qgemv(W, m, W.k, W.n, false, r);
        test_qgemv(W, 2, W.k, W.n, true, r);
        test_qgemm(g, ws, W, 64, r);
        test_qgemm(g, ws, W, 512, r);
        test_qdequant(W);
    }
    test_qdequant_codes();
    test_qgemv_refusals();
}

// --- PDL: the decode chain with and without programmatic dependent launch ---------------

// pg_cuda_l2_prefetch's arguments: a null range refused, empty and
// sub-16-byte ranges launch nothing, odd ends accepted (aligned inward), and
// a prefetch leaves the bytes as they were.
static void test_l2_prefetch_args() {
    const char *name = "l2 prefetch: arguments, odd ends, bytes unchanged";
    if (!selected(name)) return;
    std::vector<uint16_t> h(1 << 20);
    for (size_t i = 0; i < h.size(); i++) h[i] = (uint16_t)(i * 2654435761u >> 7);
    DBuf d;
    d.up(h);
    CK(cudaDeviceSynchronize());
    bool ok = pg_cuda_l2_prefetch(nullptr, 64, nullptr) == PG_EINVAL;
    ok &= pg_cuda_l2_prefetch(nullptr, 0, nullptr) == 0;
    ok &= pg_cuda_l2_prefetch((char *)d.p + 3, 10, nullptr) == 0;       // no whole 16 bytes: nothing
    ok &= pg_cuda_l2_prefetch((char *)d.p + 3, h.size() * 2 - 7, nullptr) == 0;
    ok &= pg_cuda_l2_prefetch(d.p, h.size() * 2, nullptr) == 0;
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> back(h.size());
    CK(cudaMemcpy(back.data(), d.p, back.size() * 2, cudaMemcpyDeviceToHost));
    ok &= back == h;
    report_bool(name, ok, ok ? "" : "a refusal, a launch error or changed bytes");
}

// A batch-1/2 decode step as the model runs it at m <= 2 (embed, then per
// layer gemv_rmsnorm QKV -> rope_kv_write -> decode attention (split, fused
// reduce) -> gemv O accumulate -> gemv_rmsnorm_silu gate/up -> gemv down
// accumulate, then the final add_rmsnorm + LM-head GEMV), every kernel
// launched back to back on one stream with no host sync. Llama-3-8B's
// attention shapes (hidden 4096, 32/8 heads of 128, block 16), a small ffn
// and vocabulary. Per repetition: fresh tokens, lengths (1..600, so split
// decode with its counters) and batch size; the step runs with PDL off, then
// on, and the outputs (residual, attention, logits, the KV cache) must be
// bit-identical: PDL changes only when kernels start, never what they read.
// The reference run is the register GEMV (kind 0) without PDL; the checked
// run uses GEMV kind `kind`, PDL on, and the weights-before-wait promise
// when `preload` (the weights are uploaded and synchronized before), and
// with `l2o` O's weight issued to the L2 after QKV (pg_cuda_l2_prefetch, a
// PDL kernel in the middle of the chain: its wait must keep RoPE after QKV).
static void test_pdl_chain(Rng &r, int kind, int preload, int l2o = 0) {
    char name[160];
    snprintf(name, sizeof name,
             "pdl chain: embed, norm+QKV, RoPE, attention, O, norm+gate/up, down x 4 layers, 50 reps, gemv kind %d%s%s",
             kind, preload ? " preload" : "", l2o ? " + O to L2" : "");
    if (!selected(name)) return;
    pg_cuda_pdl_set(1);
    const bool can = pg_cuda_pdl_enabled() != 0;
    pg_cuda_pdl_set(-1);
    if (!can) {
        printf("skip %-68s PDL needs sm_90+\n", name);
        return;
    }
    const int H = 4096, NH = 32, NKV = 8, HD = 128, BS = 16, FFN = 1024, VOCAB = 1000, L = 4, MAXM = 2,
              MAXCTX = 600, CTX_BUCKET = 640;
    const int QKV = (NH + 2 * NKV) * HD, QD = NH * HD, KVD = NKV * HD;
    const int bps = (CTX_BUCKET + BS - 1) / BS, n_blocks = MAXM * bps + 4;
    std::vector<uint16_t> wqkv((size_t)QKV * H), wo((size_t)H * QD), wgu((size_t)2 * FFN * H), wd((size_t)H * FFN),
        wlm((size_t)VOCAB * H), emb((size_t)64 * H), nw(H), kc((size_t)n_blocks * BS * KVD), vc(kc.size());
    fill_bf16_par(wqkv, r.next(), 0.03f);
    fill_bf16_par(wo, r.next(), 0.03f);
    fill_bf16_par(wgu, r.next(), 0.03f);
    fill_bf16_par(wd, r.next(), 0.05f);
    fill_bf16_par(wlm, r.next(), 0.03f);
    fill_bf16_par(emb, r.next(), 1.0f);
    fill_bf16_par(kc, r.next(), 1.0f);
    fill_bf16_par(vc, r.next(), 1.0f);
    for (auto &v : nw) v = f2bf(1.0f + 0.5f * r.sym());
    std::vector<float> inv(HD / 2);
    for (int j = 0; j < HD / 2; j++) inv[j] = (float)(1.0 / pow(500000.0, 2.0 * j / HD));
    DBuf dwqkv, dwo, dwgu, dwd, dwlm, demb, dnw, dkc, dvc, dinv;
    dwqkv.up(wqkv), dwo.up(wo), dwgu.up(wgu), dwd.up(wd), dwlm.up(wlm), demb.up(emb), dnw.up(nw), dinv.up(inv);
    dkc.up(kc), dvc.up(vc);
    // (cudaMemcpy from pageable memory may return before its DMA lands, and
    // the non-blocking stream below does not wait for the legacy stream.)
    CK(cudaDeviceSynchronize());
    DBuf dx((size_t)MAXM * H * 2), dqkv((size_t)MAXM * QKV * 2), dattn((size_t)MAXM * QD * 2),
        dh((size_t)MAXM * FFN * 2), dlg_in((size_t)MAXM * H * 2), dlog((size_t)MAXM * VOCAB * 2), dtok(64), dpos(64),
        dslots(64), dlens(64), dbt((size_t)MAXM * bps * 4);
    const size_t ws_bytes = pg_cuda_decode_workspace_size(MAXM, NH, NKV, HD, CTX_BUCKET);
    DBuf ws(ws_bytes);
    const pg_kv_shape kvs = {n_blocks, BS, NKV, HD, PG_KV_BF16};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const float eps = 1e-5f, scale = 1.0f / sqrtf((float)HD);

    struct Out {
        std::vector<uint16_t> x, attn, logits, kc, vc;
    };
    auto run = [&](int m, Out &o, bool prefetch) {
        PK(pg_cuda_embed(dx.p, demb.p, dtok.as<int32_t>(), m, H, 64, st));
        for (int l = 0; l < L; l++) {
            PK(pg_cuda_gemv_rmsnorm_bf16(dqkv.p, QKV, dx.p, H, dnw.p, eps, dwqkv.p, m, QKV, H, st));
            if (prefetch) PK(pg_cuda_l2_prefetch(dwo.p, wo.size() * 2, st));
            uint16_t *q = dqkv.as<uint16_t>();
            PK(pg_cuda_rope_kv_write(q, QKV, q + QD, QKV, q + QD + KVD, QKV, dpos.as<int32_t>(),
                                     dslots.as<int32_t>(), m, NH, dinv.as<float>(), dkc.p, dvc.p, kvs, st));
            PK(pg_cuda_paged_decode_attention(dattn.p, q, QKV, dkc.p, dvc.p, kvs, dbt.as<int32_t>(), bps,
                                              dlens.as<int32_t>(), m, NH, scale, CTX_BUCKET, ws.p, ws_bytes, st));
            PK(pg_cuda_gemv_bf16(dx.p, H, dattn.p, QD, dwo.p, m, H, QD, 1, st));
            PK(pg_cuda_gemv_rmsnorm_silu_bf16(dh.p, FFN, dx.p, H, dnw.p, eps, dwgu.p, m, FFN, H, st));
            PK(pg_cuda_gemv_bf16(dx.p, H, dh.p, FFN, dwd.p, m, H, FFN, 1, st));
        }
        PK(pg_cuda_add_rmsnorm(dlg_in.p, dx.p, nullptr, dnw.p, m, H, eps, st));
        PK(pg_cuda_gemv_bf16(dlog.p, VOCAB, dlg_in.p, H, dwlm.p, m, VOCAB, H, 0, st));
        CK(cudaStreamSynchronize(st));
        o.x.resize((size_t)m * H), o.attn.resize((size_t)m * QD), o.logits.resize((size_t)m * VOCAB);
        o.kc.resize(kc.size()), o.vc.resize(vc.size());
        CK(cudaMemcpy(o.x.data(), dx.p, o.x.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(o.attn.data(), dattn.p, o.attn.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(o.logits.data(), dlog.p, o.logits.size() * 2, cudaMemcpyDeviceToHost));
        dkc.down(o.kc);
        dvc.down(o.vc);
    };
    int bad = 0, finite_bad = 0, split_reps = 0;
    std::string first_bad;
    for (int rep = 0; rep < 50; rep++) {
        const int m = 1 + rep % 2;
        std::vector<int32_t> tok(m), pos(m), slots(m), lens(m), bt((size_t)m * bps, 0x3fffffff);
        std::vector<int32_t> perm(n_blocks);
        std::iota(perm.begin(), perm.end(), 0);
        for (int i = n_blocks - 1; i > 0; i--) std::swap(perm[i], perm[r.below(i + 1)]);
        int at = 0;
        for (int s = 0; s < m; s++) {
            tok[s] = r.below(64);
            lens[s] = 1 + r.below(MAXCTX);
            pos[s] = lens[s] - 1;
            for (int b = 0; b < (lens[s] + BS - 1) / BS; b++) bt[(size_t)s * bps + b] = perm[at++];
            slots[s] = bt[(size_t)s * bps + pos[s] / BS] * BS + pos[s] % BS;
            split_reps += lens[s] > 64;
        }
        dtok.up(tok), dpos.up(pos), dslots.up(slots), dlens.up(lens), dbt.up(bt);
        // The KV cache as it was before the step, for both runs.
        dkc.up(kc), dvc.up(vc);
        CK(cudaDeviceSynchronize());
        Out off, on;
        pg_cuda_pdl_set(0);
        pg_cuda_gemv_kernel_set(0);
        pg_cuda_gemv_preload_set(0);
        run(m, off, false);
        dkc.up(kc), dvc.up(vc);
        CK(cudaDeviceSynchronize());
        pg_cuda_pdl_set(1);
        pg_cuda_gemv_kernel_set(kind);
        pg_cuda_gemv_preload_set(preload);
        run(m, on, l2o != 0);
        const bool same = off.x == on.x && off.attn == on.attn && off.logits == on.logits && off.kc == on.kc &&
                          off.vc == on.vc;
        bool finite = true;
        for (uint16_t v : off.logits) finite &= (v & 0x7f80) != 0x7f80;
        if (!same) {
            if (!bad) {
                char b[160];
                snprintf(b, sizeof b, "rep %d (m=%d): x %d attn %d logits %d kc %d vc %d", rep, m, off.x == on.x,
                         off.attn == on.attn, off.logits == on.logits, off.kc == on.kc, off.vc == on.vc);
                first_bad = b;
            }
            bad++;
        }
        finite_bad += !finite;
    }
    pg_cuda_pdl_set(-1);
    pg_cuda_gemv_kernel_set(-1);
    pg_cuda_gemv_preload_set(0);
    CK(cudaStreamDestroy(st));
    char detail[256];
    snprintf(detail, sizeof detail, "%d of 50 reps differ%s%s; %d reps with non-finite logits; %d sequences > 64 keys",
             bad, bad ? ", first: " : "", first_bad.c_str(), finite_bad, split_reps);
    report_bool(name, bad == 0 && finite_bad == 0, detail);
}

// --- sampling --------------------------------------------------------------------------

enum LogitKind { NORMAL1, NORMAL3, PEAKED, TIES_BF16, CONSTANT, N_KINDS };
static const char *kind_name[] = {"normal(0,1)", "normal(0,3)", "peaked", "bf16-ties", "constant"};

static void test_sampling(int n, int vocab, int kind, bool bf16_logits, Rng &r) {
    char name[160];
    snprintf(name, sizeof name, "sample n=%d vocab=%d %s %s", n, vocab, kind_name[kind], bf16_logits ? "bf16" : "f32");
    if (!selected(name)) return;
    // Logits: the GPU gets f32 or bf16; the CPU the same values as f32.
    std::vector<float> lf((size_t)n * vocab);
    std::vector<uint16_t> lb(lf.size());
    for (int s = 0; s < n; s++)
        for (int i = 0; i < vocab; i++) {
            double v = 0;
            switch (kind) {
            case NORMAL1: v = r.normal(); break;
            case NORMAL3: v = 3 * r.normal(); break;
            case PEAKED: v = r.normal() + (i % 97 == s % 97 ? 12.0 : 0.0); break;
            case TIES_BF16: v = 2 * r.normal(); break;
            case CONSTANT: v = 0.5; break;
            }
            float f = (float)v;
            if (bf16_logits || kind == TIES_BF16) f = bf2f(f2bf(f));
            lf[(size_t)s * vocab + i] = f;
            lb[(size_t)s * vocab + i] = f2bf(f);
        }
    // Parameters: a rotation through the rules, random seeds and counters.
    std::vector<pg_sampling_params> sps(n);
    std::vector<pg_plan_seq> seqs(n);
    std::vector<pg_sample_params> gp(n);
    std::vector<int32_t> tokens;
    std::vector<std::vector<int32_t>> hist(n);
    for (int s = 0; s < n; s++) {
        pg_sampling_params &p = sps[s];
        memset(&p, 0, sizeof p);
        p.temperature = 1.0f;
        p.top_p = 1.0f;
        p.repetition_penalty = 1.0f;
        p.logprobs = -1;
        p.n = 1;
        p.max_tokens = 16;
        switch (s % 12) {
        case 0: p.temperature = 0.0f; break;
        case 1: break;
        case 2: p.temperature = 0.7f; p.top_k = 50; break;
        case 3: p.top_p = 0.9f; break;
        case 4: p.temperature = 1.3f; p.top_k = 1000; p.top_p = 0.5f; break;
        case 5: p.min_p = 0.05f; break;
        case 6: p.top_k = 1; break;
        case 7: p.temperature = 0.8f; p.top_k = 40; p.top_p = 0.95f; p.min_p = 0.1f; break;
        case 8: p.repetition_penalty = 1.3f; p.presence_penalty = 0.5f; p.frequency_penalty = 0.25f; break;
        case 9: p.temperature = 0.0f; p.repetition_penalty = 1.5f; break;
        case 10: p.temperature = 2.0f; p.top_k = 5; break;
        case 11: p.top_p = 0.3f; p.min_p = 0.2f; break;
        }
        if (s % 4 == 1) p.logprobs = (s / 4) % 3 == 0 ? 0 : ((s / 4) % 3 == 1 ? 5 : 20);
        // Every 9th row is forced (prompt logprobs): scored, not sampled.
        const bool forced = s % 9 == 4;
        if (forced) p.logprobs = (s / 9) % 3 == 0 ? 0 : ((s / 9) % 3 == 1 ? 5 : 20);
        // History: prompt then output, with repeats.
        int np = 1 + r.below(50), no = r.below(30);
        for (int i = 0; i < np + no; i++) hist[s].push_back(r.below(4) == 0 && i ? hist[s][r.below(i)] : r.below(vocab));
        pg_plan_seq &q = seqs[s];
        memset(&q, 0, sizeof q);
        q.seq_id = s;
        q.sample = true;
        q.sp = &p;
        q.history = hist[s].data();
        q.n_history = np + no;
        q.n_prompt = np;
        q.n_generated = no + r.below(1000);
        q.rng_seed = r.next();
        q.eos_id = -1;
        q.mask_eos = false;
        if (s % 5 == 2) { // min_tokens not reached: EOS and stop ids banned
            q.mask_eos = true;
            q.eos_id = (int)(r.next() % (uint64_t)vocab);
            p.n_stop_ids = 2;
            p.stop_ids[0] = (int)(r.next() % (uint64_t)vocab);
            p.stop_ids[1] = vocab + 5; // out of range: ignored by both
        }
        pg_sample_params &g = gp[s];
        memset(&g, 0, sizeof g);
        g.temperature = p.temperature;
        g.top_p = p.top_p;
        g.min_p = p.min_p;
        g.repetition_penalty = p.repetition_penalty;
        g.presence_penalty = p.presence_penalty;
        g.frequency_penalty = p.frequency_penalty;
        g.top_k = p.top_k;
        g.logprobs = p.logprobs;
        if (forced) {
            g.forced = 1;
            // Half the time the row's best token (rank 1), else any.
            int best = 0;
            for (int i = 1; i < vocab; i++)
                if (lf[(size_t)s * vocab + i] > lf[(size_t)s * vocab + best]) best = i;
            g.forced_token = r.below(2) ? best : r.below(vocab);
        }
        g.seed = q.rng_seed;
        g.n_generated = q.n_generated;
        g.hist_offset = (int32_t)tokens.size();
        g.n_history = q.n_history;
        g.n_prompt = q.n_prompt;
        tokens.insert(tokens.end(), hist[s].begin(), hist[s].end());
        g.ban_offset = (int32_t)tokens.size();
        if (q.mask_eos) {
            tokens.push_back(q.eos_id);
            for (int i = 0; i < p.n_stop_ids; i++) tokens.push_back(p.stop_ids[i]);
            g.n_ban = 1 + p.n_stop_ids;
        }
        if (s % 6 == 4) { // logit bias: +100 on one token, -100 on another, small ones
            g.bias_offset = (int32_t)tokens.size();
            g.n_bias = 4;
            const float vals[4] = {100.0f, -100.0f, 2.5f, -0.75f};
            for (int k = 0; k < 4; k++) {
                tokens.push_back((int)(r.next() % (uint64_t)vocab));
                int32_t bits;
                memcpy(&bits, &vals[k], sizeof bits);
                tokens.push_back(bits);
            }
        }
        if (s % 7 == 3) { // structured outputs: about a third of the tokens allowed
            g.mask_offset = (int32_t)tokens.size();
            g.n_mask = (vocab + 31) / 32;
            for (int w = 0; w < g.n_mask; w++) {
                uint32_t m = (uint32_t)r.next() & (uint32_t)r.next();
                m |= (uint32_t)r.next() & (uint32_t)r.next() & (uint32_t)r.next();
                if (w == 0) m |= 1u << 7; // never empty
                tokens.push_back((int32_t)m);
            }
        }
    }
    if (tokens.empty()) tokens.push_back(0);
    // GPU.
    DBuf dl, dp, dt, dout((size_t)n * sizeof(pg_sample_out)), ws(pg_cuda_sample_workspace_size(n, vocab));
    if (bf16_logits) dl.up(lb);
    else dl.up(lf);
    dp.up(gp);
    dt.up(tokens);
    CK(cudaMemset(dout.p, 0xFF, dout.n));
    PK(pg_cuda_sample(dout.as<pg_sample_out>(), dl.p, bf16_logits ? PG_CUDA_BF16 : PG_CUDA_F32, vocab, n, vocab,
                      dp.as<pg_sample_params>(), dt.as<int32_t>(), ws.p, ws.n, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<pg_sample_out> go(n);
    dout.down(go);
    // CPU, on copies (it modifies logits in place).
    pg_sampler *cpu = nullptr;
    if (pg_sampler_create(vocab, &cpu) != 0) abort();
    int tok_bad = 0, lp_bad = 0;
    double worst_lp = 0;
    for (int s = 0; s < n; s++) {
        std::vector<float> row(lf.begin() + (size_t)s * vocab, lf.begin() + (size_t)(s + 1) * vocab);
        pg_sample_out co;
        pg_sampler_sample(cpu, &gp[s], tokens.data(), row.data(), &co);
        const pg_sample_out &o = go[s];
        if (gp[s].n_mask > 0 && !gp[s].forced) { // a masked token is never sampled
            uint32_t w = (uint32_t)tokens[gp[s].mask_offset + (o.token >> 5)];
            if (!(w >> (o.token & 31) & 1u)) {
                tok_bad++;
                printf("     seq %d: gpu sampled masked token %d\n", s, o.token);
            }
        }
        if (co.token != o.token) {
            tok_bad++;
            if (tok_bad <= 5)
                printf("     seq %d (rule %d): cpu token %d, gpu token %d\n", s, s % 12, co.token, o.token);
        }
        if (sps[s].logprobs >= 0) {
            double d = fabs((double)co.logprob - o.logprob);
            bool ok = d <= 1e-4 && co.n_top == o.n_top && co.rank == o.rank; // ranks: exact comparisons
            for (int i = 0; ok && i < co.n_top; i++) {
                ok &= co.top_ids[i] == o.top_ids[i];
                double e = fabs((double)co.top_logprobs[i] - o.top_logprobs[i]);
                d = std::max(d, e);
                ok &= e <= 1e-4;
            }
            worst_lp = std::max(worst_lp, d);
            if (!ok) {
                lp_bad++;
                if (lp_bad <= 3)
                    printf("     seq %d: logprob cpu %.6f gpu %.6f, n_top %d/%d\n", s, co.logprob, o.logprob, co.n_top,
                           o.n_top);
            }
        }
    }
    pg_sampler_free(cpu);
    char d[160];
    snprintf(d, sizeof d, "%d/%d tokens differ from kernels/cpu/sampling.c, %d logprob rows off (max |diff| %.1e)", tok_bad, n,
             lp_bad, worst_lp);
    report_bool(name, tok_bad == 0 && lp_bad == 0, d);
}

// Seeded sampling is reproducible: same (seed, counter) -> same token, and
// the empirical distribution of plain sampling follows softmax.
static void test_sampling_distribution(Rng &r) {
    const char *name = "sample distribution vocab=8 T=1 (4096 counters)";
    if (!selected(name)) return;
    const int n = 4096, vocab = 8;
    std::vector<float> lf((size_t)n * vocab);
    const float base[vocab] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 1.5f, 0.25f, -3.0f};
    for (int s = 0; s < n; s++)
        for (int i = 0; i < vocab; i++) lf[(size_t)s * vocab + i] = base[i];
    std::vector<pg_sample_params> gp(n);
    for (int s = 0; s < n; s++) {
        memset(&gp[s], 0, sizeof gp[s]);
        gp[s].temperature = 1.0f;
        gp[s].top_p = 1.0f;
        gp[s].repetition_penalty = 1.0f;
        gp[s].logprobs = -1;
        gp[s].seed = 1234;
        gp[s].n_generated = s;
    }
    DBuf dl, dp, dout((size_t)n * sizeof(pg_sample_out)), ws(pg_cuda_sample_workspace_size(n, vocab));
    dl.up(lf);
    dp.up(gp);
    PK(pg_cuda_sample(dout.as<pg_sample_out>(), dl.p, PG_CUDA_F32, vocab, n, vocab, dp.as<pg_sample_params>(),
                      nullptr, ws.p, ws.n, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<pg_sample_out> go(n);
    dout.down(go);
    double z = 0, cnt[vocab] = {0};
    for (int i = 0; i < vocab; i++) z += exp(base[i]);
    for (int s = 0; s < n; s++) cnt[go[s].token]++;
    double chi2 = 0;
    for (int i = 0; i < vocab; i++) {
        double e = n * exp(base[i]) / z;
        chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    // 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
    report(name, chi2, 24.3, "chi2");
}

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
