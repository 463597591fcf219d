// tests/gpu/kernels_test_pdl.cuh - the decode chain with and without
// programmatic dependent launch (test_pdl_chain, bit for bit per GEMV kind)
// and pg_cuda_l2_prefetch's arguments (test_l2_prefetch_args). Part of
// tests/gpu/test_cuda_kernels.cu, not a header of its own: the driver
// #includes it once, in order, where this code used to be, and it uses what
// the driver and the headers before it define.
#pragma once

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
