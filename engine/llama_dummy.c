// engine/llama_dummy.c - model shapes without weights, and a synthetic
// byte-level tokenizer (engine/llama_dummy.h).
#include "engine/llama_dummy.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "kernels/dtype.h"
#include "engine/llama_load_int.h"

static pg_weight shape_only(int64_t rows, int64_t cols) {
    return (pg_weight){.data = NULL,
                       .dtype = PG_DTYPE_BF16,
                       .rows = rows,
                       .cols = cols,
                       .row_bytes = (size_t)cols * 2};
}

int pg_llama_dummy(const char *hf_config, pg_llama **out) {
    *out = NULL;
    if (!hf_config)
        return pg_err_set(PG_EINVAL, "--load-format dummy needs --hf-config (a config.json)");
    pg_llama *m = pg_xcalloc(1, sizeof *m);
    int rc = pg_is_dir(hf_config) ? pg_config_from_hf_dir(hf_config, &m->cfg)
                                  : pg_config_from_hf_file(hf_config, &m->cfg);
    if (rc < 0) {
        pg_llama_free(m);
        return rc;
    }
    const pg_model_config *c = &m->cfg;
    const int64_t H = c->hidden, hd = c->head_dim;
    const int64_t q_dim = (int64_t)c->n_heads * hd, kv_dim = (int64_t)c->n_kv_heads * hd;
    m->tok_emb = shape_only(c->vocab_size, H);
    m->lm_head = c->tie_embeddings ? m->tok_emb : shape_only(c->vocab_size, H);
    m->layers = pg_xcalloc((size_t)c->n_layers, sizeof(pg_llama_layer));
    size_t bytes = (size_t)c->vocab_size * (size_t)H * 2 * (c->tie_embeddings ? 1 : 2);
    for (int32_t l = 0; l < c->n_layers; l++) {
        pg_llama_layer *L = &m->layers[l];
        pg_weight w[3] = {shape_only(q_dim, H), shape_only(kv_dim, H), shape_only(kv_dim, H)};
        pg_linear_init(&L->qkv, 3, w);
        w[0] = shape_only(H, q_dim);
        pg_linear_init(&L->o, 1, w);
        w[0] = shape_only(c->ffn, H);
        w[1] = shape_only(c->ffn, H);
        pg_linear_init(&L->gate_up, 2, w);
        w[0] = shape_only(H, c->ffn);
        pg_linear_init(&L->down, 1, w);
        bytes +=
            (size_t)((q_dim + 2 * kv_dim) * H + H * q_dim + 2 * (int64_t)c->ffn * H + H * c->ffn) *
            2;
    }
    m->weight_bytes = bytes;
    m->inv_freq = pg_xmalloc(sizeof(float) * (size_t)(hd / 2));
    pg_config_rope_inv_freq(c, m->inv_freq);
    *out = m;
    return 0;
}

// GPT-2's byte-to-unicode map: printable bytes map to themselves, the rest
// to U+0100 + n in order.
static uint32_t byte_char(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return (uint32_t)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256u + (uint32_t)n;
}

static int put_utf8(uint32_t cp, char *s) {
    if (cp < 0x80) {
        s[0] = (char)cp;
        return 1;
    }
    s[0] = (char)(0xC0 | (cp >> 6));
    s[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

int pg_tokenizer_synthetic_bytes(int32_t vocab, pg_tokenizer **out) {
    *out = NULL;
    if (vocab < 256)
        return pg_err_set(PG_EINVAL, "synthetic tokenizer: vocabulary %d < 256 bytes", vocab);
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *v = cJSON_AddObjectToObject(model, "vocab");
    cJSON_AddArrayToObject(model, "merges");
    char key[32];
    for (int32_t i = 0; i < vocab; i++) {
        if (i < 256) {
            int n = put_utf8(byte_char(i), key);
            key[n] = 0;
        } else {
            snprintf(key, sizeof key, "<t%d>", (int)i);
        }
        cJSON_AddNumberToObject(v, key, i);
    }
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddFalseToObject(pre, "add_prefix_space");
    cJSON_AddFalseToObject(pre, "use_regex");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return pg_err_set(PG_ENOMEM, "synthetic tokenizer: out of memory");
    int rc =
        pg_tokenizer_from_hf_memory(json, strlen(json), NULL, 0, "synthetic byte tokenizer", out);
    free(json);
    return rc;
}
