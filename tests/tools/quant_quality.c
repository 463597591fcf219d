// tests/tools/quant_quality.c - perplexity and KL divergence of weight
// formats, through the real model and runner on the CPU backend.
//
//   build/tests/tools/quant_quality MODEL TEXT [--tokens N] [--window W] [--threads N]
//       [--mode exact|quant|default] [--formats stored,fp8,int4,q8_0,q4_0]
//
// The text is tokenized with the model's tokenizer (a GGUF file) and its
// first N tokens (default 2048) cut into windows of W (default 256); in each
// window every position after the first predicts the next token (decode
// steps over one sequence, so the numbers come from the runner's logits as
// served). The reference is the model with its layer matrices in bf16
// (dequantized from the stored type); each format is loaded beside it
// (the layers requantized from the stored weights by engine/model_quant.c;
// "stored" is the file as it is) and stepped in lockstep, so the KL
// divergence KL(ref || format) of the next-token distributions is taken
// position by position without keeping any distribution. The embedding,
// LM head and norms are the file's in every format. Prints a Markdown table.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/executor.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

#define MAX_FORMATS 8

typedef struct {
    const char *name;
    int quant;
    pg_executor *ex;
    float *logits;
    double nll, kl;
} fmt;

static int fail(void) { return fprintf(stderr, "%s\n", pg_err_msg()), 1; }

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    *len = fread(s, 1, (size_t)n, f);
    fclose(f);
    return s;
}

// log-softmax of v[n] into out.
static void log_softmax(const float *v, int n, double *out) {
    double mx = v[0], s = 0;
    for (int i = 1; i < n; i++) mx = v[i] > mx ? v[i] : mx;
    for (int i = 0; i < n; i++) s += exp(v[i] - mx);
    const double lse = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = v[i] - lse;
}

int main(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *formats = "stored,fp8,int4,q8_0,q4_0";
    int n_tokens = 2048, window = 256, threads = 0;
    pg_matmul_mode mode = PG_MATMUL_DEFAULT;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) n_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--window") && i + 1 < argc) window = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc) formats = argv[++i];
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
            if (pg_matmul_mode_parse(argv[++i], &mode) < 0) return fail();
        } else if (!model) model = argv[i];
        else text = argv[i];
    }
    if (!model || !text || window < 2) {
        fprintf(stderr, "usage: quant_quality MODEL.gguf TEXT [--tokens N] [--window W] [--threads N] "
                        "[--mode M] [--formats stored,fp8,int4,q8_0,q4_0]\n");
        return 2;
    }
    // Tokens of the text.
    gguf_file *gf;
    pg_tokenizer *tok;
    if (gguf_open(model, &gf) < 0 || pg_tokenizer_from_gguf(gf, &tok) < 0) return fail();
    size_t len;
    char *s = read_all(text, &len);
    if (!s) return fprintf(stderr, "%s: cannot read\n", text), 1;
    int n_all = pg_tokenizer_encode(tok, s, len, false, false, NULL, 0);
    if (n_all < 0) return fail();
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_all);
    pg_tokenizer_encode(tok, s, len, false, false, ids, n_all);
    if (n_all < n_tokens) n_tokens = n_all;
    n_tokens -= n_tokens % window;
    fprintf(stderr, "%s: %d tokens, %d used in windows of %d\n", text, n_all, n_tokens, window);

    // The reference and the formats, each its own executor.
    fmt f[MAX_FORMATS] = {{.name = "bf16 (reference)", .quant = PG_QUANT_BF16}};
    int nf = 1;
    char *list = strdup(formats);
    for (char *save, *t = strtok_r(list, ",", &save); t && nf < MAX_FORMATS; t = strtok_r(NULL, ",", &save)) {
        int q = -1;
        for (int k = PG_QUANT_NONE; k <= PG_QUANT_Q4_0; k++)
            if (!strcmp(t, pg_quantization_name(k))) q = k;
        if (!strcmp(t, "stored")) q = PG_QUANT_NONE;
        if (q < 0) return fprintf(stderr, "unknown format '%s'\n", t), 2;
        f[nf++] = (fmt){.name = t, .quant = q};
    }
    const int bs = 16, nb = window / bs + 2;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) table[i] = i + 1;
    int32_t V = 0;
    for (int k = 0; k < nf; k++) {
        pg_model_load_opts mo = {.path = model, .quantization = f[k].quant};
        pg_executor_config ec = {.tp = 1, .device = "cpu", .n_threads = threads, .matmul_mode = mode};
        if (pg_executor_create(&ec, &mo, &f[k].ex) < 0) return fail();
        pg_runner_config rc = {.block_size = bs, .max_num_seqs = 1, .max_num_batched_tokens = 1,
                               .max_model_len = nb * bs, .kv_dtype = PG_KV_NATIVE, .graphs = PG_GRAPHS_OFF,
                               .full_logits = true};
        if (pg_executor_runners_create(f[k].ex, &rc) < 0 || pg_executor_alloc_kv(f[k].ex, nb + 1, 0) < 0)
            return fail();
        const pg_model *m = pg_executor_model(f[k].ex, 0);
        V = m->cfg.vocab_size;
        f[k].logits = malloc(sizeof(float) * (size_t)V);
        fprintf(stderr, "loaded %s: %s, %.1f MiB\n", f[k].name, m->format, (double)m->weight_bytes / 1048576.0);
    }
    double *ref = malloc(sizeof(double) * (size_t)V), *lp = malloc(sizeof(double) * (size_t)V);
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.temperature = 0;
    int64_t n_pred = 0;
    for (int w0 = 0; w0 < n_tokens; w0 += window) {
        for (int i = 0; i < window - 1; i++) { // token w0 + i predicts w0 + i + 1
            pg_plan_seq q = {.seq_id = 1, .tokens = ids + w0, .n_tokens = i + 1, .start_pos = i,
                             .block_table = table, .n_blocks = nb, .sample = true, .sp = &sp, .eos_id = -1};
            q.tokens = ids + w0 + i, q.n_tokens = 1;
            pg_batch_plan p = {.n_seqs = 1, .seqs = &q, .n_tokens = 1};
            pg_step_output o;
            const int32_t next = ids[w0 + i + 1];
            for (int k = 0; k < nf; k++) {
                if (pg_executor_execute(f[k].ex, &p, &o) < 0 || pg_executor_last_logits(f[k].ex, f[k].logits, 1) < 0)
                    return fail();
                log_softmax(f[k].logits, V, k == 0 ? ref : lp);
                const double *l = k == 0 ? ref : lp;
                f[k].nll -= l[next];
                if (k > 0) {
                    double kl = 0;
                    for (int32_t t = 0; t < V; t++) kl += exp(ref[t]) * (ref[t] - l[t]);
                    f[k].kl += kl;
                }
            }
            n_pred++;
        }
        fprintf(stderr, "window %d/%d\n", w0 / window + 1, n_tokens / window);
    }
    printf("| format | layer matrices | weights (MiB) | perplexity | mean KL vs bf16 |\n|---|---|---|---|---|\n");
    for (int k = 0; k < nf; k++) {
        const pg_model *m = pg_executor_model(f[k].ex, 0);
        printf(k ? "| %s | %s | %.1f | %.4f | %.5f |\n" : "| %s | %s | %.1f | %.4f | 0 (itself) |\n", f[k].name, pg_dtype_name(m->layer_dtype),
               (double)m->weight_bytes / 1048576.0, exp(f[k].nll / (double)n_pred), f[k].kl / (double)n_pred);
    }
    printf("\n%lld predictions (%d windows of %d tokens), matmul mode %s\n", (long long)n_pred, n_tokens / window,
           window, pg_matmul_mode_name(mode));
    for (int k = 0; k < nf; k++) pg_executor_free(f[k].ex), free(f[k].logits);
    free(ref), free(lp), free(table), free(ids), free(s), free(list);
    pg_tokenizer_free(tok);
    gguf_close(gf);
    return 0;
}
