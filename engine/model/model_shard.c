// engine/model/model_shard.c - how a model splits across tensor-parallel ranks
// (Megatron-style; docs/tensor_parallel.md).
//
// Query heads, FFN columns and vocabulary rows split evenly. KV heads
// split evenly too; when there are fewer KV heads than ranks each rank
// holds the one KV head its query heads read (so the ranks sharing a KV
// head hold copies of it), which needs size to be a multiple of the KV
// head count so that no rank's query heads straddle two groups. Experts
// split as the dense FFN does: each rank a slice of every expert's columns
// (the router is whole on every rank, so all route alike); or, with
// expert parallelism, by experts: each rank n_experts / size whole ones,
// so that an expert's products stay whole (one read of its weights, no
// column slices too narrow to fill a GPU's tiles) and a rank's experts are
// one contiguous block of llama.cpp's stacked tensors.
#include <string.h>

#include "common/err.h"
#include "engine/model/model.h"

// This rank's experts: whole ones under expert parallelism, else a slice
// of every expert's columns.
static int shard_experts(const pg_model_config *c, bool ep, pg_model_shard *s) {
    s->exp0 = 0, s->n_exp = c->n_experts;
    s->moe_ffn = c->moe_ffn, s->moe_ffn0 = 0;
    if (c->n_experts <= 0) return 0;
    if (ep) {
        if (c->n_experts % s->size)
            return pg_err_set(PG_EINVAL, "--enable-expert-parallel: tensor parallel size %d does not divide the "
                              "model's %d experts", s->size, c->n_experts);
        s->expert_parallel = true;
        s->n_exp = c->n_experts / s->size;
        s->exp0 = s->rank * s->n_exp;
        return 0;
    }
    if (c->moe_ffn % s->size)
        return pg_err_set(PG_EINVAL, "tensor parallel size %d does not divide the experts' FFN width %d", s->size,
                          c->moe_ffn);
    s->moe_ffn = c->moe_ffn / s->size;
    s->moe_ffn0 = s->rank * s->moe_ffn;
    return 0;
}

int pg_model_shard_plan(const pg_model_config *c, int32_t rank, int32_t size, bool expert_parallel,
                        pg_model_shard *out) {
    PG_ARG(size >= 1 && rank >= 0 && rank < size, "tensor parallel rank %d of %d", rank, size);
    if (c->n_heads % size)
        return pg_err_set(PG_EINVAL,
                          "tensor parallel size %d does not divide the model's %d attention heads", size,
                          c->n_heads);
    if (c->n_kv_heads % size && size % c->n_kv_heads)
        return pg_err_set(PG_EINVAL,
                          "tensor parallel size %d and the model's %d KV heads: one must divide the other",
                          size, c->n_kv_heads);
    // The dense FFN's width matters only where a layer has one (Mixtral's
    // intermediate_size is its experts' width: expert parallelism keeps it whole).
    const bool dense_ffn = pg_config_has_dense_ffn(c) || !expert_parallel;
    if (dense_ffn && c->ffn % size)
        return pg_err_set(PG_EINVAL, "tensor parallel size %d does not divide the model's FFN width %d", size,
                          c->ffn);
    if (c->vocab_size % size)
        return pg_err_set(PG_EINVAL, "tensor parallel size %d does not divide the model's vocabulary of %d",
                          size, c->vocab_size);
    pg_model_shard s = {.rank = rank, .size = size, .comm = size > 1};
    s.n_heads = c->n_heads / size;
    s.head0 = rank * s.n_heads;
    if (c->n_kv_heads >= size) {
        s.n_kv_heads = c->n_kv_heads / size;
        s.kv_head0 = rank * s.n_kv_heads;
    } else {
        s.n_kv_heads = 1;
        s.kv_head0 = rank / (size / c->n_kv_heads);
    }
    s.ffn = c->ffn / size;
    s.ffn0 = rank * s.ffn;
    PG_TRY(shard_experts(c, expert_parallel, &s));
    s.vocab = c->vocab_size / size;
    s.vocab0 = rank * s.vocab;
    *out = s;
    return 0;
}

void *pg_model_unpermute_rows(pg_weight *w, int32_t n_heads) {
    const int64_t hd = w->rows / n_heads, half = hd / 2;
    char *dst = pg_xmalloc(w->row_bytes * (size_t)w->rows);
    const char *src = w->data;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int64_t s = 0; s < 2; s++)
                memcpy(dst + (size_t)(h * hd + s * half + i) * w->row_bytes,
                       src + (size_t)(h * hd + 2 * i + s) * w->row_bytes, w->row_bytes);
    w->data = dst;
    return dst;
}

int pg_model_slice_cols(pg_weight *w, int64_t c0, int64_t n, void **copy) {
    *copy = NULL;
    const int be = pg_dtype_block_elems(w->dtype);
    if (c0 % be || n % be)
        return pg_err_set(PG_EINVAL, "(%s, blocks of %d) cannot be split at columns %lld..%lld for tensor "
                          "parallelism", pg_dtype_name(w->dtype), be, (long long)c0, (long long)(c0 + n));
    const size_t off = pg_dtype_row_bytes(w->dtype, c0), rb = pg_dtype_row_bytes(w->dtype, n);
    if (w->data && w->rows == 1) {
        w->data = (const char *)w->data + off;
    } else if (w->data) {
        char *dst = *copy = pg_xmalloc(rb * (size_t)w->rows);
        for (int64_t r = 0; r < w->rows; r++)
            memcpy(dst + (size_t)r * rb, (const char *)w->data + (size_t)r * w->row_bytes + off, rb);
        w->data = dst;
    }
    w->cols = n;
    w->row_bytes = rb;
    return 0;
}
