// tests/tools/lora_info.c - loads a PEFT LoRA adapter against a base
// model's config (engine/model/lora_adapter.h) and prints what was read,
// for tests/integration/test_lora_adapter.py.
//
//   build/tests/tools/lora_info ADAPTER_DIR CONFIG.json|MODEL_DIR [--max-rank N]
//       [--apply LAYER MODULE ROWS]
//
// Prints one JSON object: rank, alpha, scale, rslora, base_model,
// target_modules, and per layer with pairs the shapes, stored type and
// element sums (as double) of each module's A and B, so a test can tell
// that the right tensor landed in the right place. On failure prints the
// loader's one-line message on stderr and exits 1.
//
// --apply: also runs the CPU backend's lora_apply (exact numerics) with
// that pair on ROWS rows x[i][j] = sin(0.37 (i in + j) + 0.1), row 1 without
// an adapter (slot -1) and beside an empty slot, and prints "delta": what
// it added to each row (zeros first), so the test can hold the reader and
// the op together against the file's tensors.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "engine/model/lora_adapter.h"
#include "kernels/backend.h"
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

// Prints "delta": [[...] x rows] of lora_apply with layer l's module m.
static int print_apply(const pg_lora_adapter *ad, int32_t l, int m, int32_t rows) {
    const pg_weight *a = ad->layers[l].a[m], *bw = ad->layers[l].b[m];
    if (!a) return pg_err_set(PG_EINVAL, "layer %d has no %s pair", l, pg_lora_module_name(m));
    pg_backend *be;
    PG_TRY(pg_backend_cpu_create(2, PG_MATMUL_EXACT, &be));
    pg_bweight *ua, *ub;
    PG_TRY(be->store->weight_upload(be, a, 1, &ua));
    PG_TRY(be->store->weight_upload(be, bw, 1, &ub));
    const int64_t in = a->cols, oc = bw->rows;
    float *x = malloc(sizeof(float) * (size_t)(rows * in)), *o = calloc((size_t)(rows * oc), sizeof(float));
    for (int64_t q = 0; q < rows * in; q++) x[q] = sinf(0.37f * (float)q + 0.1f);
    int32_t *row_slot = malloc(sizeof(int32_t) * (size_t)rows);
    for (int32_t i = 0; i < rows; i++) row_slot[i] = i == 1 ? -1 : 1;
    const pg_lora_slot slots[2] = {{0}, {.a = ua, .b = ub, .scale = ad->scale}};
    const size_t wsb = be->ops->lora_workspace_bytes(be, rows, (int32_t)in, (int32_t)oc, ad->rank, 2);
    void *ws = malloc(wsb);
    pg_tensor to = {.data = o, .dtype = PG_DTYPE_F32, .rows = rows, .cols = oc, .stride = oc};
    pg_tensor tx = {.data = x, .dtype = PG_DTYPE_F32, .rows = rows, .cols = in, .stride = in};
    int rc = be->ops->lora_apply(be, to, tx, row_slot, slots, 2, ws, wsb);
    if (rc == 0) {
        printf(", \"delta\": [");
        for (int32_t i = 0; i < rows; i++) {
            printf("%s[", i ? ", " : "");
            for (int64_t d = 0; d < oc; d++) printf("%s%.9g", d ? ", " : "", o[i * oc + d]);
            printf("]");
        }
        printf("]");
    }
    free(ws), free(row_slot), free(x), free(o);
    be->store->weight_free(be, ua);
    be->store->weight_free(be, ub);
    be->dev->destroy(be);
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *config = NULL;
    int32_t max_rank = 64, apply_layer = -1, apply_rows = 0;
    const char *apply_module = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max-rank") && i + 1 < argc)
            max_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--apply") && i + 3 < argc)
            apply_layer = atoi(argv[i + 1]), apply_module = argv[i + 2], apply_rows = atoi(argv[i + 3]), i += 3;
        else if (!dir)
            dir = argv[i];
        else
            config = argv[i];
    }
    if (!dir || !config) {
        fprintf(stderr, "usage: lora_info ADAPTER_DIR CONFIG.json|MODEL_DIR [--max-rank N] "
                        "[--apply LAYER MODULE ROWS]\n");
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
    printf("]");
    int m = -1;
    for (int k = 0; apply_module && k < PG_LORA_N_MODULES; k++)
        if (!strcmp(apply_module, pg_lora_module_name(k))) m = k;
    const bool apply_ok = !apply_module || (m >= 0 && apply_layer >= 0 && apply_layer < ad->n_layers &&
                                            apply_rows >= 2 && print_apply(ad, apply_layer, m, apply_rows) == 0);
    printf("}\n");
    pg_lora_adapter_free(ad);
    if (!apply_ok) return fprintf(stderr, "--apply %s: %s\n", apply_module, pg_err_msg()), 1;
    return 0;
}
