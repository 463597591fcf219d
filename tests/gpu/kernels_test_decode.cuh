// tests/gpu/kernels_test_decode.cuh - decode attention: the paged decode
// kernels (v1 and v3 from bench/cuda/, and the library's versions) over
// random contexts, bf16, fp8 and scaled-fp8 caches and the edge cases,
// against ref_attend (test_decode, decode_tests). Part of
// tests/gpu/test_cuda_kernels.cu, not a header of its own: the driver
// #includes it once, in order, where this code used to be, and it uses what
// the driver and the headers before it define.
#pragma once

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
    // bench/cuda/'s v1 and v3 take no windows, caps or head_dim 256.
    const bool lib_only = window > 0 || cap > 0 || c.hd > 128;
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
