// text/tokenizer/tokenizer_load.c - tokenizer loaders: GGUF metadata and Hugging
// Face tokenizer.json (+ tokenizer_config.json).
//
// Both translate their format into the pg_tok_* build calls, so a model
// loaded either way has identical tables. What neither format nor this
// loader can express is refused with PG_EUNSUPP rather than approximated.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "formats/gguf.h"
#include "text/tokenizer/tokenizer_int.h"

static bool is_byte_token_text(const char *s, size_t n) {
    return n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>';
}

// --- GGUF -------------------------------------------------------------------

// Element i of a numeric GGUF array as a double; false for other types.
static bool arr_num(const gguf_kv *kv, uint64_t i, double *v) {
    static const size_t size[] = {
        [GGUF_TYPE_UINT8] = 1, [GGUF_TYPE_INT8] = 1,    [GGUF_TYPE_UINT16] = 2,
        [GGUF_TYPE_INT16] = 2, [GGUF_TYPE_UINT32] = 4,  [GGUF_TYPE_INT32] = 4,
        [GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,  [GGUF_TYPE_STRING] = 0,
        [GGUF_TYPE_ARRAY] = 0, [GGUF_TYPE_UINT64] = 8,  [GGUF_TYPE_INT64] = 8,
        [GGUF_TYPE_FLOAT64] = 8,
    };
    if (kv->arr_type > GGUF_TYPE_FLOAT64 || !size[kv->arr_type] || i >= kv->arr_count) return false;
    const uint8_t *p = kv->arr_data + i * size[kv->arr_type];
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        uint64_t u64;
        int64_t i64;
        double f64;
    } u;
    memcpy(&u, p, size[kv->arr_type]);  // the mapping gives no alignment
    switch (kv->arr_type) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_BOOL: *v = u.u8; break;
    case GGUF_TYPE_INT8: *v = u.i8; break;
    case GGUF_TYPE_UINT16: *v = u.u16; break;
    case GGUF_TYPE_INT16: *v = u.i16; break;
    case GGUF_TYPE_UINT32: *v = u.u32; break;
    case GGUF_TYPE_INT32: *v = u.i32; break;
    case GGUF_TYPE_FLOAT32: *v = u.f32; break;
    case GGUF_TYPE_UINT64: *v = (double)u.u64; break;
    case GGUF_TYPE_INT64: *v = (double)u.i64; break;
    default: *v = u.f64; break;
    }
    return true;
}

// An optional numeric array of exactly n elements: NULL when absent.
static int gguf_num_array(const gguf_file *f, const char *key, uint64_t n, const gguf_kv **out) {
    *out = NULL;
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return PG_OK;
    double v;
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_count != n || (n && !arr_num(kv, 0, &v)))
        return pg_err_set(PG_EFORMAT, "%s: %s is not a numeric array of %llu elements", f->path, key,
                          (unsigned long long)n);
    *out = kv;
    return PG_OK;
}

// An optional token id: -1 when the key is absent.
static int gguf_token_id(const gguf_file *f, const char *key, int32_t *id) {
    uint64_t v;
    int rc = gguf_get_u64(f, key, &v);
    if (rc == PG_ENOTFOUND) return PG_OK;
    if (rc < 0) return rc;
    *id = v > INT32_MAX ? INT32_MAX : (int32_t)v;  // out of range: dropped by finalize
    return PG_OK;
}

static int gguf_opt_bool(const gguf_file *f, const char *key, bool *v) {
    int rc = gguf_get_bool(f, key, v);
    return rc == PG_ENOTFOUND ? PG_OK : rc;
}

static int load_gguf(const gguf_file *f, pg_tokenizer **out) {
    char *model = NULL, *pre = NULL;
    pg_tokenizer *t = NULL;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (rc < 0) goto done;
    pg_tok_kind kind;
    if (strcmp(model, "gpt2") == 0) {
        kind = PG_TOK_BPE_BYTE;
    } else if (strcmp(model, "llama") == 0) {
        kind = PG_TOK_SPM;
    } else {
        rc = pg_err_set(PG_EUNSUPP, "%s: tokenizer model '%s' is not supported (gpt2 and llama are)",
                        f->path, model);
        goto done;
    }
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GGUF_TYPE_ARRAY || toks->arr_type != GGUF_TYPE_STRING ||
        toks->arr_count == 0 || toks->arr_count > INT32_MAX / 4) {
        rc = pg_err_set(PG_EFORMAT, "%s: tokenizer.ggml.tokens missing or not a string array", f->path);
        goto done;
    }
    uint64_t n = toks->arr_count;
    const gguf_kv *scores, *types;
    if ((rc = gguf_num_array(f, "tokenizer.ggml.scores", n, &scores)) < 0) goto done;
    if ((rc = gguf_num_array(f, "tokenizer.ggml.token_type", n, &types)) < 0) goto done;
    if ((rc = pg_tok_alloc(kind, (int32_t)n, &t)) < 0) goto done;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(toks, i);
        double v = PG_TOK_T_NORMAL;
        if (types) arr_num(types, i, &v);
        int type = v >= PG_TOK_T_NORMAL && v <= PG_TOK_T_BYTE ? (int)v : PG_TOK_T_NORMAL;
        if (!types && kind == PG_TOK_SPM && is_byte_token_text(s.ptr, s.len)) type = PG_TOK_T_BYTE;
        if ((rc = pg_tok_set_token(t, (int32_t)i, s.ptr ? s.ptr : "", s.len, type)) < 0) goto done;
        if (scores) {
            arr_num(scores, i, &v);
            t->scores[i] = isfinite(v) ? (float)v : -1e30f;
        }
    }
    if (kind == PG_TOK_SPM) {  // llama.cpp's defaults for SentencePiece models
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
    }
    if ((rc = gguf_token_id(f, "tokenizer.ggml.bos_token_id", &t->bos)) < 0 ||
        (rc = gguf_token_id(f, "tokenizer.ggml.eos_token_id", &t->eos)) < 0 ||
        (rc = gguf_token_id(f, "tokenizer.ggml.unknown_token_id", &t->unk)) < 0 ||
        (rc = gguf_token_id(f, "tokenizer.ggml.padding_token_id", &t->pad)) < 0)
        goto done;
    // Only a real unknown token stands in for untokenizable bytes: many
    // byte-level GGUFs name <|endoftext|> as unknown_token_id.
    if (t->unk >= 0 && t->unk < t->n_vocab && t->type[t->unk] == PG_TOK_T_UNKNOWN) t->unk_fallback = t->unk;
    bool add_bos = kind == PG_TOK_SPM, add_space_prefix = kind == PG_TOK_SPM;
    if (kind == PG_TOK_SPM) {
        t->merge_by_score = true;
        t->byte_fallback = true;
        if ((rc = pg_tok_set_pre_family(t, PG_TOK_PRE_NONE, "")) < 0) goto done;
    } else {
        rc = gguf_get_str(f, "tokenizer.ggml.pre", &pre);
        if (rc == PG_ENOTFOUND) {
            PG_LOGW("%s: no tokenizer.ggml.pre, using the gpt2 pre-tokenizer", f->path);
            pre = strdup("default");
            rc = pre ? PG_OK : pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
        }
        if (rc < 0) goto done;
        pg_tok_pre fam = pg_tok_pre_from_name(pre, &t->ignore_merges, &add_bos);
        if (fam == PG_TOK_PRE_NONE) {
            rc = pg_err_set(PG_EUNSUPP, "%s: pre-tokenizer '%s' is not supported", f->path, pre);
            goto done;
        }
        if ((rc = pg_tok_set_pre_family(t, fam, pre)) < 0) goto done;
    }
    if ((rc = gguf_opt_bool(f, "tokenizer.ggml.add_bos_token", &add_bos)) < 0 ||
        (rc = gguf_opt_bool(f, "tokenizer.ggml.add_space_prefix", &add_space_prefix)) < 0)
        goto done;
    t->add_bos_default = add_bos;
    t->spm_prefix = kind == PG_TOK_SPM && add_space_prefix ? PG_TOK_PREFIX_ALWAYS : PG_TOK_PREFIX_NEVER;
    if ((rc = pg_tok_finalize_vocab(t)) < 0) goto done;
    if (kind == PG_TOK_BPE_BYTE) {
        const gguf_kv *m = gguf_find_kv(f, "tokenizer.ggml.merges");
        if (!m || m->type != GGUF_TYPE_ARRAY || m->arr_type != GGUF_TYPE_STRING) {
            rc = pg_err_set(PG_EFORMAT, "%s: tokenizer.ggml.merges missing or not a string array",
                            f->path);
            goto done;
        }
        if ((rc = pg_tok_reserve_merges(t, m->arr_count)) < 0) goto done;
        uint64_t skipped = 0;
        for (uint64_t i = 0; i < m->arr_count && i < INT32_MAX; i++) {
            gguf_str s = gguf_arr_str(m, i);
            // "left right": the separator is the first space after the first
            // byte (a merge may start with a literal space).
            const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
            if (!sp) {
                skipped++;
                continue;
            }
            size_t alen = (size_t)(sp - s.ptr);
            rc = pg_tok_add_merge(t, s.ptr, alen, sp + 1, s.len - alen - 1, (int32_t)i);
            if (rc < 0) goto done;
            skipped += rc == 0;
        }
        if (skipped) PG_LOGW("%s: %llu merges skipped (malformed or not in the vocabulary)", f->path,
                             (unsigned long long)skipped);
    }
    rc = pg_tok_finalize(t);
done:
    free(model);
    free(pre);
    if (rc < 0) {
        pg_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return PG_OK;
}

int pg_tokenizer_from_gguf(const struct gguf_file *f, pg_tokenizer **out) {
    if (!out) return pg_err_set(PG_EINVAL, "tokenizer: NULL output");
    *out = NULL;
    if (!f) return pg_err_set(PG_EINVAL, "tokenizer: NULL gguf file");
    int rc = load_gguf(f, out);
    if (rc < 0) return pg_err_wrap(rc, "loading tokenizer: ");
    return PG_OK;
}

// --- tokenizer.json -----------------------------------------------------------

static const cJSON *jget(const cJSON *o, const char *key) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = jget(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

// Boolean member with a default for absent/null.
static bool jbool(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = jget(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static bool jtype_is(const cJSON *o, const char *type) {
    const char *s = jstr(o, "type");
    return s && strcmp(s, type) == 0;
}

// True when `o` or any object nested in a Sequence has this "type".
static bool jhas_type(const cJSON *o, const char *type) {
    if (!cJSON_IsObject(o)) return false;
    if (jtype_is(o, type)) return true;
    const cJSON *child;
    cJSON_ArrayForEach(child, o) {
        if (cJSON_IsArray(child)) {
            const cJSON *e;
            cJSON_ArrayForEach(e, child) if (jhas_type(e, type)) return true;
        }
    }
    return false;
}

// A token id held by a JSON number: 0 <= id < 2^29.
static bool jid(const cJSON *v, int32_t *id) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d < (double)(INT32_MAX / 4)) || d != (double)(int32_t)d) return false;
    *id = (int32_t)d;
    return true;
}

// A special token named in tokenizer_config.json: "<s>" or {"content": "<s>"}.
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = jget(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    return jstr(v, "content");
}

// Items of a pre-tokenizer / normalizer: the members of a Sequence, or itself.
static const cJSON *jitems(const cJSON *o, const char *seq_key, const cJSON **single) {
    *single = NULL;
    if (jtype_is(o, "Sequence")) return jget(o, seq_key);
    *single = o;
    return NULL;
}

#define FOR_ITEMS(it, arr, single)                                                            \
    for (const cJSON *it = (arr) ? (arr)->child : (single); it;                              \
         it = (arr) ? it->next : NULL)

static int hf_byte_level_pre(pg_tokenizer *t, const cJSON *pre, const char *path) {
    const cJSON *single, *arr = jitems(pre, "pretokenizers", &single);
    char sig[256] = "";
    FOR_ITEMS(p, arr, single) {
        const char *type = jstr(p, "type");
        if (!type) return pg_err_set(PG_EFORMAT, "%s: pre_tokenizer without a type", path);
        size_t sl = strlen(sig);
        if (strcmp(type, "ByteLevel") == 0) {
            if (jbool(p, "add_prefix_space", true)) {
                if (t->n_stages)
                    return pg_err_set(PG_EUNSUPP, "%s: ByteLevel add_prefix_space after another "
                                      "pre-tokenizer is not supported", path);
                t->prefix_space = true;
            }
            if (jbool(p, "use_regex", true)) {
                PG_TRY(pg_tok_add_stage(t, pg_tok_family_regex(PG_TOK_PRE_GPT2),
                                        strlen(pg_tok_family_regex(PG_TOK_PRE_GPT2))));
                snprintf(sig + sl, sizeof sig - sl, "gpt2;");
            } else {
                snprintf(sig + sl, sizeof sig - sl, "bytes;");
            }
        } else if (strcmp(type, "Split") == 0) {
            const cJSON *pat = jget(p, "pattern");
            const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
            const char *behavior = jstr(p, "behavior");
            if (!behavior || strcmp(behavior, "Isolated") != 0 || jbool(p, "invert", false))
                return pg_err_set(PG_EUNSUPP, "%s: Split behavior '%s'%s is not supported (Isolated is)",
                                  path, behavior ? behavior : "?", jbool(p, "invert", false) ? " inverted" : "");
            if (re) {
                PG_TRY(pg_tok_add_stage(t, re, strlen(re)));
                const char *fam = "custom";
                for (pg_tok_pre f = PG_TOK_PRE_GPT2; f <= PG_TOK_PRE_QWEN2; f++)
                    if (strcmp(re, pg_tok_family_regex(f)) == 0) fam = pg_tok_pre_family_name(f);
                snprintf(sig + sl, sizeof sig - sl, "%s;", fam);
            } else if (lit) {
                // A literal: quote every character for PCRE2.
                size_t n = strlen(lit);
                char *q = malloc(2 * n + 1);
                if (!q) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
                size_t w = 0;
                for (size_t i = 0; i < n; i++) {
                    unsigned char c = (unsigned char)lit[i];
                    if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                                      (c >= 'A' && c <= 'Z')))
                        q[w++] = '\\';
                    q[w++] = (char)c;
                }
                int rc = pg_tok_add_stage(t, q, w);
                free(q);
                PG_TRY(rc);
                snprintf(sig + sl, sizeof sig - sl, "custom;");
            } else {
                return pg_err_set(PG_EFORMAT, "%s: Split without a pattern", path);
            }
        } else if (strcmp(type, "Digits") == 0) {
            bool each = jbool(p, "individual_digits", false);
            PG_TRY(pg_tok_add_stage(t, each ? "\\p{N}" : "\\p{N}+", each ? 5 : 6));
            snprintf(sig + sl, sizeof sig - sl, each ? "digit;" : "digits;");
        } else {
            return pg_err_set(PG_EUNSUPP, "%s: pre-tokenizer '%s' is not supported", path, type);
        }
    }
    // Name the family for logs when the stages are a known one.
    static const struct {
        const char *sig, *name;
        pg_tok_pre pre;
    } known[] = {
        {"gpt2;", "gpt2", PG_TOK_PRE_GPT2},
        {"digit;gpt2;", "smollm", PG_TOK_PRE_SMOLLM},
        {"llama3;bytes;", "llama3", PG_TOK_PRE_LLAMA3},
        {"qwen2;bytes;", "qwen2", PG_TOK_PRE_QWEN2},
    };
    t->pre = PG_TOK_PRE_CUSTOM;
    snprintf(t->pre_name, sizeof t->pre_name, "custom");
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(sig, known[i].sig) == 0) {
            t->pre = known[i].pre;
            snprintf(t->pre_name, sizeof t->pre_name, "%s", known[i].name);
        }
    }
    return PG_OK;
}

// SPM-style tokenizer.json: the space handling comes from a Metaspace
// pre-tokenizer or from a Prepend("▁") + Replace(" ", "▁") normalizer.
static int hf_spm_pre(pg_tokenizer *t, const cJSON *root, const char *path) {
    const char *meta = "\xe2\x96\x81";
    const cJSON *norm = jget(root, "normalizer"), *pre = jget(root, "pre_tokenizer");
    bool replace = false, prepend = false;
    const cJSON *single, *arr = jitems(norm, "normalizers", &single);
    FOR_ITEMS(n, arr, single) {
        if (cJSON_IsNull(n)) continue;
        const char *type = jstr(n, "type");
        if (type && strcmp(type, "Prepend") == 0 && jstr(n, "prepend") &&
            strcmp(jstr(n, "prepend"), meta) == 0) {
            prepend = true;
        } else if (type && strcmp(type, "Replace") == 0 && jstr(jget(n, "pattern"), "String") &&
                   strcmp(jstr(jget(n, "pattern"), "String"), " ") == 0 && jstr(n, "content") &&
                   strcmp(jstr(n, "content"), meta) == 0) {
            replace = true;
        } else {
            return pg_err_set(PG_EUNSUPP, "%s: normalizer '%s' is not supported", path, type ? type : "?");
        }
    }
    t->spm_prefix = prepend ? PG_TOK_PREFIX_ALWAYS : PG_TOK_PREFIX_NEVER;
    arr = jitems(pre, "pretokenizers", &single);
    FOR_ITEMS(p, arr, single) {
        if (cJSON_IsNull(p)) continue;
        const char *type = jstr(p, "type");
        if (!type || strcmp(type, "Metaspace") != 0)
            return pg_err_set(PG_EUNSUPP, "%s: pre-tokenizer '%s' with an SPM model is not supported",
                              path, type ? type : "?");
        const char *rep = jstr(p, "replacement");
        if ((rep && strcmp(rep, meta) != 0) || jbool(p, "split", false))
            return pg_err_set(PG_EUNSUPP, "%s: Metaspace with split or another replacement is not "
                              "supported", path);
        replace = true;
        const char *scheme = jstr(p, "prepend_scheme");
        if (scheme) {
            t->spm_prefix = strcmp(scheme, "always") == 0  ? PG_TOK_PREFIX_ALWAYS
                            : strcmp(scheme, "first") == 0 ? PG_TOK_PREFIX_FIRST
                                                           : PG_TOK_PREFIX_NEVER;
        } else {
            t->spm_prefix = jbool(p, "add_prefix_space", true) ? PG_TOK_PREFIX_ALWAYS : PG_TOK_PREFIX_NEVER;
        }
    }
    if (!replace)
        return pg_err_set(PG_EUNSUPP, "%s: SPM-style model without a ' ' -> '▁' rule", path);
    return pg_tok_set_pre_family(t, PG_TOK_PRE_NONE, "");
}

// bos from a TemplateProcessing post-processor whose single sequence starts
// with a special token.
static void hf_bos_from_post(pg_tokenizer *t, const cJSON *root, bool *add_bos) {
    const cJSON *post = jget(root, "post_processor");
    const cJSON *single, *arr = jitems(post, "processors", &single);
    FOR_ITEMS(p, arr, single) {
        if (!jtype_is(p, "TemplateProcessing")) continue;
        const cJSON *seq = jget(p, "single");
        const cJSON *first = cJSON_IsArray(seq) ? seq->child : NULL;
        const char *name = jstr(jget(first, "SpecialToken"), "id");
        if (!name) continue;
        int32_t id = pg_tok_lookup(t, name, strlen(name));
        if (id >= 0) {
            t->bos = id;
            *add_bos = true;
        }
    }
}

static int load_hf(const cJSON *root, const cJSON *cfg, const char *path, pg_tokenizer **out) {
    pg_tokenizer *t = NULL;
    int rc = PG_OK;
    const cJSON *model = jget(root, "model");
    const char *mtype = jstr(model, "type");
    const cJSON *vocab = jget(model, "vocab");
    const cJSON *added = jget(root, "added_tokens");
    if (mtype && strcmp(mtype, "BPE") != 0)
        return pg_err_set(PG_EUNSUPP, "%s: model type '%s' is not supported (BPE is)", path, mtype);
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(jget(model, "merges")))
        return pg_err_set(PG_EFORMAT, "%s: model.vocab or model.merges missing", path);
    const char *cs = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
    if ((cs && *cs) || (eow && *eow))
        return pg_err_set(PG_EUNSUPP, "%s: BPE with subword prefixes/suffixes is not supported", path);

    int32_t max_id = -1, id;
    const cJSON *v;
    cJSON_ArrayForEach(v, vocab) {
        if (!jid(v, &id)) return pg_err_set(PG_EFORMAT, "%s: bad id for token '%s'", path, v->string);
        if (id > max_id) max_id = id;
    }
    cJSON_ArrayForEach(v, added) {
        if (!jid(jget(v, "id"), &id) || !jstr(v, "content"))
            return pg_err_set(PG_EFORMAT, "%s: bad entry in added_tokens", path);
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return pg_err_set(PG_EFORMAT, "%s: empty vocabulary", path);

    const cJSON *pre = jget(root, "pre_tokenizer"), *dec = jget(root, "decoder");
    pg_tok_kind kind;
    if (jhas_type(pre, "ByteLevel") || jhas_type(dec, "ByteLevel")) {
        kind = PG_TOK_BPE_BYTE;
    } else if (jbool(model, "byte_fallback", false) || jhas_type(pre, "Metaspace") ||
               jhas_type(dec, "Metaspace") || jhas_type(jget(root, "normalizer"), "Replace")) {
        kind = PG_TOK_SPM;
    } else {
        return pg_err_set(PG_EUNSUPP, "%s: neither a byte-level nor an SPM-style BPE", path);
    }
    PG_TRY(pg_tok_alloc(kind, max_id + 1, &t));
    cJSON_ArrayForEach(v, vocab) {
        jid(v, &id);
        size_t n = strlen(v->string);
        int type = kind == PG_TOK_SPM && is_byte_token_text(v->string, n) ? PG_TOK_T_BYTE : PG_TOK_T_NORMAL;
        if ((rc = pg_tok_set_token(t, id, v->string, n, type)) < 0) goto fail;
    }
    cJSON_ArrayForEach(v, added) {
        jid(jget(v, "id"), &id);
        const char *s = jstr(v, "content");
        int type = jbool(v, "special", false) ? PG_TOK_T_CONTROL : PG_TOK_T_USER_DEFINED;
        if ((rc = pg_tok_set_token(t, id, s, strlen(s), type)) < 0) goto fail;
        t->flags[id] = (uint8_t)((jbool(v, "lstrip", false) ? PG_TOK_F_LSTRIP : 0) |
                                 (jbool(v, "rstrip", false) ? PG_TOK_F_RSTRIP : 0));
    }
    t->ignore_merges = jbool(model, "ignore_merges", false);
    t->byte_fallback = jbool(model, "byte_fallback", false);
    if (kind == PG_TOK_BPE_BYTE) {
        const cJSON *norm = jget(root, "normalizer");
        if (jtype_is(norm, "NFC")) {
            PG_LOGW("%s: NFC normalizer not applied (text is encoded as given)", path);
        } else if (norm && !cJSON_IsNull(norm)) {
            rc = pg_err_set(PG_EUNSUPP, "%s: normalizer '%s' is not supported", path,
                            jstr(norm, "type") ? jstr(norm, "type") : "?");
            goto fail;
        }
        if ((rc = hf_byte_level_pre(t, pre, path)) < 0) goto fail;
    } else {
        if ((rc = hf_spm_pre(t, root, path)) < 0) goto fail;
    }
    if ((rc = pg_tok_finalize_vocab(t)) < 0) goto fail;

    const char *unk = jstr(model, "unk_token");
    if (unk) t->unk = t->unk_fallback = pg_tok_lookup(t, unk, strlen(unk));
    if (t->unk >= 0 && t->type[t->unk] == PG_TOK_T_NORMAL) t->type[t->unk] = PG_TOK_T_UNKNOWN;

    const cJSON *merges = jget(model, "merges");
    if ((rc = pg_tok_reserve_merges(t, (size_t)cJSON_GetArraySize(merges))) < 0) goto fail;
    int32_t rank = 0, skipped = 0;
    cJSON_ArrayForEach(v, merges) {
        const char *a, *b;
        size_t alen, blen;
        if (cJSON_IsString(v)) {
            const char *s = v->valuestring, *sp = s[0] ? strchr(s + 1, ' ') : NULL;
            if (!sp) {
                rc = pg_err_set(PG_EFORMAT, "%s: merge %d '%s' is not 'left right'", path, (int)rank, s);
                goto fail;
            }
            a = s;
            alen = (size_t)(sp - s);
            b = sp + 1;
            blen = strlen(b);
        } else if (cJSON_GetArraySize(v) == 2 && cJSON_IsString(v->child) &&
                   cJSON_IsString(v->child->next)) {
            a = v->child->valuestring;
            alen = strlen(a);
            b = v->child->next->valuestring;
            blen = strlen(b);
        } else {
            rc = pg_err_set(PG_EFORMAT, "%s: merge %d is neither a string nor a pair", path, (int)rank);
            goto fail;
        }
        if ((rc = pg_tok_add_merge(t, a, alen, b, blen, rank++)) < 0) goto fail;
        skipped += rc == 0;
    }
    if (skipped) PG_LOGW("%s: %d merges skipped (not in the vocabulary or duplicates)", path, (int)skipped);

    // bos/eos: tokenizer_config.json names them; otherwise the post-processor.
    bool add_bos = false;
    hf_bos_from_post(t, root, &add_bos);
    const char *names[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    int32_t *slots[] = {&t->bos, &t->eos, &t->unk, &t->pad};
    for (int i = 0; i < 4; i++) {
        const char *name = config_token(cfg, names[i]);
        if (name) *slots[i] = pg_tok_lookup(t, name, strlen(name));
    }
    add_bos = jbool(cfg, "add_bos_token", add_bos);
    t->add_bos_default = add_bos;
    if ((rc = pg_tok_finalize(t)) < 0) goto fail;
    *out = t;
    return PG_OK;
fail:
    pg_tokenizer_free(t);
    return rc;
}

static int parse_json(const char *buf, size_t len, const char *name, cJSON **out) {
    *out = cJSON_ParseWithLength(buf, len);
    if (!*out) return pg_err_set(PG_EFORMAT, "%s: not valid JSON", name);
    return PG_OK;
}

static int parse_json_file(const char *path, cJSON **out) {
    char *buf;
    size_t len;
    *out = NULL;
    PG_TRY(pg_read_file(path, (size_t)1 << 30, &buf, &len));
    int rc = parse_json(buf, len, path, out);
    free(buf);
    return rc;
}

int pg_tokenizer_from_hf(const char *tokenizer_json_path, const char *config_path,
                         pg_tokenizer **out) {
    if (!out) return pg_err_set(PG_EINVAL, "tokenizer: NULL output");
    *out = NULL;
    if (!tokenizer_json_path) return pg_err_set(PG_EINVAL, "tokenizer: NULL path");
    cJSON *root = NULL, *cfg = NULL;
    int rc = parse_json_file(tokenizer_json_path, &root);
    if (rc == PG_OK && config_path) rc = parse_json_file(config_path, &cfg);
    if (rc == PG_OK) rc = load_hf(root, cfg, tokenizer_json_path, out);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (rc < 0) return pg_err_wrap(rc, "loading tokenizer: ");
    return PG_OK;
}

int pg_tokenizer_from_hf_memory(const char *json, size_t len, const char *config_json,
                                size_t config_len, const char *name, pg_tokenizer **out) {
    if (!out) return pg_err_set(PG_EINVAL, "tokenizer: NULL output");
    *out = NULL;
    if (!json) return pg_err_set(PG_EINVAL, "tokenizer: NULL tokenizer.json text");
    if (!name) name = "tokenizer.json";
    cJSON *root = NULL, *cfg = NULL;
    int rc = parse_json(json, len, name, &root);
    if (rc == PG_OK && config_json) rc = parse_json(config_json, config_len, name, &cfg);
    if (rc == PG_OK) rc = load_hf(root, cfg, name, out);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (rc < 0) return pg_err_wrap(rc, "loading tokenizer: ");
    return PG_OK;
}
