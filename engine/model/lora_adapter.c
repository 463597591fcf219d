// engine/model/lora_adapter.c - reads a PEFT LoRA adapter directory
// (engine/model/lora_adapter.h; what is accepted: docs/lora.md).
//
// adapter_config.json first (what the adapter claims: rank, alpha, the
// target modules), then every tensor of adapter_model.safetensors must be
// the lora_A or lora_B of a targeted projection of a layer the base model
// has, with that projection's shapes. Options that change the arithmetic
// beyond scale * B . A (per-module ranks, DoRA, biases, extra trained
// modules) are refused rather than half-applied: an adapter that loads
// computes what PEFT computes.
#include <cjson/cJSON.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "engine/model/lora_adapter.h"
#include "engine/model/model.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "kernels/dtype.h"

static const char *const MODULE_NAMES[PG_LORA_N_MODULES] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                            "gate_proj", "up_proj", "down_proj"};
// The submodule of a decoder layer each projection lives in.
static const char *const MODULE_PARENTS[PG_LORA_N_MODULES] = {"self_attn", "self_attn", "self_attn", "self_attn",
                                                              "mlp",       "mlp",       "mlp"};
#define ALL_MODULES ((1u << PG_LORA_N_MODULES) - 1)

const char *pg_lora_module_name(int module) {
    return module >= 0 && module < PG_LORA_N_MODULES ? MODULE_NAMES[module] : "?";
}

static int module_index(const char *name) {
    for (int m = 0; m < PG_LORA_N_MODULES; m++)
        if (!strcmp(name, MODULE_NAMES[m])) return m;
    return -1;
}

// The base model's projection shapes: out x in of module m.
static void module_shape(const pg_model_config *c, int m, int64_t *out, int64_t *in) {
    const int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    switch (m) {
    case PG_LORA_Q: *out = q, *in = c->hidden; break;
    case PG_LORA_K:
    case PG_LORA_V: *out = kv, *in = c->hidden; break;
    case PG_LORA_O: *out = c->hidden, *in = q; break;
    case PG_LORA_GATE:
    case PG_LORA_UP: *out = c->ffn, *in = c->hidden; break;
    default: *out = c->hidden, *in = c->ffn; break;
    }
}

// --- adapter_config.json ----------------------------------------------------------------

// A string target_modules is a regular expression PEFT fully matches
// against each module's path ("model.layers.3.self_attn.q_proj"); matched
// here as a POSIX extended one (the common subset), over every layer.
static int targets_from_regex(const char *re, const pg_model_config *cfg, const char *path, uint32_t *mask) {
    if (!strcmp(re, "all-linear")) return *mask = ALL_MODULES, 0;
    const int m0 = module_index(re);
    if (m0 >= 0) return *mask = 1u << m0, 0;
    char *anchored = malloc(strlen(re) + 5);
    sprintf(anchored, "^(%s)$", re);
    regex_t rx;
    const int bad = regcomp(&rx, anchored, REG_EXTENDED | REG_NOSUB);
    free(anchored);
    if (bad)
        return pg_err_set(PG_EUNSUPP, "%s: target_modules \"%s\" is not a POSIX extended regular expression",
                          path, re);
    char name[128];
    for (int32_t l = 0; l < cfg->n_layers; l++)
        for (int m = 0; m < PG_LORA_N_MODULES; m++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.%s", l, MODULE_PARENTS[m], MODULE_NAMES[m]);
            if (regexec(&rx, name, 0, NULL, 0) == 0) *mask |= 1u << m;
        }
    regfree(&rx);
    if (!*mask) return pg_err_set(PG_EINVAL, "%s: target_modules \"%s\" matches no projection of the model", path, re);
    return 0;
}

static int read_targets(const cJSON *j, const pg_model_config *cfg, const char *path, uint32_t *mask) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    *mask = 0;
    if (cJSON_IsString(t)) return targets_from_regex(t->valuestring, cfg, path, mask);
    if (!cJSON_IsArray(t) || cJSON_GetArraySize(t) == 0)
        return pg_err_set(PG_EFORMAT, "%s: target_modules is missing or not a list of module names", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, t) {
        if (!cJSON_IsString(e)) return pg_err_set(PG_EFORMAT, "%s: target_modules holds a non-string", path);
        const int m = module_index(e->valuestring);
        if (m < 0)
            return pg_err_set(PG_EUNSUPP,
                              "%s: target module '%s' is not supported (q_proj k_proj v_proj o_proj gate_proj "
                              "up_proj down_proj are)",
                              path, e->valuestring);
        *mask |= 1u << m;
    }
    return 0;
}

// True when the key is absent, null, false, an empty object/list/string.
static bool unset(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return true;
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) return cJSON_GetArraySize(v) == 0;
    return cJSON_IsString(v) && !v->valuestring[0];
}

// The options that would change the product beyond scale * B . A.
static int refuse_unsupported(const cJSON *j, const char *path) {
    static const struct {
        const char *key, *why;
    } refused[] = {
        {"rank_pattern", "per-module ranks (rank_pattern) are not supported"},
        {"alpha_pattern", "per-module alphas (alpha_pattern) are not supported"},
        {"fan_in_fan_out", "fan_in_fan_out (transposed Conv1D weights) is not supported"},
        {"modules_to_save", "modules_to_save (fully trained extra modules) is not supported"},
        {"use_dora", "DoRA (use_dora) is not supported"},
        {"lora_bias", "a bias on lora_B (lora_bias) is not supported"},
        {"layer_replication", "layer_replication is not supported"},
        {"use_qalora", "QA-LoRA (use_qalora) is not supported"},
        {"alora_invocation_tokens", "activated LoRA (alora_invocation_tokens) is not supported"},
        {"trainable_token_indices", "trained token embeddings (trainable_token_indices) are not supported"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (!unset(j, refused[i].key)) return pg_err_set(PG_EUNSUPP, "%s: %s", path, refused[i].why);
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    if (pt && !(cJSON_IsString(pt) && !strcmp(pt->valuestring, "LORA")))
        return pg_err_set(PG_EUNSUPP, "%s: peft_type is %s, only LORA is supported", path,
                          cJSON_IsString(pt) ? pt->valuestring : "not a string");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(j, "bias");
    if (bias && !cJSON_IsNull(bias) && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none")))
        return pg_err_set(PG_EUNSUPP, "%s: bias must be \"none\" (trained biases are not supported)", path);
    return 0;
}

static int read_config(pg_lora_adapter *ad, const pg_model_config *cfg, int32_t max_rank, const char *path) {
    if (!pg_file_exists(path)) return pg_err_set(PG_ENOTFOUND, "%s: no such file", path);
    char *text;
    size_t len;
    PG_TRY(pg_read_file(path, 16u << 20, &text, &len));
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) return pg_err_set(PG_EFORMAT, "%s: not valid JSON", path);
    int rc = 0;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(j, "base_model_name_or_path");
    if (!cJSON_IsObject(j))
        rc = pg_err_set(PG_EFORMAT, "%s: not a JSON object", path);
    else if (!r)
        rc = pg_err_set(PG_EFORMAT, "%s: r is missing", path);
    else if (!cJSON_IsNumber(r) || r->valuedouble != floor(r->valuedouble) || r->valuedouble < 1 ||
             r->valuedouble > 65536)
        rc = pg_err_set(PG_EFORMAT, "%s: r must be a positive integer", path);
    else if (r->valuedouble > max_rank)
        rc = pg_err_set(PG_EINVAL, "%s: r = %d is above the largest rank allowed (%d)", path, (int)r->valuedouble,
                        max_rank);
    else if (!alpha)
        rc = pg_err_set(PG_EFORMAT, "%s: lora_alpha is missing", path);
    else if (!cJSON_IsNumber(alpha))
        rc = pg_err_set(PG_EFORMAT, "%s: lora_alpha must be a number", path);
    else if ((rc = refuse_unsupported(j, path)) == 0 && (rc = read_targets(j, cfg, path, &ad->module_mask)) == 0) {
        ad->rank = (int32_t)r->valuedouble;
        ad->alpha = (float)alpha->valuedouble;
        ad->rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "use_rslora"));
        // PEFT: scaling = lora_alpha / sqrt(r) with rsLoRA, lora_alpha / r otherwise.
        ad->scale = (float)(alpha->valuedouble / (ad->rslora ? sqrt((double)ad->rank) : (double)ad->rank));
        ad->base_model = pg_xstrdup(cJSON_IsString(base) ? base->valuestring : "");
    }
    cJSON_Delete(j);
    return rc;
}

// --- adapter_model.safetensors ----------------------------------------------------------

// Splits "base_model.model.model.layers.{L}.{self_attn|mlp}.{module}.lora_{A|B}.weight";
// false when the name is not of that form.
static bool parse_name(const char *name, int32_t *layer, int *module, int *is_b) {
    static const char prefix[] = "base_model.model.model.layers.";
    if (strncmp(name, prefix, sizeof prefix - 1)) return false;
    const char *p = name + sizeof prefix - 1;
    char *end;
    const long l = strtol(p, &end, 10);
    if (end == p || *end != '.' || l < 0 || l > 1000000) return false;
    p = end + 1;
    for (int m = 0; m < PG_LORA_N_MODULES; m++) {
        char want[64];
        snprintf(want, sizeof want, "%s.%s.lora_", MODULE_PARENTS[m], MODULE_NAMES[m]);
        const size_t n = strlen(want);
        if (strncmp(p, want, n) || (p[n] != 'A' && p[n] != 'B') || strcmp(p + n + 1, ".weight")) continue;
        *layer = (int32_t)l, *module = m, *is_b = p[n] == 'B';
        return true;
    }
    return false;
}

// Places tensor t as the A or B of its layer's module, checking its shape.
static int place_tensor(pg_lora_adapter *ad, const pg_model_config *cfg, const pg_st_tensor *t, const char *path) {
    int32_t l;
    int m, is_b;
    if (!parse_name(t->name, &l, &m, &is_b))
        return pg_err_set(PG_EUNSUPP, "%s: tensor '%s' is not the lora_A or lora_B of a supported projection", path,
                          t->name);
    if (l >= cfg->n_layers)
        return pg_err_set(PG_EINVAL, "%s: tensor '%s' is for layer %d, the model has %d", path, t->name, l,
                          cfg->n_layers);
    if (!(ad->module_mask & (1u << m)))
        return pg_err_set(PG_EINVAL, "%s: tensor '%s' is for %s, which target_modules does not name", path, t->name,
                          MODULE_NAMES[m]);
    if (t->dtype != PG_DTYPE_F32 && t->dtype != PG_DTYPE_F16 && t->dtype != PG_DTYPE_BF16)
        return pg_err_set(PG_EUNSUPP, "%s: tensor '%s' is %s, LoRA weights must be F32, F16 or BF16", path, t->name,
                          pg_dtype_name(t->dtype));
    int64_t out, in;
    module_shape(cfg, m, &out, &in);
    const int64_t rows = is_b ? out : ad->rank, cols = is_b ? ad->rank : in;
    if (t->n_dims != 2 || (int64_t)t->shape[0] != rows || (int64_t)t->shape[1] != cols) {
        char got[64] = "";
        for (uint32_t d = 0; d < t->n_dims; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", d ? "x" : "",
                     (unsigned long long)t->shape[d]);
        return pg_err_set(PG_EINVAL, "%s: tensor '%s' is %s, expected %lldx%lld", path, t->name,
                          t->n_dims ? got : "a scalar", (long long)rows, (long long)cols);
    }
    pg_weight *w = &ad->views[((size_t)l * PG_LORA_N_MODULES + (size_t)m) * 2 + (size_t)is_b];
    *w = (pg_weight){.data = t->data, .dtype = t->dtype, .rows = rows, .cols = cols,
                     .row_bytes = pg_dtype_row_bytes(t->dtype, cols)};
    if (is_b)
        ad->layers[l].b[m] = w;
    else
        ad->layers[l].a[m] = w;
    return 0;
}

// Every A has its B and every B its A; counts the pairs.
static int check_pairs(pg_lora_adapter *ad, const char *path) {
    for (int32_t l = 0; l < ad->n_layers; l++)
        for (int m = 0; m < PG_LORA_N_MODULES; m++) {
            const bool a = ad->layers[l].a[m] != NULL, b = ad->layers[l].b[m] != NULL;
            if (a != b)
                return pg_err_set(PG_EFORMAT, "%s: tensor 'base_model.model.model.layers.%d.%s.%s.lora_%c.weight' is "
                                  "missing (its lora_%c is there)",
                                  path, l, MODULE_PARENTS[m], MODULE_NAMES[m], a ? 'B' : 'A', a ? 'A' : 'B');
            ad->n_pairs += a;
        }
    if (!ad->n_pairs) return pg_err_set(PG_EFORMAT, "%s: holds no LoRA tensors", path);
    return 0;
}

static int read_weights(pg_lora_adapter *ad, const pg_model_config *cfg, const char *path) {
    if (!pg_file_exists(path)) return pg_err_set(PG_ENOTFOUND, "%s: no such file", path);
    PG_TRY(pg_st_open(path, &ad->st));
    ad->n_layers = cfg->n_layers;
    ad->layers = pg_xcalloc((size_t)cfg->n_layers, sizeof *ad->layers);
    ad->views = pg_xcalloc((size_t)cfg->n_layers * PG_LORA_N_MODULES * 2, sizeof *ad->views);
    for (uint64_t i = 0; i < ad->st->n_tensors; i++) PG_TRY(place_tensor(ad, cfg, &ad->st->tensors[i], path));
    return check_pairs(ad, path);
}

// --- llama.cpp's GGUF LoRA file -----------------------------------------------------------

// GGUF tensor names of the projections, in pg_lora_module order.
static const char *const GGUF_NAMES[PG_LORA_N_MODULES] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                          "ffn_gate", "ffn_up", "ffn_down"};

// Splits "blk.{L}.{name}.weight.lora_{a|b}"; false when not of that form.
static bool parse_gguf_name(gguf_str s, int32_t *layer, int *module, int *is_b) {
    char name[128];
    if (s.len >= sizeof name) return false;
    memcpy(name, s.ptr, s.len);
    name[s.len] = 0;
    if (strncmp(name, "blk.", 4)) return false;
    char *end;
    const long l = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || l < 0 || l > 1000000) return false;
    for (int m = 0; m < PG_LORA_N_MODULES; m++) {
        char want[64];
        snprintf(want, sizeof want, ".%s.weight.lora_", GGUF_NAMES[m]);
        const size_t n = strlen(want);
        if (strncmp(end, want, n) || (end[n] != 'a' && end[n] != 'b') || end[n + 1]) continue;
        *layer = (int32_t)l, *module = m, *is_b = end[n] == 'b';
        return true;
    }
    return false;
}

// Keeps a copy made at load until the adapter is freed.
static void own(pg_lora_adapter *ad, void *p) {
    ad->owned = pg_xrealloc(ad->owned, sizeof(void *) * (size_t)(ad->n_owned + 1));
    ad->owned[ad->n_owned++] = p;
}

static int read_gguf(pg_lora_adapter *ad, const pg_model_config *cfg, int32_t max_rank, const char *path) {
    PG_TRY(gguf_open(path, &ad->gg));
    const gguf_file *f = ad->gg;
    char *type = NULL, *atype = NULL, *arch = NULL;
    double alpha = 0;
    int rc = gguf_get_str(f, "general.type", &type);
    if (rc == 0 && strcmp(type, "adapter"))
        rc = pg_err_set(PG_EFORMAT, "%s: general.type is '%s', not a LoRA adapter ('adapter')", path, type);
    else if (rc < 0)
        rc = pg_err_set(PG_EFORMAT, "%s: no general.type: not a LoRA adapter", path);
    if (rc == 0 && (gguf_get_str(f, "adapter.type", &atype) < 0 || strcmp(atype, "lora")))
        rc = pg_err_set(PG_EUNSUPP, "%s: adapter.type is '%s', only 'lora' is supported", path,
                        atype ? atype : "(missing)");
    if (rc == 0 && gguf_get_f64(f, "adapter.lora.alpha", &alpha) < 0)
        rc = pg_err_set(PG_EFORMAT, "%s: adapter.lora.alpha is missing", path);
    if (rc == 0 && gguf_get_str(f, "general.architecture", &arch) < 0) arch = pg_xstrdup("");
    ad->n_layers = cfg->n_layers;
    ad->layers = pg_xcalloc((size_t)cfg->n_layers, sizeof *ad->layers);
    ad->views = pg_xcalloc((size_t)cfg->n_layers * PG_LORA_N_MODULES * 2, sizeof *ad->views);
    ad->base_model = pg_xstrdup("");
    for (uint64_t i = 0; rc == 0 && i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        int32_t l;
        int m, is_b;
        if (!parse_gguf_name(t->name, &l, &m, &is_b)) {
            rc = pg_err_set(PG_EUNSUPP, "%s: tensor '%.*s' is not the lora_a or lora_b of a supported projection",
                            path, (int)t->name.len, t->name.ptr);
            break;
        }
        if (l >= cfg->n_layers) {
            rc = pg_err_set(PG_EINVAL, "%s: tensor '%.*s' is for layer %d, the model has %d", path, (int)t->name.len,
                            t->name.ptr, l, cfg->n_layers);
            break;
        }
        // F32/F16/BF16 are used as mapped; a GGML block type (convert_lora_to_gguf.py
        // --outtype q8_0 quantizes the A matrices, whose rows are long enough) is
        // dequantized to f32 at load, as llama.cpp's ggml dequantizes it in its product.
        const int qt = (int)t->type;
        const bool plain = qt == PG_DTYPE_F32 || qt == PG_DTYPE_F16 || qt == PG_DTYPE_BF16;
        if (!plain && (pg_dtype_block_elems(qt) == 0 || pg_dtype_has_row_scales(qt))) {
            rc = pg_err_set(PG_EUNSUPP,
                            "%s: tensor '%.*s' is %s, LoRA weights must be F32, F16, BF16 or a GGML block type "
                            "paged dequantizes (Q8_0, Q4_0, Q4_K, ...)",
                            path, (int)t->name.len, t->name.ptr, pg_dtype_name(qt));
            break;
        }
        // dims[0] is the inner dimension: lora_a [in, r] (rows r of in),
        // lora_b [r, out] (rows out of r), as PEFT's A and B.
        const int64_t rank = is_b ? (int64_t)t->dims[0] : (int64_t)t->dims[1];
        if (ad->rank == 0) ad->rank = (int32_t)rank;
        int64_t out, in;
        module_shape(cfg, m, &out, &in);
        const int64_t rows = is_b ? out : ad->rank, cols = is_b ? ad->rank : in;
        if (rank > max_rank) {
            rc = pg_err_set(PG_EINVAL, "%s: rank %lld is above the largest rank allowed (%d)", path, (long long)rank,
                            max_rank);
        } else if (t->n_dims != 2 || (int64_t)t->dims[1] != rows || (int64_t)t->dims[0] != cols) {
            rc = pg_err_set(PG_EINVAL, "%s: tensor '%.*s' is %llux%llu (rows x cols), expected %lldx%lld", path,
                            (int)t->name.len, t->name.ptr, (unsigned long long)t->dims[1],
                            (unsigned long long)t->dims[0], (long long)rows, (long long)cols);
        }
        if (rc < 0) break;
        pg_weight *w = &ad->views[((size_t)l * PG_LORA_N_MODULES + (size_t)m) * 2 + (size_t)is_b];
        const size_t row_bytes = pg_dtype_row_bytes(qt, cols);
        if (row_bytes == 0) {
            rc = pg_err_set(PG_EINVAL, "%s: tensor '%.*s': rows of %lld do not fit %s's blocks", path,
                            (int)t->name.len, t->name.ptr, (long long)cols, pg_dtype_name(qt));
            break;
        }
        *w = (pg_weight){.data = t->data, .dtype = qt, .rows = rows, .cols = cols, .row_bytes = row_bytes};
        if (!plain) {
            float *deq = pg_xmalloc(sizeof(float) * (size_t)rows * (size_t)cols);
            for (int64_t r = 0; r < rows; r++)
                pg_dequantize_row(qt, (const char *)t->data + (size_t)r * row_bytes, deq + (size_t)r * (size_t)cols,
                                  cols);
            own(ad, deq);
            *w = (pg_weight){.data = deq, .dtype = PG_DTYPE_F32, .rows = rows, .cols = cols,
                             .row_bytes = sizeof(float) * (size_t)cols};
        }
        // llama.cpp's converter permutes q's and k's lora_b rows as the model's.
        if (is_b && !strcmp(arch, "llama") && (m == PG_LORA_Q || m == PG_LORA_K))
            own(ad, pg_model_unpermute_rows(w, m == PG_LORA_Q ? cfg->n_heads : cfg->n_kv_heads));
        if (is_b)
            ad->layers[l].b[m] = w;
        else
            ad->layers[l].a[m] = w;
        ad->module_mask |= 1u << m;
    }
    if (rc == 0) {
        // llama.cpp: scale = alpha / rank (alpha 0: 1).
        ad->alpha = (float)alpha;
        ad->scale = alpha != 0 ? (float)(alpha / ad->rank) : 1.0f;
        rc = check_pairs(ad, path);
    }
    free(type);
    free(atype);
    free(arch);
    return rc;
}

int pg_lora_adapter_load(const char *dir, const pg_model_config *cfg, int32_t max_rank, pg_lora_adapter **out) {
    *out = NULL;
    pg_lora_adapter *ad = pg_xcalloc(1, sizeof *ad);
    ad->dir = pg_xstrdup(dir);
    const size_t n = strlen(dir);
    if (n > 5 && !strcmp(dir + n - 5, ".gguf")) {
        const int rc = read_gguf(ad, cfg, max_rank, dir);
        if (rc < 0) {
            pg_lora_adapter_free(ad);
            return rc;
        }
        *out = ad;
        return 0;
    }
    char *cfg_path = pg_path_join(dir, "adapter_config.json");
    char *st_path = pg_path_join(dir, "adapter_model.safetensors");
    int rc = read_config(ad, cfg, max_rank, cfg_path);
    if (rc == 0) rc = read_weights(ad, cfg, st_path);
    free(cfg_path);
    free(st_path);
    if (rc < 0) {
        pg_lora_adapter_free(ad);
        return rc;
    }
    *out = ad;
    return 0;
}

void pg_lora_adapter_free(pg_lora_adapter *a) {
    if (!a) return;
    pg_st_close(a->st);
    gguf_close(a->gg);
    for (int32_t i = 0; i < a->n_owned; i++) free(a->owned[i]);
    free(a->owned);
    free(a->layers);
    free(a->views);
    free(a->base_model);
    free(a->dir);
    free(a);
}
