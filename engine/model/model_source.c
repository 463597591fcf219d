// engine/model/model_source.c - the three tensor sources of the loader
// (model_source_int.h): finding a stored tensor by name, opening a source
// with its config, and the --quantization check against a checkpoint's own.
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "engine/model/model_source_int.h"

// The stored tensor `name` as rows x cols (1 x n for a vector); false when
// the file has none. Dummy sources have every tensor, without data.
bool pg_model_src_find(const source *s, const char *name, pg_weight *w) {
    memset(w, 0, sizeof *w);
    if (s->kind == SRC_GGUF) {
        const gguf_tensor *t = gguf_find_tensor(s->gguf, name);
        if (!t) return false;
        int64_t rows = 1;
        for (uint32_t d = 1; d < t->n_dims; d++) rows *= (int64_t)t->dims[d];
        *w = (pg_weight){.data = t->data, .dtype = (int)t->type, .rows = rows,
                         .cols = (int64_t)t->dims[0],
                         .row_bytes = pg_dtype_row_bytes((int)t->type, (int64_t)t->dims[0])};
        return true;
    }
    if (s->kind == SRC_HF) {
        const pg_st_tensor *t = pg_st_model_find(s->st, name, NULL);
        if (!t) return false;
        int64_t cols = t->n_dims >= 1 ? (int64_t)t->dims[0] : 1;
        int64_t rows = (int64_t)t->n_elems / (cols > 0 ? cols : 1);
        *w = (pg_weight){.data = t->data, .dtype = t->dtype, .rows = rows, .cols = cols,
                         .row_bytes = pg_dtype_row_bytes(t->dtype, cols)};
        return true;
    }
    return true;
}

void pg_model_src_close_gguf(void *p) { gguf_close(p); }

// An explicit --quantization awq|gptq must name the checkpoint's format,
// and a checkpoint of one is not quantized again (fp8, int4).
static int check_quant_flag(const pg_model_load_opts *o, const source *s, pg_model_config *c) {
    if (s->kind != SRC_HF) c->ckpt_quant = PG_QUANT_NONE; // dummy weights: random bf16 whatever the config says
    const int q = o->quantization, k = c->ckpt_quant;
    if (pg_quantization_is_checkpoint(q) && q != k)
        return pg_err_set(PG_EINVAL, "--quantization %s: %s's config.json does not say quant_method \"%s\" (%s%s%s)",
                          pg_quantization_name(q), s->path, pg_quantization_name(q), k ? "it says \"" : "no AWQ / GPTQ",
                          k ? pg_quantization_name(k) : " quantization_config", k ? "\"" : "");
    if (k && q != PG_QUANT_NONE && q != k)
        return pg_err_set(PG_EINVAL, "--quantization %s: %s is a pre-quantized checkpoint (config.json's quant_method "
                          "\"%s\"); leave the flag out or pass --quantization %s", pg_quantization_name(q), s->path,
                          pg_quantization_name(k), pg_quantization_name(k));
    return 0;
}
void pg_model_src_close_st(void *p) { pg_st_model_close(p); }

// Opens o's source and reads its config: the GGUF header and tensor table,
// the safetensors headers, or the config.json of dummy weights. Both files
// are mapped, so nothing past the headers is read here.
static int src_open_kind(const pg_model_load_opts *o, source *s, pg_model_config *c) {
    if (o->dummy) {
        s->kind = SRC_DUMMY;
        if (!o->hf_config) return pg_err_set(PG_EINVAL, "--load-format dummy needs --hf-config (a config.json)");
        return pg_is_dir(o->hf_config) ? pg_config_from_hf_dir(o->hf_config, c) : pg_config_from_hf_file(o->hf_config, c);
    }
    if (!o->path) return pg_err_set(PG_EINVAL, "no model path");
    if (pg_is_dir(o->path)) {
        s->kind = SRC_HF;
        PG_TRY(pg_config_from_hf_dir(o->path, c));
        return pg_st_model_open(o->path, &s->st);
    }
    s->kind = SRC_GGUF;
    PG_TRY(gguf_open(o->path, &s->gguf));
    return pg_config_from_gguf(s->gguf, c);
}

int pg_model_src_open(const pg_model_load_opts *o, source *s, pg_model_config *c) {
    *s = (source){.path = o->dummy ? o->hf_config : o->path, .cfg = c};
    PG_TRY(src_open_kind(o, s, c));
    return check_quant_flag(o, s, c);
}

void pg_model_src_close(source *s) {
    if (s->gguf) gguf_close(s->gguf);
    if (s->st) pg_st_model_close(s->st);
    s->gguf = NULL, s->st = NULL;
}

int pg_model_identity(const pg_model_load_opts *o, pg_model_config *cfg, int32_t *weight_dtype) {
    *weight_dtype = -1;
    source s;
    int rc = pg_model_src_open(o, &s, cfg);
    if (rc == 0 && s.kind != SRC_DUMMY) {
        static const char *const names[] = {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight",
                                            "model.layers.0.self_attn.q_proj.qweight", "token_embd.weight",
                                            "model.embed_tokens.weight"};
        pg_weight w;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (pg_model_src_find(&s, names[i], &w)) {
                *weight_dtype = w.dtype;
                break;
            }
    }
    pg_model_src_close(&s);
    return rc;
}
