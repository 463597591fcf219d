// bench/bench_cpu_decode.c - decode throughput of the runner's steps (the
// forward and greedy sampling; no scheduler or HTTP): S sequences are prefilled with P random
// tokens each, then N decode steps run all S sequences in one batch (m = S
// rows per matrix product). Prints aggregate tokens/s and ms per step (wall
// and process CPU time; CPU time over wall time shows how much of the two
// cores the run got on a shared machine), and the prefill's tokens/s (P
// rows per matrix product).
//
// Usage: build/bench/bench_cpu_decode [--model PATH] [--seqs S] [--steps N]
//            [--prompt P] [--threads T] [--matmul-mode default|quant|exact]
// Compare with llama.cpp: bench/ref/llama_cpp_decode.py (same workload).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/runner/runner.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int S = 1, N = 64, P = 16, threads = 2;
    pg_matmul_mode mode = PG_MATMUL_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) goto usage;
        if (!strcmp(a, "--model"))
            path = v;
        else if (!strcmp(a, "--seqs"))
            S = atoi(v);
        else if (!strcmp(a, "--steps"))
            N = atoi(v);
        else if (!strcmp(a, "--prompt"))
            P = atoi(v);
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else if (!strcmp(a, "--matmul-mode")) {
            if (pg_matmul_mode_parse(v, &mode) < 0) goto usage;
        } else
            goto usage;
        i++;
    }
    if (S < 1 || S > 256 || N < 1 || P < 1) goto usage;

    pg_backend *be;
    pg_model *m;
    pg_model_load_opts mo = {.path = path};
    if (pg_backend_cpu_create(threads, mode, &be) < 0 || pg_model_load(&mo, be, &m) < 0) {
        fprintf(stderr, "%s\n", pg_err_msg());
        return 1;
    }
    const int bs = 16, per_seq = (P + N + bs - 1) / bs, V = m->cfg.vocab_size;
    pg_runner_config rc = {.block_size = bs, .max_num_seqs = S, .max_num_batched_tokens = P > S ? P : S,
                           .max_model_len = per_seq * bs, .kv_dtype = PG_KV_BF16, .graphs = PG_GRAPHS_OFF};
    pg_runner *r;
    if (pg_runner_create(m, &rc, &r) < 0 || pg_runner_alloc_kv(r, S * per_seq + 1, 0) < 0) {
        fprintf(stderr, "%s\n", pg_err_msg());
        return 1;
    }
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)(S * per_seq)); // [S][per_seq]
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(P > S ? P : S));
    pg_plan_seq *seqs = calloc((size_t)S, sizeof(pg_plan_seq));
    for (int i = 0; i < S * per_seq; i++) tables[i] = i + 1; // block 0 is the null block
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.temperature = 0;
    pg_step_output so;

    // The runner's whole step (inputs, forward, greedy sampling), as the
    // engine runs it.
    double tp = pg_now_s();
    for (int s = 0; s < S; s++) { // prefill, one sequence at a time
        for (int i = 0; i < P; i++) tok[i] = (int32_t)((s * 7919 + i * 104729) % V);
        seqs[0] = (pg_plan_seq){.seq_id = s, .tokens = tok, .n_tokens = P, .start_pos = 0,
                                .block_table = tables + s * per_seq, .n_blocks = per_seq,
                                .sample = true, .sp = &sp, .eos_id = -1};
        pg_batch_plan p = {.n_seqs = 1, .seqs = seqs, .n_tokens = P};
        if (pg_runner_execute(r, &p, &so) < 0) goto fail;
    }
    tp = pg_now_s() - tp;
    double t0 = pg_now_s(), c0 = cpu_s();
    for (int step = 0; step < N; step++) {
        const int cur = P + step;
        for (int s = 0; s < S; s++) {
            tok[s] = (int32_t)((s + step * 31) % V);
            seqs[s] = (pg_plan_seq){.seq_id = s, .tokens = tok + s, .n_tokens = 1, .start_pos = cur,
                                    .block_table = tables + s * per_seq, .n_blocks = per_seq,
                                    .sample = true, .sp = &sp, .eos_id = -1};
        }
        pg_batch_plan p = {.n_seqs = S, .seqs = seqs, .n_tokens = S};
        if (pg_runner_execute(r, &p, &so) < 0) goto fail;
    }
    double wall = pg_now_s() - t0, cpu = cpu_s() - c0;
    printf("seqs %d, threads %d, mode %s, prompt %d, %d steps: %.1f tok/s aggregate, %.2f ms/step "
           "(cpu %.2f ms/step); prefill %.1f tok/s\n",
           S, threads, pg_matmul_mode_name(mode), P, N, S * N / wall, wall / N * 1e3, cpu / N * 1e3,
           S * P / tp);
    pg_runner_free(r);
    pg_model_free(m);
    be->dev->destroy(be);
    free(tables), free(tok), free(seqs);
    return 0;
fail:
    fprintf(stderr, "forward: %s\n", pg_err_msg());
    return 1;
usage:
    fprintf(stderr,
            "usage: %s [--model PATH] [--seqs S] [--steps N] [--prompt P] [--threads T] "
            "[--matmul-mode default|quant|exact]\n",
            argv[0]);
    return 2;
}
