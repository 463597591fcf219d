// engine/model/model.c - the model's forward as the runner calls it: the
// layers through the model's family (engine/model/family.h: one builder
// file per family over the shared layer helpers of engine/model/layers.h),
// then the head every family shares: the logit rows' final norm and LM
// head, with the tensor-parallel exchanges of greedy and top-k sampling.
//
// Every step is one op of kernels/backend.h at the fused granularity the
// GPU runs (the backend picks GEMV or GEMM, fuses the norm into the GEMV's
// prologue, ...), so no model file has device code or copies.
#include "engine/model/model.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/model/family.h"

int pg_model_forward_layers(const pg_model *m, pg_bkv *kv, const pg_fwd_buffers *bufs,
                            const pg_fwd_step *s) {
    return m->family->forward_layers(m, kv, bufs, s);
}

int pg_model_head_slice(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s, pg_tensor *part) {
    const pg_model_config *c = &m->cfg;
    const pg_model_shard *sh = &m->shard;
    pg_backend *be = m->be;
    const int64_t ns = s->n_logits;
    pg_tensor x = pg_tensor_view(bufs->x, 0, s->n_tokens, 0, bufs->x.cols);
    pg_tensor g = pg_tensor_view(bufs->lg_in, 0, ns, 0, bufs->lg_in.cols);
    // Only the rows that sample need the final norm and the LM head.
    PG_TRY(be->ops->gather(be, g, x, s->logit_rows));
    PG_TRY(be->ops->rmsnorm(be, g, g, m->final_norm, c->rms_eps));
    *part = pg_tensor_view(bufs->lg_part, 0, ns, 0, sh->vocab);
    part->stride = sh->vocab; // contiguous [ns][vocab slice]: what the all-gathers move
    PG_TRY(be->ops->linear(be, *part, g, NULL, 0.0f, m->lm_head, NULL, false, g));
    // Gemma 2: element by element, so each rank caps its own slice.
    return c->final_softcap > 0 ? be->ops->softcap(be, *part, c->final_softcap) : 0;
}

int pg_model_forward_logits(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s) {
    const pg_model_config *c = &m->cfg;
    const pg_model_shard *sh = &m->shard;
    pg_backend *be = m->be;
    const int64_t ns = s->n_logits;
    if (ns == 0) return 0;
    pg_tensor logits = pg_tensor_view(bufs->logits, 0, ns, 0, c->vocab_size);
    if (!m->comm) {
        pg_tensor x = pg_tensor_view(bufs->x, 0, s->n_tokens, 0, bufs->x.cols);
        pg_tensor g = pg_tensor_view(bufs->lg_in, 0, ns, 0, bufs->lg_in.cols);
        PG_TRY(be->ops->gather(be, g, x, s->logit_rows));
        PG_TRY(be->ops->rmsnorm(be, g, g, m->final_norm, c->rms_eps));
        PG_TRY(be->ops->linear(be, logits, g, NULL, 0.0f, m->lm_head, NULL, false, g));
        return c->final_softcap > 0 ? be->ops->softcap(be, logits, c->final_softcap) : 0;
    }
    // This rank's vocabulary slice, then every rank's side by side: each
    // rank samples from all the logits, and the same values give the same
    // token on every rank (docs/tensor_parallel.md).
    pg_tensor part;
    PG_TRY(pg_model_head_slice(m, bufs, s, &part));
    const size_t el = part.dtype == PG_DTYPE_F32 ? 4 : 2, bytes = (size_t)ns * (size_t)sh->vocab * el;
    PG_TRY(m->comm->all_gather(m->comm, part.data, bufs->lg_all, bytes));
    for (int32_t r = 0; r < sh->size; r++) {
        pg_tensor src = {(char *)bufs->lg_all + (size_t)r * bytes, part.dtype, ns, sh->vocab, sh->vocab};
        PG_TRY(be->ops->copy(be, pg_tensor_view(logits, 0, ns, (int64_t)r * sh->vocab, sh->vocab), src));
    }
    return 0;
}

int32_t pg_model_attn_window(const pg_model_config *c, const pg_backend_caps *caps) {
    // Gemma's local layers are not the family-wide window (their own, per layer).
    return caps->attn_window && c->swa_window == 0 ? pg_config_layer_window(c, 0) : 0;
}
