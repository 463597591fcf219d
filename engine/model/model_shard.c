// engine/model/model_shard.c - how a model splits across tensor-parallel ranks
// (Megatron-style; docs/tensor_parallel.md).
//
// Query heads, FFN columns and vocabulary rows split evenly. KV heads
// split evenly too; when there are fewer KV heads than ranks each rank
// holds the one KV head its query heads read (so the ranks sharing a KV
// head hold copies of it), which needs size to be a multiple of the KV
// head count so that no rank's query heads straddle two groups. Experts
// split as the dense FFN does: each rank a slice of every expert's columns
// (the router is whole on every rank, so all route alike).
#include "common/err.h"
#include "engine/model/model.h"

int pg_model_shard_plan(const pg_model_config *c, int32_t rank, int32_t size, pg_model_shard *out) {
    PG_ARG(size >= 1 && rank >= 0 && rank < size, "tensor parallel rank %d of %d", rank, size);
    if (c->n_heads % size)
        return pg_err_set(PG_EINVAL,
                          "tensor parallel size %d does not divide the model's %d attention heads", size,
                          c->n_heads);
    if (c->n_kv_heads % size && size % c->n_kv_heads)
        return pg_err_set(PG_EINVAL,
                          "tensor parallel size %d and the model's %d KV heads: one must divide the other",
                          size, c->n_kv_heads);
    if (c->ffn % size)
        return pg_err_set(PG_EINVAL, "tensor parallel size %d does not divide the model's FFN width %d", size,
                          c->ffn);
    if (c->n_experts > 0 && c->moe_ffn % size)
        return pg_err_set(PG_EINVAL, "tensor parallel size %d does not divide the experts' FFN width %d", size,
                          c->moe_ffn);
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
    s.moe_ffn = c->moe_ffn / size;
    s.moe_ffn0 = rank * s.moe_ffn;
    s.vocab = c->vocab_size / size;
    s.vocab0 = rank * s.vocab;
    *out = s;
    return 0;
}
