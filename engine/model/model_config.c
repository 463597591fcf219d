// engine/model/model_config.c - model architecture from GGUF metadata or config.json.
#include "engine/model/model_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "formats/gguf.h"
#include "engine/model/int4_ckpt.h"

// --- GGUF ------------------------------------------------------------------------

static int gguf_int(const gguf_file *f, const char *arch, const char *suffix, int64_t *out,
                    bool required) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_i64(f, key, out);
    if (rc == PG_ENOTFOUND && !required) return 0;
    if (rc < 0) return pg_err_set(rc, "%s: metadata %s: %s", f->path, key, pg_err_msg());
    return 0;
}

static int gguf_float(const gguf_file *f, const char *arch, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    int rc = gguf_get_f64(f, key, &v);
    if (rc == PG_ENOTFOUND) return 0;
    if (rc < 0) return pg_err_set(rc, "%s: metadata %s: %s", f->path, key, pg_err_msg());
    *out = (float)v;
    return 0;
}

// Gemma's GGUF keys, as llama.cpp reads them: the window
// (<arch>.attention.sliding_window; none or 0: every layer global); Gemma
// 3: every 6th layer global with the others at RoPE base 10000; Gemma 2:
// every 2nd, one RoPE base, and the soft-caps (attn_logit_softcapping,
// final_logit_softcapping). No query_pre_attn_scalar key: head_dim, but
// hidden / heads for the 27Bs (62 layers for Gemma 3, 46 for Gemma 2, as
// their own configs say). Norms are stored as 1 + w.
static int gguf_gemma(const gguf_file *f, const char *arch, pg_model_config *c) {
    const bool g2 = !strcmp(arch, "gemma2");
    int64_t win = 0;
    PG_TRY(gguf_int(f, arch, "attention.sliding_window", &win, false));
    if (win < 0 || win > INT32_MAX) return pg_err_set(PG_EFORMAT, "%s: sliding window %lld", f->path, (long long)win);
    PG_TRY(gguf_float(f, arch, "final_logit_softcapping", &c->final_softcap));
    PG_TRY(gguf_float(f, arch, "attn_logit_softcapping", &c->attn_softcap));
    if (c->final_softcap < 0 || c->attn_softcap < 0)
        return pg_err_set(PG_EFORMAT, "%s: negative soft-capping", f->path);
    c->swa_window = (int32_t)win;
    const int32_t pattern = g2 ? 2 : 6;
    for (int32_t l = 0; l < c->n_layers && l < PG_MAX_LAYERS; l++) pg_config_set_local(c, l, (l + 1) % pattern != 0);
    c->rope_local_theta = g2 ? c->rope_theta : 10000.0f;
    if (c->head_dim == 0 && c->n_heads > 0) c->head_dim = c->hidden / c->n_heads;
    const bool big = c->n_layers == (g2 ? 46 : 62);
    c->attn_scalar = big && c->n_heads > 0 ? (float)(c->hidden / c->n_heads) : (float)c->head_dim;
    c->embed_scale = sqrtf((float)c->hidden);
    return 0;
}

static void config_defaults(pg_model_config *c) {
    memset(c, 0, sizeof *c);
    c->rms_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->bos_id = -1;
    c->max_pos = 2048;
    c->moe_step = 1;
}

int pg_config_from_gguf(const gguf_file *f, pg_model_config *c) {
    config_defaults(c);
    char *arch = NULL;
    int rc = gguf_get_str(f, "general.architecture", &arch);
    if (rc < 0) return pg_err_set(PG_EFORMAT, "%s: no general.architecture", f->path);
    if (strcmp(arch, "llama") && strcmp(arch, "mistral") && strcmp(arch, "qwen2") &&
        strcmp(arch, "qwen3") && strcmp(arch, "qwen3moe") && strcmp(arch, "gemma2") && strcmp(arch, "gemma3")) {
        rc = pg_err_set(PG_EUNSUPP,
                        "%s: architecture '%s' is not supported (llama, mistral, qwen2, qwen3, qwen3moe, gemma2, "
                        "gemma3)",
                        f->path, arch);
        free(arch);
        return rc;
    }
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    c->qkv_bias = !strcmp(arch, "qwen2");
    c->qk_norm = !strcmp(arch, "qwen3") || !strcmp(arch, "qwen3moe") || !strcmp(arch, "gemma3");
    char *name = NULL;
    if (gguf_get_str(f, "general.name", &name) == 0) snprintf(c->name, sizeof c->name, "%s", name);
    free(name);

    int64_t v;
    struct {
        const char *key;
        int32_t *dst;
        bool required;
    } ints[] = {
        {"embedding_length", &c->hidden, true},
        {"block_count", &c->n_layers, true},
        {"attention.head_count", &c->n_heads, true},
        {"attention.head_count_kv", &c->n_kv_heads, false},
        {"feed_forward_length", &c->ffn, true},
        {"context_length", &c->max_pos, false},
        {"rope.dimension_count", &c->rope_dim, false},
        {"vocab_size", &c->vocab_size, false},
        {"attention.key_length", &c->head_dim, false},
        // Mixtral is "llama" with experts (its experts' width is
        // feed_forward_length); Qwen3-MoE has its own key for it.
        {"expert_count", &c->n_experts, false},
        {"expert_used_count", &c->n_experts_used, false},
        {"expert_feed_forward_length", &c->moe_ffn, false},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        v = -1;
        rc = gguf_int(f, arch, ints[i].key, &v, ints[i].required);
        if (rc < 0) goto out;
        if (v > INT32_MAX || v < -1) {
            rc = pg_err_set(PG_EFORMAT, "%s: %s.%s = %lld is out of range", f->path, arch,
                            ints[i].key, (long long)v);
            goto out;
        }
        if (v >= 0) *ints[i].dst = (int32_t)v;
    }
    if ((rc = gguf_float(f, arch, "attention.layer_norm_rms_epsilon", &c->rms_eps)) < 0) goto out;
    if ((rc = gguf_float(f, arch, "rope.freq_base", &c->rope_theta)) < 0) goto out;
    float factor = 0;
    if ((rc = gguf_float(f, arch, "rope.scaling.factor", &factor)) < 0) goto out;
    char *stype = NULL;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (gguf_get_str(f, key, &stype) == 0 && !strcmp(stype, "linear") && factor > 0) {
        c->rope_scaling = PG_ROPE_SCALING_LINEAR;
        c->rope_factor = factor;
    }
    free(stype);
    if (c->n_experts > 0) {
        if (c->moe_ffn == 0) c->moe_ffn = c->ffn;
        // llama.cpp: Mixtral always renormalises; others say so (Qwen3-MoE: true).
        c->moe_renorm = true;
        snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
        bool norm;
        if (strcmp(arch, "llama") && gguf_get_bool(f, key, &norm) == 0) c->moe_renorm = norm;
    }
    if (c->n_kv_heads == 0) c->n_kv_heads = c->n_heads;
    if (pg_config_is_gemma(c) && (rc = gguf_gemma(f, arch, c)) < 0) goto out;
    if (c->vocab_size == 0) {
        const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
        if (toks && toks->type == GGUF_TYPE_ARRAY && toks->arr_count <= INT32_MAX)
            c->vocab_size = (int32_t)toks->arr_count;
    }
    if (c->head_dim == 0 && c->n_heads > 0) c->head_dim = c->hidden / c->n_heads;
    if (c->rope_dim == 0) c->rope_dim = c->head_dim;
    // No separate output.weight means the LM head is the embedding (tied).
    c->tie_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    int64_t id;
    if (gguf_get_i64(f, "tokenizer.ggml.bos_token_id", &id) == 0) c->bos_id = (int32_t)id;
    if (gguf_get_i64(f, "tokenizer.ggml.eos_token_id", &id) == 0) c->eos_ids[c->n_eos++] = (int32_t)id;
    // Chat models often end turns with a separate end-of-turn token.
    if (gguf_get_i64(f, "tokenizer.ggml.eot_token_id", &id) == 0 &&
        (c->n_eos == 0 || c->eos_ids[0] != (int32_t)id))
        c->eos_ids[c->n_eos++] = (int32_t)id;
    // Gemma's turns end with <end_of_turn>, which its GGUF files do not mark
    // (llama.cpp finds it by its text, as here); HF directories list it in
    // generation_config.json.
    if (pg_config_is_gemma(c) && c->n_eos < PG_MAX_EOS_IDS) {
        const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
        for (uint64_t i = 0; toks && toks->type == GGUF_TYPE_ARRAY && i < toks->arr_count && i <= INT32_MAX; i++)
            if (gguf_str_eq(gguf_arr_str(toks, i), "<end_of_turn>")) {
                c->eos_ids[c->n_eos++] = (int32_t)i;
                break;
            }
    }
    rc = pg_config_validate(c);
    if (rc < 0) pg_err_wrap(rc, "%s: ", f->path);
out:
    free(arch);
    return rc;
}

// --- Hugging Face config.json ----------------------------------------------------

static int json_int(const cJSON *o, const char *key, int32_t *dst, bool required, const char *path) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        if (required) return pg_err_set(PG_EFORMAT, "%s: missing \"%s\"", path, key);
        return 0;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
        it->valuedouble > INT32_MAX)
        return pg_err_set(PG_EFORMAT, "%s: \"%s\" must be a non-negative integer", path, key);
    *dst = (int32_t)it->valuedouble;
    return 0;
}

static int json_float(const cJSON *o, const char *key, float *dst, const char *path) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) return 0;
    if (!cJSON_IsNumber(it)) return pg_err_set(PG_EFORMAT, "%s: \"%s\" must be a number", path, key);
    *dst = (float)it->valuedouble;
    return 0;
}

// eos_token_id may be an integer or a list of integers.
static void json_eos(const cJSON *o, pg_model_config *c) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id");
    if (cJSON_IsNumber(it)) {
        c->n_eos = 1;
        c->eos_ids[0] = it->valueint;
    } else if (cJSON_IsArray(it)) {
        c->n_eos = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, it) if (cJSON_IsNumber(e) && c->n_eos < PG_MAX_EOS_IDS)
            c->eos_ids[c->n_eos++] = e->valueint;
    }
}

static int load_json(const char *path, cJSON **out) {
    char *text;
    size_t len;
    PG_TRY(pg_read_file(path, 16u << 20, &text, &len));
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    if (!*out || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return pg_err_set(PG_EFORMAT, "%s: not a JSON object", path);
    }
    return 0;
}

// The experts of a Mixtral (num_local_experts of width intermediate_size,
// always renormalised) or a Qwen3-MoE (num_experts of width
// moe_intermediate_size, norm_topk_prob, every decoder_sparse_step-th
// layer; intermediate_size is then the dense layers' width).
static int hf_moe(const cJSON *j, const char *arch, const char *path, pg_model_config *c) {
    const bool mixtral = !strcmp(arch, "mixtral");
    if (!mixtral && strcmp(arch, "qwen3moe")) return 0;
    c->moe_step = 1;
    // Qwen3-MoE's own configs say num_experts; transformers 5 writes
    // num_local_experts for both.
    const bool local = cJSON_GetObjectItemCaseSensitive(j, "num_local_experts") != NULL;
    PG_TRY(json_int(j, mixtral || local ? "num_local_experts" : "num_experts", &c->n_experts, true, path));
    PG_TRY(json_int(j, "num_experts_per_tok", &c->n_experts_used, true, path));
    if (mixtral) {
        c->moe_ffn = c->ffn;
        c->moe_renorm = true;
        return 0;
    }
    PG_TRY(json_int(j, "moe_intermediate_size", &c->moe_ffn, true, path));
    PG_TRY(json_int(j, "decoder_sparse_step", &c->moe_step, false, path));
    c->moe_renorm = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "norm_topk_prob"));
    // mlp_only_layers: indices of layers that keep the dense MLP (as
    // transformers' Qwen3MoeDecoderLayer: not listed and every
    // decoder_sparse_step-th, the experts).
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers"), *it;
    if (only && !cJSON_IsNull(only) && !cJSON_IsArray(only))
        return pg_err_set(PG_EFORMAT, "%s: mlp_only_layers must be a list of layer indices", path);
    cJSON_ArrayForEach(it, only) {
        const double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (v < 0 || v >= c->n_layers || v >= PG_MAX_LAYERS || v != (double)(int32_t)v)
            return pg_err_set(PG_EFORMAT, "%s: mlp_only_layers holds %s, not a layer index below %d", path,
                              cJSON_IsNumber(it) ? "an out-of-range number" : "a non-number", c->n_layers);
        const int32_t l = (int32_t)v;
        c->mlp_only[l / 8] |= (uint8_t)(1u << (l % 8));
        c->has_mlp_only = true;
    }
    return 0;
}

// A rope_scaling object (or transformers 5's rope_parameters): llama3,
// linear or default; NULL or not an object: none.
static int hf_rope_scaling(const cJSON *rs, const char *path, pg_model_config *c) {
    if (!cJSON_IsObject(rs)) return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "";
    PG_TRY(json_float(rs, "factor", &c->rope_factor, path));
    if (!strcmp(type, "llama3")) {
        c->rope_scaling = PG_ROPE_SCALING_LLAMA3;
        c->rope_low_freq_factor = 1.0f;
        c->rope_high_freq_factor = 4.0f;
        c->rope_orig_max_pos = 8192;
        PG_TRY(json_float(rs, "low_freq_factor", &c->rope_low_freq_factor, path));
        PG_TRY(json_float(rs, "high_freq_factor", &c->rope_high_freq_factor, path));
        PG_TRY(json_int(rs, "original_max_position_embeddings", &c->rope_orig_max_pos, false, path));
    } else if (!strcmp(type, "linear")) {
        c->rope_scaling = PG_ROPE_SCALING_LINEAR;
    } else if (strcmp(type, "default") && type[0]) {
        return pg_err_set(PG_EUNSUPP, "%s: rope_scaling type '%s' is not supported", path, type);
    }
    return 0;
}

// Gemma 3's config.json (Gemma3TextConfig): per-layer types (layer_types,
// or every sliding_window_pattern-th layer global in older configs), the
// window, query_pre_attn_scalar, and RoPE per layer type: transformers 5's
// rope_parameters {"full_attention": {...}, "sliding_attention": {...}},
// or transformers 4's rope_theta / rope_local_base_freq / rope_scaling
// (the global layers'). Defaults are transformers' (its config.json omits
// some). Gemma 2 (Gemma2Config): every 2nd layer global by default, one
// RoPE base for both, no q/k norms, and the soft-caps (attn_logit_softcapping,
// final_logit_softcapping). Bidirectional attention is refused.
static int hf_gemma_layers(const cJSON *j, const char *path, pg_model_config *c) {
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (!cJSON_IsArray(types)) {
        int32_t pattern = !strcmp(c->arch, "gemma2") ? 2 : 6;
        PG_TRY(json_int(j, "sliding_window_pattern", &pattern, false, path));
        PG_TRY(json_int(j, "_sliding_window_pattern", &pattern, false, path));
        if (pattern < 1) return pg_err_set(PG_EFORMAT, "%s: sliding_window_pattern %d", path, pattern);
        for (int32_t l = 0; l < c->n_layers && l < PG_MAX_LAYERS; l++)
            pg_config_set_local(c, l, (l + 1) % pattern != 0);
        return 0;
    }
    if (cJSON_GetArraySize(types) != c->n_layers)
        return pg_err_set(PG_EFORMAT, "%s: layer_types has %d entries for %d layers", path,
                          cJSON_GetArraySize(types), c->n_layers);
    int32_t l = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, types) {
        const char *v = cJSON_IsString(t) ? t->valuestring : "";
        if (strcmp(v, "sliding_attention") && strcmp(v, "full_attention"))
            return pg_err_set(PG_EUNSUPP, "%s: layer_types[%d] '%s' is not supported (sliding_attention, "
                              "full_attention)", path, l, v);
        if (l < PG_MAX_LAYERS) pg_config_set_local(c, l, !strcmp(v, "sliding_attention"));
        l++;
    }
    return 0;
}

static int hf_gemma_rope(const cJSON *j, const char *path, pg_model_config *c) {
    c->rope_scaling = PG_ROPE_SCALING_NONE;
    c->rope_factor = 0;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (!strcmp(c->arch, "gemma2")) { // one base for every layer: rope_parameters (transformers 5) or rope_theta
        c->rope_theta = 1e4f;
        PG_TRY(json_float(j, "rope_theta", &c->rope_theta, path));
        if (cJSON_IsObject(rp)) PG_TRY(json_float(rp, "rope_theta", &c->rope_theta, path));
        c->rope_local_theta = c->rope_theta;
        return hf_rope_scaling(cJSON_IsObject(rp) ? rp : cJSON_GetObjectItemCaseSensitive(j, "rope_scaling"), path, c);
    }
    c->rope_theta = 1e6f;
    c->rope_local_theta = 1e4f;
    const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
    const cJSON *local = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
    if (cJSON_IsObject(full)) {
        PG_TRY(json_float(full, "rope_theta", &c->rope_theta, path));
        PG_TRY(hf_rope_scaling(full, path, c));
        if (cJSON_IsObject(local)) {
            PG_TRY(json_float(local, "rope_theta", &c->rope_local_theta, path));
            const cJSON *lt = cJSON_GetObjectItemCaseSensitive(local, "rope_type");
            if (cJSON_IsString(lt) && strcmp(lt->valuestring, "default"))
                return pg_err_set(PG_EUNSUPP, "%s: sliding_attention rope_type '%s' is not supported", path,
                                  lt->valuestring);
        }
        return 0;
    }
    PG_TRY(json_float(j, "rope_theta", &c->rope_theta, path));
    PG_TRY(json_float(j, "rope_local_base_freq", &c->rope_local_theta, path));
    return hf_rope_scaling(cJSON_GetObjectItemCaseSensitive(j, "rope_scaling"), path, c);
}

static int hf_gemma(const cJSON *j, const char *path, pg_model_config *c) {
    const bool g2 = !strcmp(c->arch, "gemma2");
    // Soft-caps: Gemma 2's defaults, Gemma 3 none; null in the file: none.
    c->attn_softcap = g2 ? 50.0f : 0.0f;
    c->final_softcap = g2 ? 30.0f : 0.0f;
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "attn_logit_softcapping"))) c->attn_softcap = 0;
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "final_logit_softcapping"))) c->final_softcap = 0;
    PG_TRY(json_float(j, "attn_logit_softcapping", &c->attn_softcap, path));
    PG_TRY(json_float(j, "final_logit_softcapping", &c->final_softcap, path));
    if (c->attn_softcap < 0 || c->final_softcap < 0) return pg_err_set(PG_EFORMAT, "%s: negative soft-capping", path);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "use_bidirectional_attention")))
        return pg_err_set(PG_EUNSUPP, "%s: use_bidirectional_attention is not supported", path);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_activation");
    if (!cJSON_IsString(act)) act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "gelu_pytorch_tanh"))
        return pg_err_set(PG_EUNSUPP, "%s: activation '%s' is not supported (gelu_pytorch_tanh)", path,
                          act->valuestring);
    if (!cJSON_GetObjectItemCaseSensitive(j, "rms_norm_eps")) c->rms_eps = 1e-6f;
    if (!cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings")) c->tie_embeddings = true;
    c->qk_norm = !g2;
    c->norm_add = 1.0f;
    c->embed_scale = sqrtf((float)c->hidden);
    c->attn_scalar = 256.0f;
    PG_TRY(json_float(j, "query_pre_attn_scalar", &c->attn_scalar, path));
    c->swa_window = 4096;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if (cJSON_IsNull(sw)) c->swa_window = 0;
    PG_TRY(json_int(j, "sliding_window", &c->swa_window, false, path));
    c->sliding_window = 0; // Gemma's window is per layer: no cap on the model length
    PG_TRY(hf_gemma_layers(j, path, c));
    return hf_gemma_rope(j, path, c);
}

// config.json at `config_path`; generation_config.json at `gen_path` when
// that file exists (NULL: none); `name` names the model; `where` prefixes
// validation errors.
static int config_from_hf(const char *config_path, const char *gen_path, const char *name,
                          const char *where, pg_model_config *c) {
    config_defaults(c);
    char *path = pg_xstrdup(config_path);
    cJSON *j = NULL;
    int rc = load_json(path, &j);
    if (rc < 0) goto out;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const char *arch = cJSON_IsString(a0) ? a0->valuestring : "LlamaForCausalLM";
    static const struct {
        const char *hf, *name;
    } archs_known[] = {{"LlamaForCausalLM", "llama"},
                       {"MistralForCausalLM", "mistral"},
                       {"Qwen2ForCausalLM", "qwen2"},
                       {"Qwen3ForCausalLM", "qwen3"},
                       {"MixtralForCausalLM", "mixtral"},
                       {"Qwen3MoeForCausalLM", "qwen3moe"},
                       {"Gemma2ForCausalLM", "gemma2"},
                       {"Gemma3ForCausalLM", "gemma3"}};
    const char *short_name = NULL;
    for (size_t i = 0; i < sizeof archs_known / sizeof archs_known[0]; i++)
        if (!strcmp(arch, archs_known[i].hf)) short_name = archs_known[i].name;
    if (!strcmp(arch, "Gemma3ForConditionalGeneration")) {
        // Its weights live under language_model.* beside a vision tower.
        rc = pg_err_set(PG_EUNSUPP, "%s: Gemma3ForConditionalGeneration (multimodal Gemma 3) is not supported; "
                        "use a text-only Gemma3ForCausalLM checkpoint (gemma-3-270m, gemma-3-1b)", path);
        goto out;
    }
    if (!short_name) {
        rc = pg_err_set(PG_EUNSUPP,
                        "%s: architecture %s is not supported (LlamaForCausalLM, MistralForCausalLM, "
                        "Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM, "
                        "Gemma2ForCausalLM, Gemma3ForCausalLM)",
                        path, arch);
        goto out;
    }
    snprintf(c->arch, sizeof c->arch, "%s", short_name);
    // Qwen2 always has Q/K/V biases; Llama and Qwen3 say so with attention_bias.
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(j, "attention_bias");
    c->qkv_bias = !strcmp(short_name, "qwen2") || cJSON_IsTrue(ab);
    c->qk_norm = !strcmp(short_name, "qwen3") || !strcmp(short_name, "qwen3moe");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "mlp_bias"))) {
        rc = pg_err_set(PG_EUNSUPP, "%s: mlp_bias is not supported", path);
        goto out;
    }
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    const cJSON *usw = cJSON_GetObjectItemCaseSensitive(j, "use_sliding_window");
    // Qwen2/3 configs carry a sliding_window that use_sliding_window turns off.
    if (cJSON_IsNumber(sw) && sw->valuedouble > 0 && !cJSON_IsFalse(usw) &&
        (!strcmp(short_name, "mistral") || !strcmp(short_name, "mixtral") || cJSON_IsTrue(usw)))
        c->sliding_window = sw->valuedouble > INT32_MAX ? INT32_MAX : (int32_t)sw->valuedouble;
    snprintf(c->name, sizeof c->name, "%s", name);
    if ((rc = json_int(j, "vocab_size", &c->vocab_size, true, path)) < 0 ||
        (rc = json_int(j, "hidden_size", &c->hidden, true, path)) < 0 ||
        (rc = json_int(j, "num_hidden_layers", &c->n_layers, true, path)) < 0 ||
        (rc = json_int(j, "num_attention_heads", &c->n_heads, true, path)) < 0 ||
        (rc = json_int(j, "num_key_value_heads", &c->n_kv_heads, false, path)) < 0 ||
        (rc = json_int(j, "head_dim", &c->head_dim, false, path)) < 0 ||
        (rc = json_int(j, "intermediate_size", &c->ffn, true, path)) < 0 ||
        (rc = json_int(j, "max_position_embeddings", &c->max_pos, false, path)) < 0 ||
        (rc = json_float(j, "rms_norm_eps", &c->rms_eps, path)) < 0 ||
        (rc = json_float(j, "rope_theta", &c->rope_theta, path)) < 0)
        goto out;
    if ((rc = hf_moe(j, short_name, path, c)) < 0) goto out;
    if (c->n_kv_heads == 0) c->n_kv_heads = c->n_heads;
    if (c->head_dim == 0 && c->n_heads > 0) c->head_dim = c->hidden / c->n_heads;
    c->rope_dim = c->head_dim;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
    c->tie_embeddings = cJSON_IsTrue(tie);
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(j, "bos_token_id");
    if (cJSON_IsNumber(bos)) c->bos_id = bos->valueint;
    json_eos(j, c);
    // rope_scaling (transformers 4) or rope_parameters (transformers 5, which
    // moves rope_theta inside it); Gemma's are per layer type.
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (pg_config_is_gemma(c)) {
        if ((rc = hf_gemma(j, path, c)) < 0) goto out;
    } else {
        if (!cJSON_IsObject(rs) && cJSON_IsObject(rp)) rs = rp;
        if (cJSON_IsObject(rp) && (rc = json_float(rp, "rope_theta", &c->rope_theta, path)) < 0) goto out;
        if ((rc = hf_rope_scaling(rs, path, c)) < 0) goto out;
    }
    if ((rc = pg_int4_ckpt_config(cJSON_GetObjectItemCaseSensitive(j, "quantization_config"), path, c)) < 0) goto out;
    cJSON_Delete(j);
    j = NULL;
    // generation_config.json is optional: it overrides eos ids and gives
    // default sampling parameters.
    free(path);
    path = gen_path ? pg_xstrdup(gen_path) : NULL;
    if (path && pg_file_exists(path)) {
        if ((rc = load_json(path, &j)) < 0) goto out;
        json_eos(j, c);
        json_float(j, "temperature", &c->default_temperature, path);
        json_float(j, "top_p", &c->default_top_p, path);
        json_int(j, "top_k", &c->default_top_k, false, path);
    }
    rc = pg_config_validate(c);
    if (rc < 0) pg_err_wrap(rc, "%s: ", where);
out:
    cJSON_Delete(j);
    free(path);
    return rc;
}

int pg_config_from_hf_dir(const char *dir, pg_model_config *c) {
    char *path = pg_path_join(dir, "config.json"), *gen = pg_path_join(dir, "generation_config.json");
    const char *base = strrchr(dir, '/');
    int rc = config_from_hf(path, gen, base && base[1] ? base + 1 : dir, dir, c);
    free(path);
    free(gen);
    return rc;
}

int pg_config_from_hf_file(const char *config_path, pg_model_config *c) {
    // The name: the file's base name without ".json" ("llama3-8b-shape").
    const char *base = strrchr(config_path, '/');
    base = base && base[1] ? base + 1 : config_path;
    char name[128];
    snprintf(name, sizeof name, "%s", base);
    size_t n = strlen(name);
    if (n > 5 && !strcmp(name + n - 5, ".json")) name[n - 5] = 0;
    return config_from_hf(config_path, NULL, name, config_path, c);
}

int pg_config_validate(const pg_model_config *c) {
    if (c->hidden <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->ffn <= 0 || c->vocab_size <= 0 || c->head_dim <= 0)
        return pg_err_set(PG_EFORMAT, "model shape has a zero dimension");
    if (c->n_heads % c->n_kv_heads)
        return pg_err_set(PG_EFORMAT, "%d attention heads are not a multiple of %d KV heads",
                          c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 || c->head_dim > 512)
        return pg_err_set(PG_EUNSUPP, "head dimension %d is not supported", c->head_dim);
    if (c->rope_dim != c->head_dim)
        return pg_err_set(PG_EUNSUPP, "partial rotary embedding (%d of %d) is not supported",
                          c->rope_dim, c->head_dim);
    if (c->n_layers > 1024 || c->hidden > 65536 || c->ffn > 1 << 20 || c->vocab_size > 1 << 22)
        return pg_err_set(PG_EFORMAT, "model shape is implausibly large");
    if (!(c->rms_eps > 0) || !(c->rope_theta > 0))
        return pg_err_set(PG_EFORMAT, "rms_norm_eps and rope_theta must be positive");
    if (c->n_experts > 0) {
        if (c->moe_step <= 0 || c->moe_step > c->n_layers)
            return pg_err_set(PG_EFORMAT, "decoder_sparse_step %d for %d layers", c->moe_step, c->n_layers);
        if (c->n_experts > 1024 || c->n_experts_used < 1 || c->n_experts_used > c->n_experts)
            return pg_err_set(PG_EFORMAT, "%d experts with %d used per token", c->n_experts, c->n_experts_used);
        if (c->moe_ffn <= 0 || c->moe_ffn > 1 << 20)
            return pg_err_set(PG_EFORMAT, "expert FFN width %d", c->moe_ffn);
    }
    return 0;
}

void pg_config_params(const pg_model_config *c, int64_t *total, int64_t *active) {
    const int64_t H = c->hidden, hd = c->head_dim;
    // The layer's two norms (Gemma: four, the post-norms too).
    const int64_t n_norms = pg_config_is_gemma(c) ? 4 : 2;
    const int64_t attn = H * hd * (2 * (int64_t)c->n_heads + 2 * (int64_t)c->n_kv_heads) + n_norms * H;
    const int64_t dense = 3 * H * c->ffn, expert = 3 * H * c->moe_ffn;
    const int64_t emb = (int64_t)c->vocab_size * H * (c->tie_embeddings ? 1 : 2) + H;
    *total = *active = emb;
    for (int32_t l = 0; l < c->n_layers; l++) {
        if (pg_config_layer_is_moe(c, l)) {
            *total += attn + (int64_t)c->n_experts * (expert + H);
            *active += attn + (int64_t)c->n_experts_used * expert + (int64_t)c->n_experts * H;
        } else {
            *total += attn + dense;
            *active += attn + dense;
        }
    }
}

void pg_config_rope_inv_freq_local(const pg_model_config *c, float *inv_freq) {
    pg_model_config l = *c;
    l.rope_theta = c->rope_local_theta;
    l.rope_scaling = PG_ROPE_SCALING_NONE;
    pg_config_rope_inv_freq(&l, inv_freq);
}

void pg_config_rope_inv_freq(const pg_model_config *c, float *inv_freq) {
    int32_t half = c->rope_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        double f = 1.0 / pow((double)c->rope_theta, (2.0 * i) / c->rope_dim);
        if (c->rope_scaling == PG_ROPE_SCALING_LINEAR && c->rope_factor > 0) {
            f /= c->rope_factor;
        } else if (c->rope_scaling == PG_ROPE_SCALING_LLAMA3) {
            // Llama 3.1: keep high frequencies, divide low ones by `factor`,
            // interpolate smoothly in between.
            double low_wl = c->rope_orig_max_pos / c->rope_low_freq_factor;
            double high_wl = c->rope_orig_max_pos / c->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f /= c->rope_factor;
            } else if (wl >= high_wl) {
                double smooth = (c->rope_orig_max_pos / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}
