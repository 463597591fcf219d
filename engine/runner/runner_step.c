// engine/runner/runner_step.c - the two halves of a step that the runner,
// its CUDA graphs (runner_graphs.c) and the fp8 KV-scale calibration
// (runner_kv_scales.c) all run: packing a step's inputs into the pinned
// image with one upload, and the forward through the layers. Below those
// three files, so none of them calls back up into another.
#include <string.h>

#include "common/err.h"
#include "engine/runner/runner_int.h"

// --- packing --------------------------------------------------------------------------

// Packs host arrays into the pinned image at 16-byte aligned offsets; the
// same offsets address the device copy after one upload.
typedef struct {
    char *host, *dev;
    size_t cap, used;
    bool overflow;
} packer;

static const void *put(packer *p, const void *src, size_t bytes) {
    size_t off = (p->used + 15) & ~(size_t)15;
    if (off + bytes > p->cap) {
        p->overflow = true;
        return NULL;
    }
    if (bytes) memcpy(p->host + off, src, bytes);
    p->used = off + bytes;
    return p->dev + off;
}

int runner_pack(pg_runner *r, const step_desc *s, dev_in *d) {
    const int32_t n = s->n_tokens, n_pre = s->n_seqs - s->n_decode;
    PG_ARG(n <= r->max_tokens && s->n_seqs <= r->max_seqs && s->n_sample <= r->max_seqs &&
               s->n_decode >= 0 && n_pre >= 0,
           "step: %d tokens / %d sequences (%d decode) beyond the limits %d / %d", n, s->n_seqs,
           s->n_decode, r->max_tokens, r->max_seqs);
    packer pk = {.host = r->in_host[r->next_buf], .dev = r->in_dev, .cap = r->in_cap};
    d->tok = put(&pk, s->tokens, sizeof(int32_t) * (size_t)n);
    d->pos = put(&pk, s->pos, sizeof(int32_t) * (size_t)n);
    const size_t groups = s->kv_groups > 1 ? (size_t)s->kv_groups : 1;
    PG_ARG(groups == (size_t)r->kv_layout.n_groups, "step: %zu KV groups, the runner's layout has %d", groups,
           r->kv_layout.n_groups);
    d->slots = put(&pk, s->slots, sizeof(int32_t) * (size_t)n * groups);
    d->bt = put(&pk, s->block_tables, sizeof(int32_t) * (size_t)s->n_seqs * (size_t)s->bt_stride * groups);
    d->lens = put(&pk, s->seq_lens, sizeof(int32_t) * (size_t)s->n_seqs);
    d->start = put(&pk, s->start_pos, sizeof(int32_t) * (size_t)s->n_seqs);
    d->cu = put(&pk, s->cu_q, sizeof(int32_t) * (size_t)(n_pre + 1));
    // The graph-safe LoRA op's rows, before everything sized by the samples
    // (a graph of the LoRA set reads them at this address).
    d->lora = s->lora_on_dev ? put(&pk, s->lora_rows, sizeof(int32_t) * (size_t)n) : NULL;
    d->rows = put(&pk, s->sample_rows, sizeof(int32_t) * (size_t)s->n_sample);
    d->params = put(&pk, s->params, sizeof(pg_sample_params) * (size_t)s->n_sample);
    d->stok = put(&pk, s->sample_tokens, sizeof(int32_t) * (size_t)s->n_sample_tokens);
    // Last: no graph reads it, so the addresses above stay a graph bucket's.
    d->feed = put(&pk, s->feed, sizeof(int32_t) * 2 * (size_t)s->n_feed);
    if (pk.overflow)
        return pg_err_set(PG_EINVAL,
                          "step: inputs exceed the %zu bytes sized at start (block tables of "
                          "stride %d, %d history tokens)",
                          pk.cap, s->bt_stride, s->n_sample_tokens);
    return r->be->dev->upload(r->be, r->in_dev, pk.host, pk.used);
}

pg_fwd_step runner_fwd_step(const pg_runner *r, const step_desc *s, const dev_in *d) {
    return (pg_fwd_step){
        .n_tokens = s->n_tokens,
        .tokens = d->tok,
        .pos = d->pos,
        .slots = d->slots,
        .attn = {.n_seqs = s->n_seqs,
                 .n_decode = s->n_decode,
                 .block_tables = d->bt,
                 .bt_stride = s->bt_stride,
                 .seq_lens = d->lens,
                 .start_pos = d->start,
                 .cu_q = d->cu,
                 .max_decode_ctx = s->max_decode_ctx,
                 .max_prefill_q = s->max_prefill_q,
                 .workspace = r->attn_ws,
                 .workspace_bytes = r->attn_ws_bytes,
                 .host_start_pos = s->start_pos,
                 .host_cu_q = s->cu_q},
        .n_logits = s->n_sample,
        .logit_rows = d->rows,
        .lora_rows = s->lora_rows,
        .lora_rows_dev = d->lora,
        .lora_dev_rows = d->lora ? s->lora_dev_rows : 0,
        .kv_layout = r->kv_layout.n_groups > 1 ? &r->kv_layout : NULL,
    };
}

int runner_layers(pg_runner *r, const step_desc *s, const dev_in *d) {
    pg_fwd_step fs = runner_fwd_step(r, s, d);
    return pg_model_forward_layers(r->model, r->kv, &r->bufs, &fs);
}
