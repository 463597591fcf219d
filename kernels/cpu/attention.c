// kernels/cpu/attention.c - causal attention over the paged KV cache.
//
// The reference implementation: each task is one (sequence, query head,
// chunk of queries); keys are visited block by block through the block
// table with an online softmax over chunks of positions, in f32.
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_backend.h"

#define Q_PER_TASK 16
#define KEY_CHUNK 256

typedef struct {
    float *out;
    const float *q;
    const pg_attn_seq *seqs;
    int32_t n_seqs, n_heads;
    float scale;
    const float *k_cache, *v_cache;
    pg_kv_shape kv;
    const int64_t *task_start; // [n_seqs + 1] first task index of each sequence
} attn_job;

static inline const float *kv_row(const float *cache, pg_kv_shape kv, const int32_t *table,
                                  int32_t pos, int32_t kvh) {
    int64_t block = table[pos / kv.block_size];
    int64_t slot = block * kv.block_size + pos % kv.block_size;
    return cache + (slot * kv.n_kv_heads + kvh) * kv.head_dim;
}

static void attend_one(const attn_job *j, const pg_attn_seq *s, int32_t h, int32_t qi) {
    const int32_t hd = j->kv.head_dim;
    const int32_t kvh = h / (j->n_heads / j->kv.n_kv_heads);
    const float *q = j->q + ((int64_t)(s->q_start + qi) * j->n_heads + h) * hd;
    float *out = j->out + ((int64_t)(s->q_start + qi) * j->n_heads + h) * hd;
    const int32_t n_keys = s->start_pos + qi + 1; // causal: keys up to its own position
    float acc[512];
    float scores[KEY_CHUNK];
    float m = -INFINITY, l = 0.0f;
    memset(acc, 0, sizeof(float) * (size_t)hd);
    for (int32_t t0 = 0; t0 < n_keys; t0 += KEY_CHUNK) {
        int32_t n = n_keys - t0 < KEY_CHUNK ? n_keys - t0 : KEY_CHUNK;
        float cmax = -INFINITY;
        for (int32_t t = 0; t < n; t++) {
            const float *k = kv_row(j->k_cache, j->kv, s->block_table, t0 + t, kvh);
            float d = 0.0f;
            for (int32_t e = 0; e < hd; e++) d += q[e] * k[e];
            scores[t] = d * j->scale;
            if (scores[t] > cmax) cmax = scores[t];
        }
        float m_new = cmax > m ? cmax : m;
        float corr = expf(m - m_new); // 0 on the first chunk (m = -inf)
        l *= corr;
        for (int32_t e = 0; e < hd; e++) acc[e] *= corr;
        for (int32_t t = 0; t < n; t++) {
            float p = expf(scores[t] - m_new);
            l += p;
            const float *v = kv_row(j->v_cache, j->kv, s->block_table, t0 + t, kvh);
            for (int32_t e = 0; e < hd; e++) acc[e] += p * v[e];
        }
        m = m_new;
    }
    float inv = 1.0f / l;
    for (int32_t e = 0; e < hd; e++) out[e] = acc[e] * inv;
}

static void attn_task(void *ctx, int64_t t, int thread) {
    const attn_job *j = ctx;
    int32_t si = 0;
    while (j->task_start[si + 1] <= t) si++;
    const pg_attn_seq *s = &j->seqs[si];
    int64_t local = t - j->task_start[si];
    int32_t n_chunks = (s->n_q + Q_PER_TASK - 1) / Q_PER_TASK;
    int32_t h = (int32_t)(local / n_chunks), c = (int32_t)(local % n_chunks);
    int32_t q1 = (c + 1) * Q_PER_TASK < s->n_q ? (c + 1) * Q_PER_TASK : s->n_q;
    for (int32_t qi = c * Q_PER_TASK; qi < q1; qi++) attend_one(j, s, h, qi);
}

void pg_cpu_attention(pg_backend *b, float *out, const float *q, const pg_attn_seq *seqs,
                      int32_t n_seqs, int32_t n_heads, float scale, const float *k_cache,
                      const float *v_cache, pg_kv_shape kv) {
    PG_CHECK(kv.head_dim <= 512 && n_heads % kv.n_kv_heads == 0);
    int64_t stack_starts[65];
    int64_t *starts = n_seqs < 65 ? stack_starts : pg_xmalloc(sizeof(int64_t) * (size_t)(n_seqs + 1));
    starts[0] = 0;
    for (int32_t i = 0; i < n_seqs; i++)
        starts[i + 1] = starts[i] + (int64_t)n_heads * ((seqs[i].n_q + Q_PER_TASK - 1) / Q_PER_TASK);
    attn_job j = {out, q, seqs, n_seqs, n_heads, scale, k_cache, v_cache, kv, starts};
    pg_pool_run(pg_cpu(b)->pool, starts[n_seqs], attn_task, &j);
    if (starts != stack_starts) free(starts);
}
