// tests/gpu/kernels_test_prefill.cuh - prefill attention (test_prefill,
// prefill_tests), sliding windows and soft-capped scores through decode and
// prefill (window_tests), and the RoPE + paged KV write that fills the
// cache attention reads (test_rope, bf16 and fp8), against CPU references.
// Part of tests/gpu/test_cuda_kernels.cu, not a header of its own: the
// driver #includes it once, in order, where this code used to be, and it
// uses what the driver and the headers before it define.
#pragma once

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
    // v2 holds 32 rows' outputs a warp and is built up to head_dim 128: it
    // refuses 256, which v1 takes, and the default (version 0 here) picks.
    for (int version = 0; version <= 2; version++) {
        char nm[200];
        snprintf(nm, sizeof nm, version ? "%s v%d" : "%s default", name, version);
        CK(cudaMemset(dout.p, 0xFF, dout.n));
        if (version == 2 && hd > 128) {
            int rc = pg_cuda_paged_prefill_attention_v(2, dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(),
                                                       pc.dbt.as<int32_t>(), pc.bt_stride, dcu.as<int32_t>(),
                                                       dsp.as<int32_t>(), n, H, (float)scale, max_q, nullptr);
            report_bool(nm, rc == PG_EUNSUPP, rc == PG_EUNSUPP ? "refuses head_dim 256: PG_EUNSUPP" : "wrong return code");
            continue;
        }
        if (version == 0) {
            if (hd <= 128) continue; // the default is v2, run below
            PK(pg_cuda_paged_prefill_attention(dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(),
                                               pc.dbt.as<int32_t>(), pc.bt_stride, dcu.as<int32_t>(),
                                               dsp.as<int32_t>(), n, H, (float)scale, max_q, nullptr));
        } else {
            PK(pg_cuda_paged_prefill_attention_v(version, dout.p, dq.p, q_stride, pc.dk.p, pc.dv.p, pc.shape(),
                                                 pc.dbt.as<int32_t>(), pc.bt_stride, dcu.as<int32_t>(),
                                                 dsp.as<int32_t>(), n, H, (float)scale, max_q, nullptr));
        }
        CK(cudaDeviceSynchronize());
        dout.down(out);
        for (size_t i = 0; i < out.size(); i++) o[i] = bf2f(out[i]);
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

// Head dimension 256 (Gemma 3 270M, 1B, 4B, 12B) through every library
// kernel: decode v4 (groups <= 8) and v2 (larger groups, and the explicit
// version), prefill v1 (the default there; v2 refuses it), bf16, fp8 and
// scaled fp8 caches, with and without sliding windows and soft-caps. The
// shapes are the released models' heads: 4/1 (270M, 1B), 8/4 (4B), 16/8
// (12B), and a group of 16 for v2.
static void hd256_tests(Rng &r) {
    struct W { int window; float cap; };
    const std::vector<DecodeCase> dec = {
        {"hd256 len1", {1}, 4, 1, 256, 16, 1.0f},
        {"hd256 edges", {1, 15, 16, 17, 63, 64, 65, 127, 129, 200}, 4, 1, 256, 16, 2.0f},
        {"hd256 gqa2", rand_lens(r, 9, 1, 3000), 16, 8, 256, 16, 2.0f},
        {"hd256 gqa2", rand_lens(r, 5, 1, 2000), 8, 4, 256, 32, 3.0f},
        {"hd256 gqa16", rand_lens(r, 4, 1, 900), 16, 1, 256, 16, 2.0f}, // v2 (group > 8)
        {"hd256 batch64", rand_lens(r, 64, 1, 600), 4, 1, 256, 16, 2.0f},
        {"hd256 long", {20011, 33001, 5000}, 8, 4, 256, 16, 4.0f}, // splits
        {"hd256 sharp", rand_lens(r, 4, 1000, 3000), 4, 1, 256, 16, 12.0f},
    };
    for (int f8 = 0; f8 < 3; f8++)
        for (auto &c : dec) test_decode(c, r, f8 > 0, f8 == 2);
    const std::vector<PrefillCase> pre = {
        {"hd256 single", {1}, {0}, 4, 1, 256, 16},
        {"hd256 mixed", {1, 17, 64, 100, 1, 65, 300}, {0, 0, 0, 37, 500, 15, 1000}, 4, 1, 256, 16},
        {"hd256 gqa2", {40, 130, 2}, {16, 0, 1000}, 16, 8, 256, 32},
        {"hd256 long", {512, 256}, {0, 3000}, 8, 4, 256, 16},
        {"hd256 gqa16", {20, 9}, {0, 300}, 16, 1, 256, 16},
        {"hd256 decode-mix", {1, 1, 1, 128, 1}, {4000, 17, 64, 512, 1}, 4, 1, 256, 16},
    };
    for (int f8 = 0; f8 < 3; f8++)
        for (auto &c : pre) test_prefill(c, r, f8 > 0, f8 == 2);
    // Gemma 3's windows: 512 (270M), 1024 (1B-27B); and the edges.
    const std::vector<W> dw = {{1, 0}, {100, 0}, {512, 0}, {1024, 0}, {0, 5.0f}, {512, 2.0f}};
    for (int f8 = 0; f8 < 2; f8++)
        for (int i : {1, 2, 4, 6})
            for (auto &w : dw) test_decode(dec[i], r, f8 != 0, false, w.window, w.cap);
    const std::vector<W> pw = {{1, 0}, {100, 0}, {512, 0}, {0, 3.0f}, {100, 2.0f}};
    for (int f8 = 0; f8 < 2; f8++)
        for (int i : {1, 2, 3, 5})
            for (auto &w : pw) test_prefill(pre[i], r, f8 != 0, false, w.window, w.cap);
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
