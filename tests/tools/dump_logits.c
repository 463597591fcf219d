// tests/tools/dump_logits.c - the next-token logits of a prompt, through the
// model and runner on the CPU backend, for comparisons with other
// implementations (tests/integration/test_hf_parity.py) and across
// tensor-parallel sizes (tests/integration/test_tensor_parallel.py).
//
//   build/tests/tools/dump_logits MODEL|--dummy CONFIG.json [--mode exact|quant|default]
//       [--tp N [--ep]] [--threads N] [--quantization fp8|int4|awq|gptq|none] [--cpu-offload-gb G] ID,ID,...
//
// Prints one JSON line: {"vocab": V, "logits": [...]} for the last position.
// --dummy: random weights of that config's shape (the same values at every
// --tp). --tp N: N ranks on the in-process communicator (engine/dist/executor.h);
// --ep: with expert parallelism (--enable-expert-parallel: whole experts per rank).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/dist/executor.h"
#include "engine/model/model.h"

int main(int argc, char **argv) {
    const char *model_path = NULL, *ids_arg = NULL, *dummy = NULL;
    pg_matmul_mode mode = PG_MATMUL_EXACT;
    int tp = 1, threads = 0, quant = 0;
    int64_t offload = 0;
    bool ep = false;
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
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--dummy") && i + 1 < argc) {
            dummy = argv[++i];
        } else if (!model_path && !dummy) {
            model_path = argv[i];
        } else {
            ids_arg = argv[i];
        }
    }
    if ((!model_path && !dummy) || !ids_arg) {
        fprintf(stderr, "usage: dump_logits MODEL|--dummy CONFIG [--mode exact|quant|default] [--tp N [--ep]] "
                        "[--threads N] [--quantization Q] [--cpu-offload-gb G] ID,ID,...\n");
        return 2;
    }
    int32_t ids[4096];
    int n = 0;
    for (char *s = (char *)ids_arg; *s && n < 4096;) {
        ids[n++] = (int32_t)strtol(s, &s, 10);
        if (*s == ',') s++;
    }
    pg_model_load_opts mo = {.path = model_path, .dummy = dummy != NULL, .hf_config = dummy,
                             .dummy_seed = 0x5eedull, .dummy_std = 0.02f, .quantization = quant,
                             .cpu_offload_bytes = offload, .expert_parallel = ep};
    pg_executor_config ec = {.tp = tp, .device = "cpu", .n_threads = threads, .matmul_mode = mode};
    pg_executor *ex;
    if (pg_executor_create(&ec, &mo, &ex) < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 1;
    const pg_model *m = pg_executor_model(ex, 0);
    const int bs = 16, nb = (n + bs - 1) / bs + 1;
    pg_runner_config rc = {.block_size = bs, .max_num_seqs = 1, .max_num_batched_tokens = n,
                           .max_model_len = nb * bs, .kv_dtype = PG_KV_BF16, .graphs = PG_GRAPHS_OFF,
                           .full_logits = true};
    if (pg_executor_runners_create(ex, &rc) < 0 || pg_executor_alloc_kv(ex, nb + 1, 0) < 0)
        return fprintf(stderr, "%s\n", pg_err_msg()), 1;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) table[i] = i + 1;
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.temperature = 0;
    pg_plan_seq s = {.seq_id = 1, .tokens = ids, .n_tokens = n, .start_pos = 0, .block_table = table,
                     .n_blocks = nb, .sample = true, .sp = &sp, .eos_id = -1};
    pg_batch_plan p = {.n_seqs = 1, .seqs = &s, .n_tokens = n};
    pg_step_output o;
    const int32_t V = m->cfg.vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (pg_executor_execute(ex, &p, &o) < 0 || pg_executor_last_logits(ex, logits, 1) < 0)
        return fprintf(stderr, "%s\n", pg_err_msg()), 1;
    printf("{\"vocab\": %d, \"arch\": \"%s\", \"token\": %d, \"logits\": [", V, m->cfg.arch, o.outs[0].token);
    for (int32_t i = 0; i < V; i++) printf("%s%.9g", i ? ", " : "", logits[i]);
    printf("]}\n");
    free(logits);
    free(table);
    pg_executor_free(ex);
    return 0;
}
