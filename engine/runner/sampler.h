// engine/runner/sampler.h - how a step's logit rows reach the backend's
// sampler under tensor parallelism: the exchange protocol above the
// backend's sampling kernels (kernels/backend.h argmax_rows / argmax_pick /
// topk_rows / topk_scatter) and the communicator. docs/tensor_parallel.md
// says why each exchange is exact.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/model/model.h"

// How the rows of params [n] reach the sampler: 0 gathers every logit (and
// always without tensor parallelism, tp false), 1 exchanges the ranks'
// maxima (every row plain greedy), k > 1 exchanges each rank's k best
// (every row plain greedy or plain top-k up to PG_TOPK_EXCHANGE_MAX; the
// sampler depends on a top-k row's k best entries alone). A plain row
// reads and changes no other logit (no logprobs, penalties, bans, bias or
// mask) and its token is not fixed (a prompt-logprob row).
int32_t pg_sampler_exchange_k(const pg_sample_params *params, int32_t n, bool tp);

// k == 1: this rank's slice of the LM head, each row's maximum, an exchange
// of those (value, id) pairs and the same pick on every rank, into out
// [n_logits] (backend memory): no all-gather of the logits.
int pg_sampler_tp_greedy(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s, pg_sample_out *out);

// k > 1: the maxima exchange above, each rank's best k entries of its slice
// in the sampler's order (with the rows' temperatures in `params`, backend
// memory), an exchange of those, and bufs->logits rebuilt from them (-inf
// elsewhere), from which the backend's sampler draws the token the
// gathered logits would give.
int pg_sampler_tp_topk(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s,
                       const pg_sample_params *params, int32_t k);
