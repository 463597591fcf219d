// tests/tools/kv_quality.c - what the CPU KV cache's element types cost in
// output quality, through the real model and runner.
//
//   build/tests/tools/kv_quality MODEL TEXT [--tokens N] [--window W] [--threads N]
//       [--mode exact|quant|default] [--kv f16,bf16,q8_0,fp8@1,fp8,fp8_e4m3_scaled]
//
// The sibling of quant_quality.c (weights) for the KV cache: the same text,
// tokens and windows (decode steps over one sequence, so the numbers are the
// runner's logits as served), the model's weights as stored in every run,
// and one executor per --kv-cache-dtype stepped in lockstep with the
// reference, an f32 cache. Per type: perplexity, mean KL(f32 || type) of the
// next-token distributions, and the mean and max |logit - f32 logit| over
// every position and vocabulary entry. It also prints the magnitudes of K
// and V as the f32 cache holds them (max |x| per layer, and how many
// elements are beyond e4m3's 448 or below its smallest normal 2^-6), so the
// reader sees whether fp8 at scale 1.0 saturates on this model. "fp8" is
// the fp8 cache as served (scales per layer and KV head, calibrated at
// start-up: engine/runner/runner_kv_scales.c), "fp8@1" the same cache at scale 1.0
// (--kv-cache-scales one). Markdown.
#include "engine/memplan.h"
#include "tests/tools/quality_common.h"

#define MAX_TYPES 8

typedef struct {
    const char *name;
    int32_t dtype, scales;
    pg_executor *ex;
    float *logits;
    double nll, kl, abs_sum, abs_max;
} kv_run;

// K or V magnitudes of one layer over the run.
typedef struct {
    float amax[2];              // K, V
    int64_t over[2], under[2];  // |x| > 448; 0 < |x| < 2^-6
} layer_mag;

// The f32 cache's K and V of positions [0, n) (slot bs + t: the table is
// blocks 1, 2, ...) into the per-layer magnitudes.
static void scan_kv(const pg_bkv *kv, int32_t n, layer_mag *mag) {
    const size_t row = (size_t)kv->shape.n_kv_heads * (size_t)kv->shape.head_dim;
    for (int32_t l = 0; l < kv->n_layers; l++)
        for (int kvi = 0; kvi < 2; kvi++) {
            const float *c = (const float *)(kvi ? kv->v[l] : kv->k[l]) + (size_t)kv->shape.block_size * row;
            for (size_t e = 0; e < (size_t)n * row; e++) {
                const float a = fabsf(c[e]);
                mag[l].amax[kvi] = a > mag[l].amax[kvi] ? a : mag[l].amax[kvi];
                mag[l].over[kvi] += a > 448.0f;
                mag[l].under[kvi] += a > 0.0f && a < 0x1p-6f;
            }
        }
}

int main(int argc, char **argv) {
    qc_args a = {.list = "f16,bf16,q8_0,fp8@1,fp8,fp8_e4m3_scaled"};
    int rc = qc_parse(argc, argv, "--kv",
                      "usage: kv_quality MODEL.gguf TEXT [--tokens N] [--window W] [--threads N] "
                      "[--mode M] [--kv f16,bf16,q8_0,fp8@1,fp8,fp8_e4m3_scaled]", &a);
    if (rc) return rc;
    qc_tokens tx;
    if ((rc = qc_tokenize(&a, &tx))) return rc;
    const int32_t *ids = tx.ids;
    const int n_tokens = a.n_tokens, window = a.window, bs = QC_BLOCK;

    // The reference (an f32 cache) and the types, each its own executor.
    kv_run r[MAX_TYPES] = {{.name = "f32 (reference)", .dtype = PG_KV_F32}};
    int nr = 1;
    char *list = strdup(a.list);
    for (char *save, *t = strtok_r(list, ",", &save); t && nr < MAX_TYPES; t = strtok_r(NULL, ",", &save)) {
        int32_t d;
        char *at = strchr(t, '@'), type[64];
        snprintf(type, sizeof type, "%.*s", at ? (int)(at - t) : (int)strlen(t), t);
        if (at && strcmp(at, "@1")) return fprintf(stderr, "kv_quality: '%s': only @1 (scale 1.0) is known\n", t), 2;
        if (pg_kv_dtype_parse(type, true, &d) < 0) return qc_fail();
        r[nr++] = (kv_run){.name = t, .dtype = d, .scales = at ? PG_KV_SCALES_ONE : PG_KV_SCALES_AUTO};
    }
    const int nb = qc_blocks(&a);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) table[i] = i + 1;
    int32_t V = 0;
    for (int k = 0; k < nr; k++) {
        pg_model_load_opts mo = {.path = a.model};
        if ((rc = qc_executor(&a, &mo, r[k].dtype, r[k].scales, &r[k].ex))) return rc;
        V = pg_executor_model(r[k].ex, 0)->cfg.vocab_size;
        r[k].logits = malloc(sizeof(float) * (size_t)V);
        fprintf(stderr, "ready %s: %s, %zu bytes per KV block\n", r[k].name, pg_kv_dtype_name(r[k].dtype),
                pg_executor_kv_bytes_per_block(r[k].ex));
    }
    const pg_bkv *ref_kv = pg_executor_kv(r[0].ex, 0);
    layer_mag *mag = calloc((size_t)ref_kv->n_layers, sizeof *mag);
    double *ref = malloc(sizeof(double) * (size_t)V), *lp = malloc(sizeof(double) * (size_t)V);
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.temperature = 0;
    int64_t n_pred = 0;
    for (int w0 = 0; w0 < n_tokens; w0 += window) {
        for (int i = 0; i < window - 1; i++) { // token w0 + i predicts w0 + i + 1
            const int32_t next = ids[w0 + i + 1];
            for (int k = 0; k < nr; k++) {
                if (qc_step(r[k].ex, r[k].logits, ids + w0 + i, i, table, nb, &sp)) return 1;
                qc_log_softmax(r[k].logits, V, k == 0 ? ref : lp);
                const double *l = k == 0 ? ref : lp;
                r[k].nll -= l[next];
                if (k == 0) continue;
                double kl = 0;
                for (int32_t t = 0; t < V; t++) {
                    kl += exp(ref[t]) * (ref[t] - l[t]);
                    const double d = fabs((double)r[k].logits[t] - r[0].logits[t]);
                    r[k].abs_sum += d;
                    r[k].abs_max = d > r[k].abs_max ? d : r[k].abs_max;
                }
                r[k].kl += kl;
            }
            n_pred++;
        }
        scan_kv(ref_kv, window - 1, mag); // before the next window overwrites the slots
        fprintf(stderr, "window %d/%d\n", w0 / window + 1, n_tokens / window);
    }
    printf("| KV cache | bytes per token | perplexity | mean KL vs f32 | mean abs logit diff | max abs logit diff |\n"
           "|---|---|---|---|---|---|\n");
    for (int k = 0; k < nr; k++) {
        const double per_token = (double)pg_executor_kv_bytes_per_block(r[k].ex) / bs;
        const double ppl = exp(r[k].nll / (double)n_pred);
        if (k == 0)
            printf("| %s | %.0f | %.4f | 0 (itself) | 0 | 0 |\n", r[k].name, per_token, ppl);
        else
            printf("| %s | %.0f | %.4f | %.6f | %.5f | %.4f |\n", r[k].name, per_token, ppl,
                   r[k].kl / (double)n_pred, r[k].abs_sum / ((double)n_pred * V), r[k].abs_max);
    }
    printf("\n%lld predictions (%d windows of %d tokens), matmul mode %s\n\n", (long long)n_pred, n_tokens / window,
           window, pg_matmul_mode_name(a.mode));
    // Magnitudes: the largest layers and the totals.
    const int64_t per_layer = (int64_t)n_pred * ref_kv->shape.n_kv_heads * ref_kv->shape.head_dim;
    float amax[2] = {0, 0};
    int64_t over[2] = {0, 0}, under[2] = {0, 0};
    printf("| layer | max \\|K\\| | max \\|V\\| | K > 448 | V > 448 | K below 2^-6 | V below 2^-6 |\n"
           "|---|---|---|---|---|---|---|\n");
    for (int32_t l = 0; l < ref_kv->n_layers; l++) {
        for (int kvi = 0; kvi < 2; kvi++) {
            amax[kvi] = mag[l].amax[kvi] > amax[kvi] ? mag[l].amax[kvi] : amax[kvi];
            over[kvi] += mag[l].over[kvi], under[kvi] += mag[l].under[kvi];
        }
        printf("| %d | %.2f | %.2f | %lld | %lld | %.2f%% | %.2f%% |\n", l, mag[l].amax[0], mag[l].amax[1],
               (long long)mag[l].over[0], (long long)mag[l].over[1], 100.0 * (double)mag[l].under[0] / (double)per_layer,
               100.0 * (double)mag[l].under[1] / (double)per_layer);
    }
    const double all = (double)per_layer * ref_kv->n_layers;
    printf("| all | %.2f | %.2f | %lld | %lld | %.2f%% | %.2f%% |\n\n", amax[0], amax[1], (long long)over[0],
           (long long)over[1], 100.0 * (double)under[0] / all, 100.0 * (double)under[1] / all);
    printf("K and V of the f32 cache over %lld elements each (%d layers x %d heads x %d x %lld positions)\n",
           (long long)(per_layer * ref_kv->n_layers), ref_kv->n_layers, ref_kv->shape.n_kv_heads,
           ref_kv->shape.head_dim, (long long)n_pred);
    for (int k = 0; k < nr; k++) pg_executor_free(r[k].ex), free(r[k].logits);
    free(mag), free(ref), free(lp), free(table), free(list);
    qc_tokens_free(&tx);
    return 0;
}
