// bench/ref/paged_dump.c - our forward, op by op as engine/llama.c runs it,
// compared with llama.cpp's intermediate tensors written by
// bench/ref/llama_cpp_dump.c for the same token ids: for each op of each
// layer, how many elements are bitwise equal. Stops at the first layer with
// a difference (ALL=1: goes on). Our Q is compared in llama.cpp's dimension
// order (rotary pairs adjacent). Not part of the build:
//
//   gcc -O2 -march=x86-64-v3 -I. bench/ref/paged_dump.c build/rel/libpaged.a
//       -luv -lcjson -lopenblas -lpcre2-8 -lxxhash -lm -lpthread -o /tmp/paged_dump
//   DUMP=/tmp/dump /tmp/paged_dump 504 3575 282 4649 314
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/llama.h"

static const char *dir;

// Returns 1 when `ours` differs from DIR/name.bin.
static int compare(const char *name, const float *ours, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "rb");
    float *ref = malloc(n * sizeof(float));
    if (!f || fread(ref, sizeof(float), n, f) != n) {
        printf("%-16s (no dump)\n", name);
        if (f) fclose(f);
        free(ref);
        return 0;
    }
    fclose(f);
    size_t same = 0, first = n;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&ours[i], &ref[i], 4) == 0)
            same++;
        else if (first == n)
            first = i;
        num += ((double)ours[i] - ref[i]) * ((double)ours[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    printf("%-16s bitwise %zu/%zu, rel err %.3e", name, same, n, sqrt(num / (den + 1e-30)));
    if (first < n)
        printf(", first difference at %zu: %.9g vs %.9g", first, ours[first], ref[first]);
    printf("\n");
    free(ref);
    return same != n;
}

static void linear(pg_backend *be, float *out, const float *x, int64_t m, const pg_linear *lin) {
    int64_t off = 0;
    for (int i = 0; i < lin->n_parts; i++) {
        be->matmul(be, out + off, lin->out_features, x, m, &lin->parts[i]);
        off += lin->parts[i].rows;
    }
}

int main(int argc, char **argv) {
    dir = getenv("DUMP") ? getenv("DUMP") : "/tmp/dump";
    const char *model_path =
        getenv("MODEL") ? getenv("MODEL") : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const int n = argc - 1;
    if (n < 1 || n > 256) {
        fprintf(stderr, "usage: DUMP=dir %s TOKEN_ID...\n", argv[0]);
        return 2;
    }
    int32_t toks[256], pos[256], slots[256], table[17];
    for (int i = 0; i < 17; i++) table[i] = i + 1;
    for (int i = 0; i < n; i++)
        toks[i] = atoi(argv[i + 1]), pos[i] = i, slots[i] = table[i / 16] * 16 + i % 16;
    pg_llama *m;
    pg_backend *be;
    pg_kv_cache *kv;
    if (pg_llama_load(model_path, &m) < 0 || pg_backend_cpu_create(2, &be) < 0 ||
        pg_kv_cache_create(&m->cfg, 18, 16, &kv) < 0) {
        fprintf(stderr, "%s\n", pg_err_msg());
        return 1;
    }
    be->matmul_mode = PG_MATMUL_QUANT_ACT;
    const pg_model_config *c = &m->cfg;
    const int64_t hd = c->head_dim, dim = c->hidden, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    const int64_t qkvd = qd + 2 * kvd, big = c->ffn > qd ? c->ffn : qd;
    float *x = malloc(4 * n * dim), *xn = malloc(4 * n * dim), *qkv = malloc(4 * n * qkvd);
    float *q = malloc(4 * n * qd), *k = malloc(4 * n * kvd), *v = malloc(4 * n * kvd);
    float *gu = malloc(4 * n * 2 * c->ffn), *h = malloc(4 * n * c->ffn), *tmp = malloc(4 * n * big);
    pg_attn_seq seq = {0, n, 0, table};
    char name[64];
    be->embed(be, x, toks, n, &m->tok_emb);
    for (int l = 0; l < c->n_layers; l++) {
        const pg_llama_layer *L = &m->layers[l];
        int bad = 0;
#define CMP(fmt, p, cnt)                                                                           \
    (snprintf(name, sizeof name, fmt, l), bad |= compare(name, p, (size_t)(cnt)))
        be->rmsnorm(be, xn, x, L->attn_norm, n, dim, c->rms_eps);
        CMP("attn_norm-%d", xn, n * dim);
        linear(be, qkv, xn, n, &L->qkv);
        for (int i = 0; i < n; i++) {
            memcpy(q + i * qd, qkv + i * qkvd, 4 * qd);
            memcpy(k + i * kvd, qkv + i * qkvd + qd, 4 * kvd);
            memcpy(v + i * kvd, qkv + i * qkvd + qd + kvd, 4 * kvd);
        }
        CMP("Vcur-%d", v, n * kvd);
        be->rope_kv_write(be, q, k, v, pos, slots, n, c->n_heads, m->inv_freq, kv->k[l], kv->v[l],
                          kv->shape);
        for (int64_t i = 0; i < n * c->n_heads; i++)
            for (int64_t g = 0; g < hd; g++)
                tmp[i * hd + g] = q[i * hd + (g % 2 ? hd / 2 + g / 2 : g / 2)];
        CMP("Qcur-%d", tmp, n * qd);
        be->attention(be, qkv, q, &seq, 1, c->n_heads, 1.0f / sqrtf((float)hd), kv->k[l], kv->v[l],
                      kv->shape);
        for (int i = 0; i < n; i++) // llama.cpp's kqv is [head][token][dim]
            for (int hh = 0; hh < c->n_heads; hh++)
                memcpy(tmp + ((size_t)hh * n + i) * hd, qkv + ((size_t)i * c->n_heads + hh) * hd,
                       4 * hd);
        CMP("kqv-%d", tmp, n * qd);
        linear(be, xn, qkv, n, &L->o);
        CMP("attn_out-%d", xn, n * dim);
        be->add(be, x, xn, n, dim);
        CMP("ffn_inp-%d", x, n * dim);
        be->rmsnorm(be, xn, x, L->ffn_norm, n, dim, c->rms_eps);
        CMP("ffn_norm-%d", xn, n * dim);
        linear(be, gu, xn, n, &L->gate_up);
        be->silu_mul(be, h, gu, n, c->ffn);
        CMP("ffn_swiglu-%d", h, n * c->ffn);
        linear(be, xn, h, n, &L->down);
        CMP("ffn_out-%d", xn, n * dim);
        be->add(be, x, xn, n, dim);
        CMP("l_out-%d", x, n * dim);
        if (bad && !getenv("ALL")) break;
    }
    return 0;
}
