// tests/gpu/kernels_test_gemv.cuh - the bf16 GEMM (pg_cuda_gemm_bf16), the
// GEMV kernels for small m (each kind, the fused-norm variants, refusals)
// and the quantized weights, FP8 e4m3 per row and int4 groups (qgemv,
// dequant, qgemm), with weights from kernels/dtype.c's quantizers, against
// fp64 references. Part of tests/gpu/test_cuda_kernels.cu, not a header of
// its own: the driver #includes it once, in order, where this code used to
// be, and it uses what the driver and the headers before it define.
#pragma once

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
        deq.resize((size_t)n * k);
        if (qdtype_fp8(dtype)) {
            make_fp8_weight(n, k, seed, q, scales, dq, ds); // kernels_test_common.cuh; rb == k
        } else {
            // The same random rows as fp8's, to int4 groups.
            const int G = pg_dtype_block_elems(dtype);
            q.assign((size_t)n * rb, 0);
            parallel_for(n, [&](int64_t row) {
                std::vector<float> w((size_t)k);
                random_weight_row(w.data(), row, k, seed);
                uint8_t *qr = &q[(size_t)row * rb];
                pg_quantize_row_int4(w.data(), k, G, qr);
                // GPTQ v1's real zero 0 arrives as z = 16: a whole byte.
                const size_t bb = pg_dtype_block_bytes(dtype);
                for (int b = 0; b < k / G; b++)
                    if ((row + b) % 5 == 0) qr[(size_t)b * bb + 2] = 16;
            });
            dq.up(q);
        }
        parallel_for(n, [&](int64_t row) {
            pg_dequantize_row(dtype, &q[(size_t)row * rb], &deq[(size_t)row * k], k);
        });
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
        // x's e4m3 codes times the weight's values: the same products, summed in the same order.
        const double s = e4m3_dot(&W.deq[(size_t)j * k], &xq[(size_t)i * k], k);
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
