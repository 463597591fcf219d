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
// (the layers requantized from the stored weights by engine/model/model_quant.c;
// "stored" is the file as it is) and stepped in lockstep, so the KL
// divergence KL(ref || format) of the next-token distributions is taken
// position by position without keeping any distribution. The embedding,
// LM head and norms are the file's in every format. Prints a Markdown table.
#include "tests/tools/quality_common.h"

#define MAX_FORMATS 8

typedef struct {
    const char *name;
    int quant;
    pg_executor *ex;
    float *logits;
    double nll, kl;
} fmt;

int main(int argc, char **argv) {
    qc_args a = {.list = "stored,fp8,int4,q8_0,q4_0"};
    int rc = qc_parse(argc, argv, "--formats",
                      "usage: quant_quality MODEL.gguf TEXT [--tokens N] [--window W] [--threads N] "
                      "[--mode M] [--formats stored,fp8,int4,q8_0,q4_0]", &a);
    if (rc) return rc;
    qc_tokens tx;
    if ((rc = qc_tokenize(&a, &tx))) return rc;
    const int32_t *ids = tx.ids;
    const int n_tokens = a.n_tokens, window = a.window;

    // The reference and the formats, each its own executor.
    fmt f[MAX_FORMATS] = {{.name = "bf16 (reference)", .quant = PG_QUANT_BF16}};
    int nf = 1;
    char *list = strdup(a.list);
    for (char *save, *t = strtok_r(list, ",", &save); t && nf < MAX_FORMATS; t = strtok_r(NULL, ",", &save)) {
        int q = -1;
        for (int k = PG_QUANT_NONE; k <= PG_QUANT_Q4_0; k++)
            if (!strcmp(t, pg_quantization_name(k))) q = k;
        if (!strcmp(t, "stored")) q = PG_QUANT_NONE;
        if (q < 0) return fprintf(stderr, "unknown format '%s'\n", t), 2;
        f[nf++] = (fmt){.name = t, .quant = q};
    }
    const int nb = qc_blocks(&a);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) table[i] = i + 1;
    int32_t V = 0;
    for (int k = 0; k < nf; k++) {
        pg_model_load_opts mo = {.path = a.model, .quantization = f[k].quant};
        if ((rc = qc_executor(&a, &mo, PG_KV_NATIVE, PG_KV_SCALES_AUTO, &f[k].ex))) return rc;
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
            const int32_t next = ids[w0 + i + 1];
            for (int k = 0; k < nf; k++) {
                if (qc_step(f[k].ex, f[k].logits, ids + w0 + i, i, table, nb, &sp)) return 1;
                qc_log_softmax(f[k].logits, V, k == 0 ? ref : lp);
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
           window, pg_matmul_mode_name(a.mode));
    for (int k = 0; k < nf; k++) pg_executor_free(f[k].ex), free(f[k].logits);
    free(ref), free(lp), free(table), free(list);
    qc_tokens_free(&tx);
    return 0;
}
