// tests/gpu/kernels_test_common.cuh - the shared host side of the kernel
// tests: fp8 e4m3 encode/decode on the host (e4m3_to_f, f_to_e4m3,
// e4m3_order), the paged KV cache fixture (Paged) and the fp64 attention
// reference ref_attend that the decode and prefill cases check against, and
// the FP8 weights with per-channel scales and their fp64 reference
// (make_fp8_weight, e4m3_dot) that the quantized GEMV / GEMM cases share.
// Part of tests/gpu/test_cuda_kernels.cu and tests/gpu/test_cuda_fp8_gemm.cu,
// not a header of its own: each driver #includes it once, after
// tests/gpu/gpu_util.h and kernels/dtype.h, whose names it uses. Its
// functions are static inline so that a driver that uses only some of them
// builds without unused-function warnings.
#pragma once

#include <numeric> // std::iota (Paged)

// --- fp8 e4m3 on the host ----------------------------------------------------------------

// e4m3 (bias 7, no infinities, 0x7F/0xFF NaN, max 448) -> float, exact.
static inline float e4m3_to_f(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return (b & 0x80) ? -v : v;
}
// float -> e4m3, round to nearest even, saturating to +-448 (NaN -> 0x7F),
// as the device's cvt.rn.satfinite.e4m3x2.f32.
static inline uint8_t f_to_e4m3(float f) {
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
static inline int e4m3_order(uint8_t b) { return (b & 0x80) ? -(int)(b & 0x7F) : (int)(b & 0x7F); }

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
static inline void ref_attend(const Paged &pc, int s, int kvh, const uint16_t *q, int n_keys, double scale,
                              double *out) {
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

// --- FP8 e4m3 weights with per-channel scales ------------------------------------------

// Row `row` of a random weight before quantization: rows of different ranges
// (0.02 to 0.14), and one column in 61 eight times larger, an outlier that
// sets the row's scale. Seeded per row, so rows can be made in parallel.
static inline void random_weight_row(float *w, int64_t row, int k, uint64_t seed) {
    Rng rr(seed + (uint64_t)row);
    const float mag = 0.02f * (float)(1 + row % 7); // rows of different ranges
    for (int j = 0; j < k; j++) w[j] = rr.sym() * mag * (j % 61 == row % 61 ? 8.0f : 1.0f);
}

// An FP8 weight [n][k] with one f32 scale per output channel (row): random
// rows quantized on the host with pg_quantize_row_fp8 (kernels/dtype.c, the
// bytes the CPU backend runs) into q and scales, then uploaded to dq and ds.
static inline void make_fp8_weight(int n, int k, uint64_t seed, std::vector<uint8_t> &q, std::vector<float> &scales,
                                   DBuf &dq, DBuf &ds) {
    q.assign((size_t)n * k, 0);
    scales.assign((size_t)n, 0.0f);
    parallel_for(n, [&](int64_t row) {
        std::vector<float> w((size_t)k);
        random_weight_row(w.data(), row, k, seed);
        pg_quantize_row_fp8(w.data(), k, &q[(size_t)row * k], &scales[(size_t)row]);
    });
    dq.up(q);
    ds.up(scales);
}

// Each e4m3 code's value (pg_fp8_e4m3_to_f32), a table for the references'
// inner loops: the weights of one case take billions of lookups.
static inline const float *e4m3_values() {
    static const std::vector<float> t = [] {
        std::vector<float> v(256);
        for (int c = 0; c < 256; c++) v[(size_t)c] = pg_fp8_e4m3_to_f32((uint8_t)c);
        return v;
    }();
    return t.data();
}

// The fp64 reference's sum over k of x times an e4m3 row's values, before
// any scale; x as bf16 bits, f32 or f64 (the scales are applied by the
// caller, in its own order).
static inline double ref_f64(uint16_t bf16) { return (double)bf2f(bf16); }
static inline double ref_f64(float f) { return (double)f; }
static inline double ref_f64(double d) { return d; }
template <typename X> static inline double e4m3_dot(const X *x, const uint8_t *w, int k) {
    const float *val = e4m3_values();
    double s = 0;
    for (int t = 0; t < k; t++) s += ref_f64(x[t]) * (double)val[w[t]];
    return s;
}
