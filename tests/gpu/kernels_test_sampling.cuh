// tests/gpu/kernels_test_sampling.cuh - the GPU sampler against
// kernels/cpu/sampling.c itself: identical tokens for greedy and seeded
// sampling, logprobs within 1e-4, over several logit distributions
// (test_sampling), and the sampled distribution
// (test_sampling_distribution). Part of tests/gpu/test_cuda_kernels.cu, not
// a header of its own: the driver #includes it once, in order, where this
// code used to be, and it uses what the driver and the headers before it
// define.
#pragma once

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
