// tests/tools/dump_logits.c - the next-token logits of a prompt, through the
// model and runner on the CPU backend, for comparisons with other
// implementations (tests/integration/test_hf_parity.py) and across
// tensor-parallel sizes (tests/integration/test_tensor_parallel.py).
//
//   build/tests/tools/dump_logits MODEL|--dummy CONFIG.json [--mode exact|quant|default]
//       [--tp N [--ep [--a2a]]] [--threads N] [--quantization fp8|int4|awq|gptq|none] [--cpu-offload-gb G]
//       [--lora DIR ...] [A:]ID,ID,... [[A:]ID,ID,... ...]
//
// Prints one JSON line per prompt: {"vocab": V, "logits": [...]} for its
// last position. Several prompts run in one batch (one step); "A:" runs a
// prompt with the A-th --lora adapter (1-based; 0 or none: the base model),
// so one batch can mix adapters (tests/integration/test_lora.py).
// --dummy: random weights of that config's shape (the same values at every
// --tp). --tp N: N ranks on the in-process communicator (engine/dist/executor.h);
// --ep: with expert parallelism (--enable-expert-parallel: whole experts per rank);
// --a2a: its combine by all-to-all (--all2all-backend alltoall).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/dist/executor.h"
#include "engine/model/model.h"

int main(int argc, char **argv) {
    const char *model_path = NULL, *dummy = NULL;
    const char *ids_args[64], *lora_dirs[16];
    int n_prompts = 0, n_lora = 0;
    pg_matmul_mode mode = PG_MATMUL_EXACT;
    int tp = 1, threads = 0, quant = 0;
    int64_t offload = 0;
    bool ep = false, a2a = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
            if (pg_matmul_mode_parse(argv[++i], &mode) < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 2;
        } else if (!strcmp(argv[i], "--quantization") && i + 1 < argc) {
            if (pg_quantization_parse(argv[++i], &quant) < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 2;
        } else if (!strcmp(argv[i], "--cpu-offload-gb") && i + 1 < argc) {
            offload = (int64_t)(atof(argv[++i]) * (double)(1 << 30));
        } else if (!strcmp(argv[i], "--tp") && i + 1 < argc) {
            tp = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--ep")) {
            ep = true;
        } else if (!strcmp(argv[i], "--a2a")) {
            a2a = true;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--dummy") && i + 1 < argc) {
            dummy = argv[++i];
        } else if (!strcmp(argv[i], "--lora") && i + 1 < argc && n_lora < 16) {
            lora_dirs[n_lora++] = argv[++i];
        } else if (!model_path && !dummy) {
            model_path = argv[i];
        } else if (n_prompts < 64) {
            ids_args[n_prompts++] = argv[i];
        }
    }
    if ((!model_path && !dummy) || n_prompts == 0) {
        fprintf(stderr, "usage: dump_logits MODEL|--dummy CONFIG [--mode exact|quant|default] "
                        "[--tp N [--ep [--a2a]]] "
                        "[--threads N] [--quantization Q] [--cpu-offload-gb G] [--lora DIR ...] "
                        "[A:]ID,ID,... ...\n");
        return 2;
    }
    // The prompts back to back in ids; each its adapter and its blocks.
    static int32_t ids[16384];
    int32_t start[65], lora[64], n = 0;
    for (int p = 0; p < n_prompts; p++) {
        const char *arg = ids_args[p], *colon = strchr(arg, ':');
        lora[p] = colon ? atoi(arg) : 0;
        if (lora[p] < 0 || lora[p] > n_lora) return fprintf(stderr, "prompt %d: no adapter %d\n", p, lora[p]), 2;
        start[p] = n;
        for (char *s = (char *)(colon ? colon + 1 : arg); *s && n < 16384;) {
            ids[n++] = (int32_t)strtol(s, &s, 10);
            if (*s == ',') s++;
        }
    }
    start[n_prompts] = n;
    pg_model_load_opts mo = {.path = model_path, .dummy = dummy != NULL, .hf_config = dummy,
                             .dummy_seed = 0x5eedull, .dummy_std = 0.02f, .quantization = quant,
                             .cpu_offload_bytes = offload, .lora_dirs = lora_dirs, .n_lora = n_lora,
                             .expert_parallel = ep, .moe_alltoall = a2a};
    pg_executor_config ec = {.tp = tp, .device = "cpu", .n_threads = threads, .matmul_mode = mode};
    pg_executor *ex;
    if (pg_executor_create(&ec, &mo, &ex) < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 1;
    const pg_model *m = pg_executor_model(ex, 0);
    const int bs = 16;
    int nb_all = 0, max_len = 0;
    for (int p = 0; p < n_prompts; p++) {
        const int len = start[p + 1] - start[p];
        nb_all += (len + bs - 1) / bs + 1;
        if (len > max_len) max_len = len;
    }
    pg_runner_config rc = {.block_size = bs, .max_num_seqs = n_prompts, .max_num_batched_tokens = n,
                           .max_model_len = ((max_len + bs - 1) / bs + 1) * bs, .kv_dtype = PG_KV_BF16,
                           .graphs = PG_GRAPHS_OFF, .full_logits = true};
    if (pg_executor_runners_create(ex, &rc) < 0 || pg_executor_alloc_kv(ex, nb_all + 1, 0) < 0)
        return fprintf(stderr, "%s\n", pg_err_msg()), 1;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb_all);
    for (int i = 0; i < nb_all; i++) table[i] = i + 1;
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.temperature = 0;
    pg_plan_seq seqs[64];
    for (int p = 0, b0 = 0; p < n_prompts; p++) {
        const int len = start[p + 1] - start[p], nb = (len + bs - 1) / bs + 1;
        seqs[p] = (pg_plan_seq){.seq_id = p + 1, .tokens = ids + start[p], .n_tokens = len, .start_pos = 0,
                                .block_table = table + b0, .n_blocks = nb, .sample = true, .sp = &sp,
                                .eos_id = -1, .lora_id = lora[p]};
        b0 += nb;
    }
    pg_batch_plan plan = {.n_seqs = n_prompts, .seqs = seqs, .n_tokens = n};
    pg_step_output o;
    const int32_t V = m->cfg.vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)n_prompts);
    if (pg_executor_execute(ex, &plan, &o) < 0 || pg_executor_last_logits(ex, logits, n_prompts) < 0)
        return fprintf(stderr, "%s\n", pg_err_msg()), 1;
    for (int p = 0; p < n_prompts; p++) {
        printf("{\"vocab\": %d, \"arch\": \"%s\", \"token\": %d, \"logits\": [", V, m->cfg.arch, o.outs[p].token);
        for (int32_t i = 0; i < V; i++) printf("%s%.9g", i ? ", " : "", logits[(size_t)p * V + i]);
        printf("]}\n");
    }
    free(logits);
    free(table);
    pg_executor_free(ex);
    return 0;
}
