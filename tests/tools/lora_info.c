// tests/tools/lora_info.c - loads a PEFT LoRA adapter against a base
// model's config (engine/model/lora_adapter.h) and prints what was read,
// for tests/integration/test_lora_adapter.py.
//
//   build/tests/tools/lora_info ADAPTER_DIR CONFIG.json|MODEL_DIR [--max-rank N]
//
// Prints one JSON object: rank, alpha, scale, rslora, base_model,
// target_modules, and per layer with pairs the shapes, stored type and
// element sums (as double) of each module's A and B, so a test can tell
// that the right tensor landed in the right place. On failure prints the
// loader's one-line message on stderr and exits 1.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "engine/model/lora_adapter.h"
#include "kernels/dtype.h"

static double weight_sum(const pg_weight *w) {
    float *row = malloc(sizeof(float) * (size_t)w->cols);
    double s = 0;
    for (int64_t r = 0; r < w->rows; r++) {
        pg_dequantize_row(w->dtype, (const char *)w->data + (size_t)r * w->row_bytes, row, w->cols);
        for (int64_t j = 0; j < w->cols; j++) s += row[j];
    }
    free(row);
    return s;
}

// s as a JSON string (quotes, backslashes and control bytes escaped).
static void print_json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", (unsigned char)*s);
        else putchar(*s);
    }
    putchar('"');
}

static void print_layer(const pg_lora_adapter *ad, int32_t l, bool *first) {
    const pg_lora_layer *ly = &ad->layers[l];
    bool any = false;
    for (int m = 0; m < PG_LORA_N_MODULES; m++) {
        if (!ly->a[m]) continue;
        const pg_weight *a = ly->a[m], *b = ly->b[m];
        printf("%s%s\"%s\": {\"dtype\": \"%s\", \"a\": [%lld, %lld], \"b\": [%lld, %lld], \"a_sum\": %.9g, "
               "\"b_sum\": %.9g}",
               any ? ", " : (*first ? "" : ", "), any ? "" : "{", pg_lora_module_name(m), pg_dtype_name(a->dtype),
               (long long)a->rows, (long long)a->cols, (long long)b->rows, (long long)b->cols, weight_sum(a),
               weight_sum(b));
        if (!any) printf(", \"layer\": %d", l), any = true; // after the first module: keys are unordered
        *first = false;
    }
    if (any) printf("}");
}

int main(int argc, char **argv) {
    const char *dir = NULL, *config = NULL;
    int32_t max_rank = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max-rank") && i + 1 < argc)
            max_rank = atoi(argv[++i]);
        else if (!dir)
            dir = argv[i];
        else
            config = argv[i];
    }
    if (!dir || !config) {
        fprintf(stderr, "usage: lora_info ADAPTER_DIR CONFIG.json|MODEL_DIR [--max-rank N]\n");
        return 2;
    }
    pg_model_config cfg;
    const int rc = pg_is_dir(config) ? pg_config_from_hf_dir(config, &cfg) : pg_config_from_hf_file(config, &cfg);
    if (rc < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 1;
    pg_lora_adapter *ad;
    if (pg_lora_adapter_load(dir, &cfg, max_rank, &ad) < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 1;
    printf("{\"rank\": %d, \"alpha\": %.9g, \"scale\": %.9g, \"rslora\": %s, \"n_pairs\": %d, "
           "\"base_model\": ",
           ad->rank, ad->alpha, ad->scale, ad->rslora ? "true" : "false", ad->n_pairs);
    print_json_string(ad->base_model);
    printf(", \"target_modules\": [");
    for (int m = 0, n = 0; m < PG_LORA_N_MODULES; m++)
        if (ad->module_mask & (1u << m)) printf("%s\"%s\"", n++ ? ", " : "", pg_lora_module_name(m));
    printf("], \"layers\": [");
    bool first = true;
    for (int32_t l = 0; l < ad->n_layers; l++) print_layer(ad, l, &first);
    printf("]}\n");
    pg_lora_adapter_free(ad);
    return 0;
}
