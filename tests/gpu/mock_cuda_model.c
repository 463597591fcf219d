// tests/gpu/mock_cuda_model.c - kernels/cuda/cuda_model.h on the CPU, for
// checking the host half of the CUDA runner where there is no GPU.
//
// Implements the device ABI with the CPU backend in f32 (weights kept as
// uploaded, bf16 widened exactly), from the flattened step exactly as the
// device receives it (decode rows first, cu_q, slots, block tables, sample
// rows, sampling parameters with history/ban offsets). The CPU runner and
// this mock run the same arithmetic per sequence, so
// tests/gpu/test_cuda_runner.c linked against it must report errors near
// f32 rounding; anything larger is a bug in engine/runner_cuda.c (or the
// test). Not part of the build; link by hand:
//
//   gcc -std=c11 -D_GNU_SOURCE -O1 -g -I. -I/usr/include/x86_64-linux-gnu/openblas-pthread
//       -o /tmp/test_cuda_runner_mock tests/gpu/test_cuda_runner.c tests/gpu/mock_cuda_model.c
//       build/rel/libpaged.a -luv -lcjson -lopenblas -lpcre2-8 -lxxhash -lm -lpthread
//   (likewise server/main.c + this file for a `paged` whose "cuda" is the mock)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/dtype.h"
#include "engine/sampler.h"
#include "kernels/cuda/cuda_model.h"

typedef struct {
    float *attn_norm, *ffn_norm, *qkv, *o, *gu, *down;
} mlayer;

struct pg_cuda_model {
    pg_cuda_model_shape sh;
    int64_t q_dim, kv_dim, qkv_dim;
    float *inv_freq;
    float *emb, *lm_head, *final_norm;
    mlayer *L;
    pg_backend *be;
    pg_sampler *sampler;
    pg_cuda_model_limits lim;
    bool prepared;
    float *kv; // [2 L][n_blocks][block elems]
    int32_t n_blocks;
    size_t block_elems;
    float *host; // [2 L][n_host][block elems]
    int32_t n_host;
    float *logits; // [S][vocab] raw
    int32_t last_n;
    // step_begin runs the step at once; step_end hands out the oldest
    // open step's results. last_tok: what the newest begun step sampled
    // (the fed tokens of the next).
    pg_cuda_sample_out *open_out[2];
    int32_t open_n[2], n_open, next_buf;
    int32_t *last_tok, n_last_tok;
};

int pg_cuda_built(void) {
    return 1;
}
int pg_cuda_device_count(void) {
    return 1;
}
int pg_cuda_device_describe(char *name, size_t cap) {
    snprintf(name, cap, "mock (CPU, f32)");
    return 0;
}

static float *weight(pg_cuda_model *m, pg_cuda_weight_id w, int32_t layer, int64_t *rows,
                     int64_t *cols) {
    const bool per_layer = w >= PG_CUDA_W_ATTN_NORM;
    pg_cuda_weight_shape(&m->sh, w, rows, cols);
    if (per_layer && (layer < 0 || layer >= m->sh.n_layers)) {
        *rows = *cols = 0;
        return NULL;
    }
    mlayer *L = per_layer ? &m->L[layer] : NULL;
    switch (w) {
    case PG_CUDA_W_EMB: return m->emb;
    case PG_CUDA_W_LM_HEAD: return m->lm_head;
    case PG_CUDA_W_FINAL_NORM: return m->final_norm;
    case PG_CUDA_W_ATTN_NORM: return L->attn_norm;
    case PG_CUDA_W_FFN_NORM: return L->ffn_norm;
    case PG_CUDA_W_QKV: return L->qkv;
    case PG_CUDA_W_O: return L->o;
    case PG_CUDA_W_GATE_UP: return L->gu;
    case PG_CUDA_W_DOWN: return L->down;
    default: *rows = *cols = 0; return NULL;
    }
}

int pg_cuda_model_create(const pg_cuda_model_shape *sh, const float *inv_freq, int device,
                         pg_cuda_model **out) {
    (void)device;
    pg_cuda_model *m = pg_xcalloc(1, sizeof *m);
    m->sh = *sh;
    m->q_dim = (int64_t)sh->n_heads * sh->head_dim;
    m->kv_dim = (int64_t)sh->n_kv_heads * sh->head_dim;
    m->qkv_dim = m->q_dim + 2 * m->kv_dim;
    m->inv_freq = pg_xmalloc(sizeof(float) * (size_t)(sh->head_dim / 2));
    memcpy(m->inv_freq, inv_freq, sizeof(float) * (size_t)(sh->head_dim / 2));
    const size_t H = (size_t)sh->hidden;
    m->emb = pg_xcalloc((size_t)sh->vocab * H, 4);
    m->lm_head = sh->tie_embeddings ? m->emb : pg_xcalloc((size_t)sh->vocab * H, 4);
    m->final_norm = pg_xcalloc(H, 4);
    m->L = pg_xcalloc((size_t)sh->n_layers, sizeof(mlayer));
    for (int32_t l = 0; l < sh->n_layers; l++) {
        m->L[l].attn_norm = pg_xcalloc(H, 4);
        m->L[l].ffn_norm = pg_xcalloc(H, 4);
        m->L[l].qkv = pg_xcalloc((size_t)m->qkv_dim * H, 4);
        m->L[l].o = pg_xcalloc(H * (size_t)m->q_dim, 4);
        m->L[l].gu = pg_xcalloc(2 * (size_t)sh->ffn * H, 4);
        m->L[l].down = pg_xcalloc(H * (size_t)sh->ffn, 4);
    }
    PG_TRY(pg_backend_cpu_create(0, &m->be));
    m->be->matmul_mode = PG_MATMUL_EXACT;
    PG_TRY(pg_sampler_create(sh->vocab, &m->sampler));
    *out = m;
    return 0;
}

void pg_cuda_model_free(pg_cuda_model *m) {
    if (!m) return;
    for (int32_t l = 0; l < m->sh.n_layers; l++) {
        free(m->L[l].attn_norm), free(m->L[l].ffn_norm), free(m->L[l].qkv);
        free(m->L[l].o), free(m->L[l].gu), free(m->L[l].down);
    }
    free(m->L);
    if (m->lm_head != m->emb) free(m->lm_head);
    free(m->emb), free(m->final_norm), free(m->inv_freq), free(m->kv), free(m->host),
        free(m->logits);
    free(m->open_out[0]), free(m->open_out[1]), free(m->last_tok);
    m->be->destroy(m->be);
    pg_sampler_free(m->sampler);
    free(m);
}

void pg_cuda_model_weight_dims(const pg_cuda_model *m, pg_cuda_weight_id w, int64_t *rows,
                               int64_t *cols) {
    weight((pg_cuda_model *)m, w, 0, rows, cols);
}

int pg_cuda_model_upload_rows(pg_cuda_model *m, pg_cuda_weight_id w, int32_t layer, int64_t row0,
                              int64_t n_rows, const void *src, int src_dtype) {
    int64_t rows, cols;
    float *dst = weight(m, w, layer, &rows, &cols);
    if (!dst || row0 < 0 || row0 + n_rows > rows || n_rows * cols > PG_CUDA_UPLOAD_ELEMS)
        return pg_err_set(PG_EINVAL, "mock upload: weight %d layer %d rows [%lld, +%lld) of %lld",
                          (int)w, layer, (long long)row0, (long long)n_rows, (long long)rows);
    if (w == PG_CUDA_W_LM_HEAD && m->sh.tie_embeddings) return 0;
    pg_dequantize_row(src_dtype == PG_CUDA_BF16 ? PG_DTYPE_BF16 : PG_DTYPE_F32, src,
                      dst + row0 * cols, n_rows * cols);
    return 0;
}

int pg_cuda_model_init_random(pg_cuda_model *m, uint64_t seed, float std) {
    uint64_t x = seed | 1;
    const int64_t H = m->sh.hidden;
    int64_t rows, cols;
    for (int w = PG_CUDA_W_EMB; w <= PG_CUDA_W_DOWN; w++)
        for (int32_t l = 0; l < (w >= PG_CUDA_W_ATTN_NORM ? m->sh.n_layers : 1); l++) {
            float *p = weight(m, (pg_cuda_weight_id)w, l, &rows, &cols);
            bool norm =
                w == PG_CUDA_W_FINAL_NORM || w == PG_CUDA_W_ATTN_NORM || w == PG_CUDA_W_FFN_NORM;
            for (int64_t i = 0; i < rows * cols; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                p[i] =
                    norm
                        ? 1.0f
                        : std * (float)(((double)(x >> 11) / 9007199254740992.0) * 3.4641 - 1.7320);
            }
        }
    (void)H;
    return 0;
}

// Graphs are a device matter: the mock runs every step as it comes.
int pg_cuda_model_set_graph_mode(pg_cuda_model *m, pg_cuda_graph_mode mode) {
    (void)m, (void)mode;
    return 0;
}

int pg_cuda_model_capture_graphs(pg_cuda_model *m) {
    (void)m;
    return 0;
}

int pg_cuda_model_prepare(pg_cuda_model *m, const pg_cuda_model_limits *lim) {
    m->lim = *lim;
    if (m->lim.max_seqs > m->lim.max_tokens) m->lim.max_seqs = m->lim.max_tokens;
    m->logits = pg_xmalloc(sizeof(float) * (size_t)m->lim.max_seqs * (size_t)m->sh.vocab);
    m->prepared = true;
    return 0;
}

size_t pg_cuda_model_kv_block_bytes(const pg_cuda_model_shape *s, int32_t block_size) {
    return (size_t)2 * (size_t)s->n_layers * (size_t)block_size * (size_t)s->n_kv_heads *
           (size_t)s->head_dim * 2;
}

int pg_cuda_model_alloc_kv(pg_cuda_model *m, int32_t n_blocks, int32_t n_host_blocks) {
    m->block_elems = (size_t)m->lim.block_size * (size_t)m->sh.n_kv_heads * (size_t)m->sh.head_dim;
    m->kv = pg_xcalloc(2 * (size_t)m->sh.n_layers * (size_t)n_blocks * m->block_elems, 4);
    m->n_blocks = n_blocks;
    if (n_host_blocks)
        m->host =
            pg_xcalloc(2 * (size_t)m->sh.n_layers * (size_t)n_host_blocks * m->block_elems, 4);
    m->n_host = n_host_blocks;
    return 0;
}

void pg_cuda_model_mem(const pg_cuda_model *m, pg_cuda_mem_stats *out) {
    memset(out, 0, sizeof *out);
    const int64_t G = (int64_t)1 << 30;
    out->total = 8 * G;
    out->weights = (int64_t)m->sh.n_layers * 1000; // nominal
    out->workspace = G / 4;
    out->workspace_buffers = G / 8;
    out->kv = m->kv ? 2 * (int64_t)m->sh.n_layers * m->n_blocks * (int64_t)m->block_elems * 2 : 0;
    out->other = G / 2;
    out->free = out->total - out->weights - out->workspace - out->other - out->kv;
    snprintf(out->device, sizeof out->device, "mock (CPU, f32)");
}

static pg_weight fw(const float *p, int64_t rows, int64_t cols) {
    return (pg_weight){.data = p,
                       .dtype = PG_DTYPE_F32,
                       .rows = rows,
                       .cols = cols,
                       .row_bytes = (size_t)cols * 4};
}

static float *tensor(pg_cuda_model *m, int32_t t, bool host) { // t in [0, 2L)
    size_t nb = host ? (size_t)m->n_host : (size_t)m->n_blocks;
    return (host ? m->host : m->kv) + (size_t)t * nb * m->block_elems;
}

int pg_cuda_model_step(pg_cuda_model *m, const pg_cuda_step *s, pg_cuda_sample_out *out) {
    const pg_cuda_model_shape *sh = &m->sh;
    const int32_t L2 = 2 * sh->n_layers;
    const size_t be_ = m->block_elems;
    if (s->n_tokens > m->lim.max_tokens || s->n_seqs > m->lim.max_seqs)
        return pg_err_set(PG_EINVAL, "mock: beyond the limits");
    for (int32_t i = 0; i < s->n_swap_out; i++)
        for (int32_t t = 0; t < L2; t++)
            memcpy(tensor(m, t, true) + (size_t)s->swap_out[2 * i + 1] * be_,
                   tensor(m, t, false) + (size_t)s->swap_out[2 * i] * be_, be_ * 4);
    for (int32_t i = 0; i < s->n_swap_in; i++)
        for (int32_t t = 0; t < L2; t++)
            memcpy(tensor(m, t, false) + (size_t)s->swap_in[2 * i + 1] * be_,
                   tensor(m, t, true) + (size_t)s->swap_in[2 * i] * be_, be_ * 4);
    for (int32_t i = 0; i < s->n_copies; i++)
        for (int32_t t = 0; t < L2; t++)
            memcpy(tensor(m, t, false) + (size_t)s->copies[2 * i + 1] * be_,
                   tensor(m, t, false) + (size_t)s->copies[2 * i] * be_, be_ * 4);
    const int64_t n = s->n_tokens, H = sh->hidden, hd = sh->head_dim;
    m->last_n = s->n_sample;
    if (n == 0) return 0;
    pg_backend *be = m->be;
    const pg_kv_shape kvs = {m->n_blocks, m->lim.block_size, sh->n_kv_heads, sh->head_dim, PG_KV_BF16};
    float *x = pg_xmalloc(sizeof(float) * (size_t)(n * H)),
          *xn = pg_xmalloc(sizeof(float) * (size_t)(n * H));
    float *qkv = pg_xmalloc(sizeof(float) * (size_t)(n * m->qkv_dim));
    float *q = pg_xmalloc(sizeof(float) * (size_t)(n * m->q_dim)),
          *att = pg_xmalloc(sizeof(float) * (size_t)(n * m->q_dim));
    float *k = pg_xmalloc(sizeof(float) * (size_t)(n * m->kv_dim)),
          *v = pg_xmalloc(sizeof(float) * (size_t)(n * m->kv_dim));
    float *gu = pg_xmalloc(sizeof(float) * (size_t)(n * 2 * sh->ffn)),
          *h = pg_xmalloc(sizeof(float) * (size_t)(n * sh->ffn));
    pg_attn_seq *seqs = pg_xmalloc(sizeof(pg_attn_seq) * (size_t)s->n_seqs);
    for (int32_t i = 0; i < s->n_seqs; i++) {
        const int32_t *bt = s->block_tables + (size_t)i * s->bt_stride;
        if (i < s->n_decode) {
            if (s->seq_lens[i] != s->start_pos[i] + 1)
                return pg_err_set(PG_EINVAL, "mock: decode seq_lens");
            seqs[i] = (pg_attn_seq){i, 1, s->seq_lens[i] - 1, bt};
        } else {
            int32_t j = i - s->n_decode, nq = s->cu_q[j + 1] - s->cu_q[j];
            if (s->seq_lens[i] != s->start_pos[i] + nq)
                return pg_err_set(PG_EINVAL, "mock: prefill seq_lens");
            seqs[i] = (pg_attn_seq){s->n_decode + s->cu_q[j], nq, s->start_pos[i], bt};
        }
    }
    pg_weight emb = fw(m->emb, sh->vocab, H);
    be->embed(be, x, s->tokens, n, &emb);
    for (int32_t l = 0; l < sh->n_layers; l++) {
        mlayer *Ly = &m->L[l];
        float *kc = tensor(m, 2 * l, false), *vc = tensor(m, 2 * l + 1, false);
        be->rmsnorm(be, xn, x, Ly->attn_norm, n, H, sh->rms_eps);
        pg_weight w = fw(Ly->qkv, m->qkv_dim, H);
        be->matmul(be, qkv, m->qkv_dim, xn, n, &w);
        for (int64_t i = 0; i < n; i++) {
            memcpy(q + i * m->q_dim, qkv + i * m->qkv_dim, sizeof(float) * (size_t)m->q_dim);
            memcpy(k + i * m->kv_dim, qkv + i * m->qkv_dim + m->q_dim,
                   sizeof(float) * (size_t)m->kv_dim);
            memcpy(v + i * m->kv_dim, qkv + i * m->qkv_dim + m->q_dim + m->kv_dim,
                   sizeof(float) * (size_t)m->kv_dim);
        }
        be->rope_kv_write(be, q, k, v, s->pos, s->slots, n, sh->n_heads, m->inv_freq, kc, vc, kvs);
        be->attention(be, att, q, seqs, s->n_seqs, sh->n_heads, 1.0f / sqrtf((float)hd), kc, vc,
                      kvs);
        w = fw(Ly->o, H, m->q_dim);
        be->matmul(be, xn, H, att, n, &w);
        be->add(be, x, xn, n, H);
        be->rmsnorm(be, xn, x, Ly->ffn_norm, n, H, sh->rms_eps);
        w = fw(Ly->gu, 2 * (int64_t)sh->ffn, H);
        be->matmul(be, gu, 2 * sh->ffn, xn, n, &w);
        be->silu_mul(be, h, gu, n, sh->ffn);
        w = fw(Ly->down, H, sh->ffn);
        be->matmul(be, xn, H, h, n, &w);
        be->add(be, x, xn, n, H);
    }
    float *g = pg_xmalloc(sizeof(float) * (size_t)(s->n_sample ? s->n_sample : 1) * (size_t)H);
    for (int32_t j = 0; j < s->n_sample; j++)
        memcpy(g + (size_t)j * H, x + (size_t)s->sample_rows[j] * H, sizeof(float) * (size_t)H);
    be->rmsnorm(be, g, g, m->final_norm, s->n_sample, H, sh->rms_eps);
    pg_weight lm = fw(m->lm_head, sh->vocab, H);
    be->matmul(be, m->logits, sh->vocab, g, s->n_sample, &lm);
    float *tmp = pg_xmalloc(sizeof(float) * (size_t)sh->vocab);
    for (int32_t j = 0; j < s->n_sample; j++) {
        const pg_cuda_sample_params *pp = &s->params[j];
        pg_sampling_params sp;
        pg_sampling_params_default(&sp);
        sp.temperature = pp->temperature, sp.top_p = pp->top_p, sp.min_p = pp->min_p;
        sp.repetition_penalty = pp->repetition_penalty, sp.presence_penalty = pp->presence_penalty;
        sp.frequency_penalty = pp->frequency_penalty, sp.top_k = pp->top_k,
        sp.logprobs = pp->logprobs;
        sp.n_stop_ids = 0;
        for (int32_t b = 1; b < pp->n_ban; b++)
            sp.stop_ids[sp.n_stop_ids++] = s->sample_tokens[pp->ban_offset + b];
        pg_plan_seq ps = {.seq_id = j,
                          .sp = &sp,
                          .history = s->sample_tokens + pp->hist_offset,
                          .n_history = pp->n_history,
                          .n_prompt = pp->n_prompt,
                          .n_generated = pp->n_generated,
                          .rng_seed = pp->seed,
                          .mask_eos = pp->n_ban > 0,
                          .eos_id = pp->n_ban > 0 ? s->sample_tokens[pp->ban_offset] : -1};
        memcpy(tmp, m->logits + (size_t)j * sh->vocab, sizeof(float) * (size_t)sh->vocab);
        pg_seq_output o;
        pg_sampler_sample(m->sampler, &ps, tmp, &o);
        memset(&out[j], 0, sizeof out[j]);
        out[j].token = o.token;
        out[j].logprob = o.logprob;
        out[j].n_top = o.n_top;
        memcpy(out[j].top_ids, o.top_ids, sizeof o.top_ids);
        memcpy(out[j].top_logprobs, o.top_logprobs, sizeof o.top_logprobs);
    }
    free(tmp), free(g), free(x), free(xn), free(qkv), free(q), free(att), free(k), free(v),
        free(gu), free(h), free(seqs);
    return 0;
}

int pg_cuda_model_last_logits(pg_cuda_model *m, float *out, int32_t n) {
    if (n > m->last_n) return pg_err_set(PG_EINVAL, "mock: last_logits");
    memcpy(out, m->logits, sizeof(float) * (size_t)n * (size_t)m->sh.vocab);
    return 0;
}

int pg_cuda_model_step_begin(pg_cuda_model *m, const pg_cuda_step *s) {
    if (m->n_open >= 2) return pg_err_set(PG_EINVAL, "mock: two steps open");
    const int32_t S = m->lim.max_seqs;
    if (!m->open_out[0]) {
        for (int i = 0; i < 2; i++) m->open_out[i] = pg_xcalloc((size_t)S, sizeof(pg_cuda_sample_out));
        m->last_tok = pg_xcalloc((size_t)S, sizeof(int32_t));
    }
    pg_cuda_step fs = *s;
    int32_t *tok = NULL;
    if (s->n_feed > 0) { // the device's gather, on the host
        tok = pg_xmalloc(sizeof(int32_t) * (size_t)(s->n_tokens ? s->n_tokens : 1));
        memcpy(tok, s->tokens, sizeof(int32_t) * (size_t)s->n_tokens);
        for (int32_t i = 0; i < s->n_feed; i++) {
            int32_t row = s->feed[2 * i], j = s->feed[2 * i + 1];
            if (row < 0 || row >= s->n_tokens || j < 0 || j >= m->n_last_tok) {
                free(tok);
                return pg_err_set(PG_EINVAL, "mock: fed token (%d, %d) out of range", row, j);
            }
            tok[row] = m->last_tok[j];
        }
        fs.tokens = tok;
    }
    const int b = m->next_buf;
    int rc = pg_cuda_model_step(m, &fs, m->open_out[b]);
    free(tok);
    if (rc < 0) return rc;
    for (int32_t j = 0; j < s->n_sample; j++) m->last_tok[j] = m->open_out[b][j].token;
    m->n_last_tok = s->n_sample;
    m->open_n[b] = s->n_sample;
    m->n_open++;
    m->next_buf = b ^ 1;
    return 0;
}

int pg_cuda_model_step_end(pg_cuda_model *m, pg_cuda_sample_out *out) {
    if (m->n_open == 0) return pg_err_set(PG_EINVAL, "mock: no step open");
    const int b = m->n_open == 2 ? m->next_buf : m->next_buf ^ 1; // the oldest
    memcpy(out, m->open_out[b], sizeof(pg_cuda_sample_out) * (size_t)m->open_n[b]);
    m->last_n = m->open_n[b];
    m->n_open--;
    return 0;
}
