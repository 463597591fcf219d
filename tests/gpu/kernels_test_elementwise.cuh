// tests/gpu/kernels_test_elementwise.cuh - the elementwise and small
// kernels: add + RMSNorm, bias add, per-head RMSNorm, SiLU*mul, embedding,
// argmax, top-k, token feeding, block copy and move, and the dtype
// conversions, against CPU references. Part of
// tests/gpu/test_cuda_kernels.cu, not a header of its own: the driver
// #includes it once, in order, where this code used to be, and it uses what
// the driver and the headers before it define.
#pragma once

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
