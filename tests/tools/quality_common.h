// tests/tools/quality_common.h - what quant_quality.c (weight formats) and
// kv_quality.c (KV cache types) share: the command line, the text's tokens,
// log-softmax, and one CPU executor set up to decode one sequence window by
// window. Header-only (static): each tool in tests/tools/ is one program.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/dist/executor.h"
#include "formats/gguf.h"
#include "engine/model/model.h"
#include "text/tokenizer/tokenizer.h"

#define QC_BLOCK 16 // KV block size of every run

static int qc_fail(void) { return fprintf(stderr, "%s\n", pg_err_msg()), 1; }

typedef struct {
    const char *model, *text, *list; // list: the --<list_flag> value
    int n_tokens, window, threads;
    pg_matmul_mode mode;
} qc_args;

// MODEL TEXT [--tokens N] [--window W] [--threads N] [--mode M] [<list_flag> L];
// 0, or 2 after printing `usage`.
static int qc_parse(int argc, char **argv, const char *list_flag, const char *usage, qc_args *a) {
    a->n_tokens = 2048, a->window = 256, a->threads = 0, a->mode = PG_MATMUL_DEFAULT;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) a->n_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--window") && i + 1 < argc) a->window = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) a->threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], list_flag) && i + 1 < argc) a->list = argv[++i];
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
            if (pg_matmul_mode_parse(argv[++i], &a->mode) < 0) return qc_fail(), 2;
        } else if (!a->model) a->model = argv[i];
        else a->text = argv[i];
    }
    if (!a->model || !a->text || a->window < 2) return fprintf(stderr, "%s\n", usage), 2;
    return 0;
}

// The text, tokenized with the model's tokenizer; a->n_tokens is cut to
// what the text has, in whole windows. *ids and *text are the caller's.
typedef struct {
    gguf_file *gf;
    pg_tokenizer *tok;
    char *text;
    int32_t *ids;
} qc_tokens;

static int qc_tokenize(qc_args *a, qc_tokens *t) {
    if (gguf_open(a->model, &t->gf) < 0 || pg_tokenizer_from_gguf(t->gf, &t->tok) < 0) return qc_fail();
    FILE *f = fopen(a->text, "rb");
    if (!f) return fprintf(stderr, "%s: cannot read\n", a->text), 1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    t->text = malloc((size_t)n + 1);
    size_t len = fread(t->text, 1, (size_t)n, f);
    fclose(f);
    int n_all = pg_tokenizer_encode(t->tok, t->text, len, false, false, NULL, 0);
    if (n_all < 0) return qc_fail();
    t->ids = malloc(sizeof(int32_t) * (size_t)n_all);
    pg_tokenizer_encode(t->tok, t->text, len, false, false, t->ids, n_all);
    if (n_all < a->n_tokens) a->n_tokens = n_all;
    a->n_tokens -= a->n_tokens % a->window;
    fprintf(stderr, "%s: %d tokens, %d used in windows of %d\n", a->text, n_all, a->n_tokens, a->window);
    return 0;
}

static void qc_tokens_free(qc_tokens *t) {
    free(t->ids), free(t->text);
    pg_tokenizer_free(t->tok);
    gguf_close(t->gf);
}

// The KV blocks of one window's sequence: blocks 1, 2, ... (0 is the null block).
static int qc_blocks(const qc_args *a) { return a->window / QC_BLOCK + 2; }

// A CPU executor for `mo` decoding one sequence of a window, full logits;
// kv_scales: PG_KV_SCALES_* for an fp8 cache.
static int qc_executor(const qc_args *a, const pg_model_load_opts *mo, int32_t kv_dtype, int32_t kv_scales,
                       pg_executor **ex) {
    const int nb = qc_blocks(a);
    pg_executor_config ec = {.tp = 1, .device = "cpu", .n_threads = a->threads, .matmul_mode = a->mode};
    if (pg_executor_create(&ec, mo, ex) < 0) return qc_fail();
    pg_runner_config rc = {.block_size = QC_BLOCK, .max_num_seqs = 1, .max_num_batched_tokens = 1,
                           .max_model_len = nb * QC_BLOCK, .kv_dtype = kv_dtype, .kv_scales = kv_scales,
                           .graphs = PG_GRAPHS_OFF,
                           .full_logits = true};
    if (pg_executor_runners_create(*ex, &rc) < 0 || pg_executor_alloc_kv(*ex, nb + 1, 0) < 0) return qc_fail();
    return 0;
}

// One decode step of `ex`: token *id at window position i (block table
// `table` of nb blocks), its logits into `logits`.
static int qc_step(pg_executor *ex, float *logits, const int32_t *id, int i, const int32_t *table, int nb,
                   const pg_sampling_params *sp) {
    pg_plan_seq q = {.seq_id = 1, .tokens = id, .n_tokens = 1, .start_pos = i, .block_table = table,
                     .n_blocks = nb, .sample = true, .sp = sp, .eos_id = -1};
    pg_batch_plan p = {.n_seqs = 1, .seqs = &q, .n_tokens = 1};
    pg_step_output o;
    if (pg_executor_execute(ex, &p, &o) < 0 || pg_executor_last_logits(ex, logits, 1) < 0) return qc_fail();
    return 0;
}

// log-softmax of v[n] into out.
static void qc_log_softmax(const float *v, int n, double *out) {
    double mx = v[0], s = 0;
    for (int i = 1; i < n; i++) mx = v[i] > mx ? v[i] : mx;
    for (int i = 0; i < n; i++) s += exp(v[i] - mx);
    const double lse = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = v[i] - lse;
}
