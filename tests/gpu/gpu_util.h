// tests/gpu/gpu_util.h - host helpers shared by the GPU test and benchmarks
// (C++ compiled by nvcc; header-only).
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "kernels/cuda/cuda_ops.h"
}

// A CUDA runtime call that must succeed: a failure here is a broken device
// or a test bug, so it aborts with the call and the reason.
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

// A pg_cuda_* launcher that must succeed.
#define PK(call)                                                                              \
    do {                                                                                      \
        int rc_ = (call);                                                                     \
        if (rc_ != 0) {                                                                       \
            fprintf(stderr, "%s:%d: %s: rc %d: %s\n", __FILE__, __LINE__, #call, rc_, pg_err_msg()); \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

// The start of every GPU program: line-buffered stdout, then either the
// device's description (true; also into dev[cap] when given) or "skipped:
// no CUDA device" (false: the caller exits 77, the conventional skip).
static inline bool gpu_announce(char *dev = nullptr, size_t cap = 0) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (pg_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return false;
    }
    char name[256];
    PK(pg_cuda_device_describe(name, sizeof name));
    printf("device: %s\n", name);
    if (dev && cap) snprintf(dev, cap, "%s", name);
    return true;
}

// bf16 <-> f32 on the host, round to nearest even (as __float2bfloat16).
static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// xorshift64*: fast, seeded, good enough for test data.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
    uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 0x2545f4914f6cdd1dull;
    }
    double uni() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); } // [0, 1)
    float sym() { return (float)(2.0 * uni() - 1.0); }                            // [-1, 1)
    int below(int n) { return (int)(uni() * n); }
    double normal() {
        double u1 = uni(), u2 = uni();
        if (u1 < 1e-300) u1 = 1e-300;
        return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    }
};

static inline void fill_bf16(std::vector<uint16_t> &v, Rng &r, float scale) {
    for (auto &x : v) x = f2bf(r.sym() * scale);
}

// Runs f(i) for i < n on all host cores (the references are fp64 loops).
template <typename F> static void parallel_for(int64_t n, F f) {
    unsigned nt = std::thread::hardware_concurrency();
    if (nt < 1) nt = 1;
    if (nt > 64) nt = 64;
    std::atomic<int64_t> next{0};
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nt; t++)
        th.emplace_back([&] {
            for (int64_t i; (i = next.fetch_add(1)) < n;) f(i);
        });
    for (auto &t : th) t.join();
}

// A device buffer that frees itself.
struct DBuf {
    void *p = nullptr;
    size_t n = 0;
    DBuf() {}
    explicit DBuf(size_t bytes) { alloc(bytes); }
    void alloc(size_t bytes) {
        if (p) CK(cudaFree(p));
        n = bytes;
        CK(cudaMalloc(&p, bytes ? bytes : 1));
    }
    ~DBuf() {
        if (p) cudaFree(p);
    }
    DBuf(const DBuf &) = delete;
    DBuf &operator=(const DBuf &) = delete;
    template <typename T> T *as() const { return (T *)p; }
    template <typename T> void up(const std::vector<T> &v) {
        if (n < v.size() * sizeof(T)) alloc(v.size() * sizeof(T));
        CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    template <typename T> void down(std::vector<T> &v) const {
        CK(cudaMemcpy(v.data(), p, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
    }
};

// ||a - b|| / ||b||, NaN when any output is NaN (so a NaN never passes).
static inline double rel_err(const std::vector<double> &out, const std::vector<double> &ref) {
    double d = 0, r = 0;
    for (size_t i = 0; i < out.size(); i++) {
        if (!(out[i] == out[i])) return NAN;
        d += (out[i] - ref[i]) * (out[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

// max |out - ref| / max |ref|, NaN when any output is NaN.
static inline double max_rel(const std::vector<double> &out, const std::vector<double> &ref) {
    double d = 0, mx = 0;
    for (size_t i = 0; i < out.size(); i++) {
        if (!(out[i] == out[i])) return NAN;
        d = std::max(d, fabs(out[i] - ref[i]));
        mx = std::max(mx, fabs(ref[i]));
    }
    return mx > 0 ? d / mx : d;
}

// out (m x n of a [m][ldo] bf16 buffer) -> doubles; false when a column in
// [n, ldo) differs from `before` (written outside the product).
static inline bool gemv_out(const std::vector<uint16_t> &go, const std::vector<uint16_t> &before, int m, int n,
                            int ldo, std::vector<double> &out) {
    bool ok = true;
    out.resize((size_t)m * n);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldo; j++) {
            const size_t a = (size_t)i * ldo + j;
            if (j < n) out[(size_t)i * n + j] = bf2f(go[a]);
            else ok &= go[a] == before[a];
        }
    return ok;
}

// The reference input of the fused RMSNorm GEMVs: the m rows of x ([m][ldx]
// bf16, k used) normalized in fp64 with weight nw ([k] bf16), each value
// rounded to bf16 as the kernels keep them; [m][k].
static inline std::vector<double> norm_rows_ref(const std::vector<uint16_t> &x, int ldx,
                                                const std::vector<uint16_t> &nw, int m, int k, float eps) {
    std::vector<double> xn((size_t)m * k);
    for (int i = 0; i < m; i++) {
        double ss = 0;
        for (int e = 0; e < k; e++) ss += (double)bf2f(x[(size_t)i * ldx + e]) * bf2f(x[(size_t)i * ldx + e]);
        const double rs = 1.0 / sqrt(ss / k + eps);
        for (int e = 0; e < k; e++)
            xn[(size_t)i * k + e] = bf2f(f2bf((float)(bf2f(x[(size_t)i * ldx + e]) * rs * bf2f(nw[(size_t)e]))));
    }
    return xn;
}

// A launcher call that must be declined or rejected: its rc and the rc wanted.
struct Refusal {
    const char *what;
    int rc, want;
};

// A refusal test's verdict: true when every rc is as wanted and o (memset to
// `fill` before the calls) was not written; detail says so, or what failed.
template <size_t N>
static bool refusals_ok(const DBuf &o, const Refusal (&c)[N], std::string &detail, uint8_t fill = 0x5a) {
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> ob(o.n);
    o.down(ob);
    bool untouched = true;
    for (uint8_t v : ob) untouched &= v == fill;
    std::string bad;
    for (auto &e : c)
        if (e.rc != e.want) bad += std::string(bad.empty() ? "" : ", ") + e.what + " rc " + std::to_string(e.rc);
    if (!untouched) bad += std::string(bad.empty() ? "" : ", ") + "output written";
    detail = bad.empty() ? "all declined or rejected, nothing written" : bad;
    return bad.empty();
}
