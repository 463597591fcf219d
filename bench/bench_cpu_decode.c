// bench/bench_cpu_decode.c - decode throughput of the forward pass alone
// (no scheduler, sampler or HTTP): S sequences are prefilled with P random
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
#include "engine/llama.h"

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

    pg_llama *m;
    pg_backend *be;
    if (pg_llama_load(path, &m) < 0 || pg_backend_cpu_create(threads, &be) < 0) {
        fprintf(stderr, "%s\n", pg_err_msg());
        return 1;
    }
    be->matmul_mode = mode;
    const int bs = 16, per_seq = (P + N + bs - 1) / bs, V = m->cfg.vocab_size;
    pg_kv_cache *kv;
    if (pg_kv_cache_create(&m->cfg, S * per_seq + 1, bs, &kv) < 0) {
        fprintf(stderr, "%s\n", pg_err_msg());
        return 1;
    }
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)S);
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)(S * per_seq)); // [S][per_seq]
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(P > S ? P : S));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(P > S ? P : S));
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)(P > S ? P : S));
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)S);
    pg_attn_seq *seqs = malloc(sizeof(pg_attn_seq) * (size_t)S);
    for (int i = 0; i < S * per_seq; i++) tables[i] = i + 1; // block 0 is the null block
    pg_fwd_workspace ws = {0};

    double tp = pg_now_s();
    for (int s = 0; s < S; s++) { // prefill, one sequence at a time
        for (int i = 0; i < P; i++) {
            tok[i] = (int32_t)((s * 7919 + i * 104729) % V);
            pos[i] = i;
            slots[i] = tables[s * per_seq + i / bs] * bs + i % bs;
        }
        seqs[0] = (pg_attn_seq){0, P, 0, tables + s * per_seq};
        rows[0] = P - 1;
        pg_fwd_batch fb = {P, tok, pos, slots, 1, seqs, 1, rows};
        if (pg_llama_forward(m, be, kv, &ws, &fb, logits) < 0) goto fail;
    }
    tp = pg_now_s() - tp;
    double t0 = pg_now_s(), c0 = cpu_s();
    for (int step = 0; step < N; step++) {
        const int cur = P + step;
        for (int s = 0; s < S; s++) {
            tok[s] = (int32_t)((s + step * 31) % V);
            pos[s] = cur;
            slots[s] = tables[s * per_seq + cur / bs] * bs + cur % bs;
            seqs[s] = (pg_attn_seq){s, 1, cur, tables + s * per_seq};
            rows[s] = s;
        }
        pg_fwd_batch fb = {S, tok, pos, slots, S, seqs, S, rows};
        if (pg_llama_forward(m, be, kv, &ws, &fb, logits) < 0) goto fail;
    }
    double wall = pg_now_s() - t0, cpu = cpu_s() - c0;
    printf("seqs %d, threads %d, mode %s, prompt %d, %d steps: %.1f tok/s aggregate, %.2f ms/step "
           "(cpu %.2f ms/step); prefill %.1f tok/s\n",
           S, threads, pg_matmul_mode_name(mode), P, N, S * N / wall, wall / N * 1e3, cpu / N * 1e3,
           S * P / tp);
    pg_fwd_workspace_free(&ws);
    pg_kv_cache_free(kv);
    be->destroy(be);
    pg_llama_free(m);
    free(logits), free(tables), free(tok), free(pos), free(slots), free(rows), free(seqs);
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
