// engine/runner_cuda.c - batch plan -> one step on the GPU (host half).
//
// Turns a pg_batch_plan into the flattened batch the device expects
// (kernels/cuda/cuda_model.h): decode sequences (one token) first, as the
// decode attention kernel takes sequence s at row s, then prefill chunks;
// block tables padded to the step's longest; per sampled sequence its
// sampling parameters, with its history only when a penalty needs it and
// EOS/stop ids while min_tokens is not reached. Outputs come back in plan
// order, exactly as engine/runner.c returns them.
#include "engine/runner_cuda.h"

#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/progress.h"
#include "kernels/dtype.h"

_Static_assert(sizeof(pg_block_move) == 2 * sizeof(int32_t), "pg_block_move is an int32 pair");
_Static_assert(PG_MAX_LOGPROBS == PG_CUDA_MAX_LOGPROBS, "logprob list lengths agree");

struct pg_cuda_runner {
    const pg_llama *model;
    pg_cuda_runner_config cfg;
    pg_cuda_model *dev;
    int32_t n_blocks, n_host_blocks;
    // Limits; max_bt: block-table entries of the longest sequence.
    int32_t max_tokens, max_seqs, max_bt;
    // Per-step host arrays, sized for the limits at create.
    int32_t *tokens, *pos, *slots;        // [max_tokens]
    int32_t *bt;                          // [max_seqs][max_bt]
    int32_t *seq_lens, *start_pos, *cu_q; // [max_seqs] (+1 for cu_q)
    int32_t *order;                       // [max_seqs] device order -> plan index
    int32_t *row0;                        // [max_seqs] plan index -> first row
    int32_t *sample_rows;                 // [max_seqs] per sampled sequence: its row
    pg_cuda_sample_params *params;        // [max_seqs]
    int32_t *stok;                        // histories and ban lists (grown on demand)
    int64_t cap_stok;
    pg_cuda_sample_out *souts; // [max_seqs]
    pg_seq_output *outs;       // [max_seqs]
    // Async steps: per begun step the seq ids of its samples in plan order
    // (two buffers, alternating), the open steps' buffers oldest first, and
    // this step's fed tokens (row, index among the previous step's samples).
    int64_t *sampled[2]; // [max_seqs]
    int32_t n_sampled[2];
    int next_buf, open_buf[2], n_open;
    int32_t *feed; // [max_seqs][2]
};

int pg_cuda_runner_probe(char *why, size_t cap) {
    if (!pg_cuda_built()) {
        snprintf(why, cap, "this binary was built without CUDA (no nvcc at build time)");
        return 0;
    }
    int n = pg_cuda_device_count();
    if (n <= 0) snprintf(why, cap, "no CUDA device found (no NVIDIA driver, or no GPU visible)");
    return n;
}

size_t pg_cuda_runner_kv_bytes_per_block(const pg_model_config *c, int32_t block_size, int32_t kv_dtype) {
    // K and V, every layer, bf16 or fp8.
    return (size_t)2 * (size_t)c->n_layers * (size_t)block_size * (size_t)c->n_kv_heads *
           (size_t)c->head_dim * (kv_dtype == PG_KV_FP8_E4M3 ? 1 : 2);
}

// --- weights --------------------------------------------------------------------------

// One stored matrix to rows [row0, row0 + w->rows) of device weight `id`:
// bf16 rows are copied as they are, other types dequantized to f32 in
// chunks of PG_CUDA_UPLOAD_ELEMS and converted on the device.
static int upload_weight(pg_cuda_model *dev, pg_cuda_weight_id id, int32_t layer, int64_t row0,
                         const pg_weight *w, float *buf, pg_progress *pr) {
    int64_t rows, cols;
    pg_cuda_model_weight_dims(dev, id, &rows, &cols);
    if (!w->data || w->cols != cols || row0 + w->rows > rows)
        return pg_err_set(PG_EINVAL,
                          "cuda upload: weight %d of layer %d is %lldx%lld at row %lld, the device "
                          "tensor %lldx%lld",
                          (int)id, layer, (long long)w->rows, (long long)w->cols, (long long)row0,
                          (long long)rows, (long long)cols);
    const int64_t chunk = PG_CUDA_UPLOAD_ELEMS / cols;
    const bool raw_bf16 = w->dtype == PG_DTYPE_BF16 && w->row_bytes == (size_t)cols * 2;
    for (int64_t r = 0; r < w->rows; r += chunk) {
        int64_t nr = w->rows - r < chunk ? w->rows - r : chunk;
        const char *src = (const char *)w->data + (size_t)r * w->row_bytes;
        if (raw_bf16) {
            PG_TRY(pg_cuda_model_upload_rows(dev, id, layer, row0 + r, nr, src, PG_CUDA_BF16));
        } else {
            for (int64_t i = 0; i < nr; i++)
                pg_dequantize_row(w->dtype, src + (size_t)i * w->row_bytes, buf + i * cols, cols);
            PG_TRY(pg_cuda_model_upload_rows(dev, id, layer, row0 + r, nr, buf, PG_CUDA_F32));
        }
        pg_progress_add(pr, nr * (int64_t)w->row_bytes, r + nr >= w->rows ? 1 : 0);
    }
    return 0;
}

static int upload_linear(pg_cuda_model *dev, pg_cuda_weight_id id, int32_t layer,
                         const pg_linear *lin, float *buf, pg_progress *pr) {
    int64_t off = 0;
    for (int i = 0; i < lin->n_parts; i++) {
        PG_TRY(upload_weight(dev, id, layer, off, &lin->parts[i], buf, pr));
        off += lin->parts[i].rows;
    }
    return 0;
}

// A norm vector (host f32) to the device, counted as one tensor.
static int upload_norm(pg_cuda_model *dev, pg_cuda_weight_id id, int32_t layer, const float *v,
                       int64_t n, pg_progress *pr) {
    PG_TRY(pg_cuda_model_upload_rows(dev, id, layer, 0, 1, v, PG_CUDA_F32));
    pg_progress_add(pr, n * (int64_t)sizeof(float), 1);
    return 0;
}

static int64_t weight_bytes(const pg_weight *w) {
    return w->rows * (int64_t)w->row_bytes;
}

static int64_t linear_bytes(const pg_linear *lin) {
    int64_t n = 0;
    for (int i = 0; i < lin->n_parts; i++) n += weight_bytes(&lin->parts[i]);
    return n;
}

// Every weight of `m` to the device. This is where a checkpoint is read (the
// loaders map the files; the pages come in here), so it draws the load
// progress bar on a terminal and logs one summary line.
static int upload_model(pg_cuda_model *dev, const pg_llama *m) {
    const pg_model_config *c = &m->cfg;
    const bool tied = m->lm_head.data == m->tok_emb.data;
    const int64_t H = c->hidden;
    int64_t total = weight_bytes(&m->tok_emb) + (tied ? 0 : weight_bytes(&m->lm_head)) + H * 4;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const pg_llama_layer *L = &m->layers[l];
        total += 2 * H * 4 + linear_bytes(&L->qkv) + linear_bytes(&L->o) +
                 linear_bytes(&L->gate_up) + linear_bytes(&L->down);
    }
    pg_progress pr;
    pg_progress_begin(&pr, "loading weights", total, stderr);
    float *buf = pg_xmalloc(sizeof(float) * (size_t)PG_CUDA_UPLOAD_ELEMS);
    int rc = upload_weight(dev, PG_CUDA_W_EMB, 0, 0, &m->tok_emb, buf, &pr);
    if (rc == 0 && !tied) rc = upload_weight(dev, PG_CUDA_W_LM_HEAD, 0, 0, &m->lm_head, buf, &pr);
    if (rc == 0) rc = upload_norm(dev, PG_CUDA_W_FINAL_NORM, 0, m->final_norm, H, &pr);
    for (int32_t l = 0; rc == 0 && l < c->n_layers; l++) {
        const pg_llama_layer *L = &m->layers[l];
        if ((rc = upload_norm(dev, PG_CUDA_W_ATTN_NORM, l, L->attn_norm, H, &pr)) < 0 ||
            (rc = upload_norm(dev, PG_CUDA_W_FFN_NORM, l, L->ffn_norm, H, &pr)) < 0 ||
            (rc = upload_linear(dev, PG_CUDA_W_QKV, l, &L->qkv, buf, &pr)) < 0 ||
            (rc = upload_linear(dev, PG_CUDA_W_O, l, &L->o, buf, &pr)) < 0 ||
            (rc = upload_linear(dev, PG_CUDA_W_GATE_UP, l, &L->gate_up, buf, &pr)) < 0 ||
            (rc = upload_linear(dev, PG_CUDA_W_DOWN, l, &L->down, buf, &pr)) < 0)
            break;
    }
    free(buf);
    double secs = pg_progress_end(&pr);
    if (rc == 0)
        PG_LOGI("loaded %lld tensors, %.2f GB in %.2f s (%.2f GB/s, read and uploaded to the GPU)",
                (long long)pr.items, (double)pr.done / 1e9, secs,
                secs > 0 ? (double)pr.done / 1e9 / secs : 0.0);
    return rc;
}

// --- life cycle -----------------------------------------------------------------------

int pg_cuda_runner_create(const pg_llama *model, const pg_cuda_runner_config *cfg,
                          pg_cuda_runner **out) {
    *out = NULL;
    const pg_model_config *c = &model->cfg;
    if (cfg->block_size <= 0 || cfg->max_num_seqs <= 0 || cfg->max_num_batched_tokens <= 0 ||
        cfg->max_model_len <= 0)
        return pg_err_set(PG_EINVAL,
                          "cuda runner: block size, max_num_seqs, max_num_batched_tokens and "
                          "max_model_len must be positive");
    pg_cuda_runner *r = pg_xcalloc(1, sizeof *r);
    r->model = model;
    r->cfg = *cfg;
    r->max_tokens = cfg->max_num_batched_tokens;
    r->max_seqs = cfg->max_num_seqs < cfg->max_num_batched_tokens ? cfg->max_num_seqs
                                                                  : cfg->max_num_batched_tokens;
    r->max_bt = (cfg->max_model_len + cfg->block_size - 1) / cfg->block_size;
    pg_cuda_model_shape sh = {
        .vocab = c->vocab_size,
        .hidden = c->hidden,
        .n_layers = c->n_layers,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim,
        .ffn = c->ffn,
        .rms_eps = c->rms_eps,
        .tie_embeddings =
            cfg->dummy_weights ? c->tie_embeddings : model->lm_head.data == model->tok_emb.data,
        .kv_dtype = cfg->kv_dtype,
    };
    int rc = pg_cuda_model_create(&sh, model->inv_freq, cfg->device, &r->dev);
    if (rc == 0) rc = pg_cuda_model_set_graph_mode(r->dev, cfg->graphs);
    if (rc == 0) {
        if (cfg->dummy_weights)
            rc = pg_cuda_model_init_random(r->dev, cfg->dummy_seed,
                                           cfg->dummy_std > 0 ? cfg->dummy_std : 0.02f);
        else
            rc = upload_model(r->dev, model);
    }
    if (rc == 0) {
        pg_cuda_model_limits lim = {r->max_tokens, r->max_seqs, cfg->max_model_len,
                                    cfg->block_size};
        rc = pg_cuda_model_prepare(r->dev, &lim);
    }
    if (rc < 0) {
        pg_cuda_runner_free(r);
        return rc;
    }
    size_t T = (size_t)r->max_tokens, S = (size_t)r->max_seqs;
    r->tokens = pg_xmalloc(T * sizeof(int32_t));
    r->pos = pg_xmalloc(T * sizeof(int32_t));
    r->slots = pg_xmalloc(T * sizeof(int32_t));
    r->bt = pg_xmalloc(S * (size_t)r->max_bt * sizeof(int32_t));
    r->seq_lens = pg_xmalloc(S * sizeof(int32_t));
    r->start_pos = pg_xmalloc(S * sizeof(int32_t));
    r->cu_q = pg_xmalloc((S + 1) * sizeof(int32_t));
    r->order = pg_xmalloc(S * sizeof(int32_t));
    r->row0 = pg_xmalloc(S * sizeof(int32_t));
    r->sample_rows = pg_xmalloc(S * sizeof(int32_t));
    r->params = pg_xcalloc(S, sizeof(pg_cuda_sample_params));
    r->souts = pg_xcalloc(S, sizeof(pg_cuda_sample_out));
    r->outs = pg_xcalloc(S, sizeof(pg_seq_output));
    r->sampled[0] = pg_xcalloc(S, sizeof(int64_t));
    r->sampled[1] = pg_xcalloc(S, sizeof(int64_t));
    r->feed = pg_xcalloc(2 * S, sizeof(int32_t));
    *out = r;
    return 0;
}

void pg_cuda_runner_free(pg_cuda_runner *r) {
    if (!r) return;
    pg_cuda_model_free(r->dev);
    free(r->tokens);
    free(r->pos);
    free(r->slots);
    free(r->bt);
    free(r->seq_lens);
    free(r->start_pos);
    free(r->cu_q);
    free(r->order);
    free(r->row0);
    free(r->sample_rows);
    free(r->params);
    free(r->stok);
    free(r->souts);
    free(r->outs);
    free(r->sampled[0]);
    free(r->sampled[1]);
    free(r->feed);
    free(r);
}

void pg_cuda_runner_mem(const pg_cuda_runner *r, pg_cuda_mem_stats *out) {
    pg_cuda_model_mem(r->dev, out);
}

int pg_cuda_runner_alloc_kv(pg_cuda_runner *r, int32_t n_blocks, int32_t n_host_blocks) {
    PG_TRY(pg_cuda_model_alloc_kv(r->dev, n_blocks, n_host_blocks));
    r->n_blocks = n_blocks;
    r->n_host_blocks = n_host_blocks;
    return pg_cuda_model_capture_graphs(r->dev); // a no-op unless graphs are captured at start-up

}

int pg_cuda_runner_last_logits(pg_cuda_runner *r, float *out, int32_t n) {
    return pg_cuda_model_last_logits(r->dev, out, n);
}

// --- a step ---------------------------------------------------------------------------

static int32_t *stok_reserve(pg_cuda_runner *r, int64_t used, int64_t more) {
    if (used + more > r->cap_stok) {
        r->cap_stok = (used + more) * 2;
        r->stok = pg_xrealloc(r->stok, sizeof(int32_t) * (size_t)r->cap_stok);
    }
    return r->stok + used;
}

// engine/sampler.c's parameters, field by field; the history only when a
// penalty reads it, the bans only while min_tokens is not reached.
static void fill_params(pg_cuda_runner *r, const pg_plan_seq *s, pg_cuda_sample_params *pp,
                        int64_t *n_stok) {
    const pg_sampling_params *sp = s->sp;
    memset(pp, 0, sizeof *pp);
    pp->temperature = sp->temperature;
    pp->top_p = sp->top_p;
    pp->min_p = sp->min_p;
    pp->repetition_penalty = sp->repetition_penalty;
    pp->presence_penalty = sp->presence_penalty;
    pp->frequency_penalty = sp->frequency_penalty;
    pp->top_k = sp->top_k;
    pp->logprobs = sp->logprobs > PG_MAX_LOGPROBS ? PG_MAX_LOGPROBS : sp->logprobs;
    pp->seed = s->rng_seed;
    pp->n_generated = s->n_generated;
    bool pen = (sp->repetition_penalty != 1.0f && sp->repetition_penalty > 0) ||
               sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
    if (pen && s->n_history > 0) {
        int32_t *dst = stok_reserve(r, *n_stok, s->n_history);
        memcpy(dst, s->history, sizeof(int32_t) * (size_t)s->n_history);
        pp->hist_offset = (int32_t)*n_stok;
        pp->n_history = s->n_history;
        pp->n_prompt = s->n_prompt;
        *n_stok += s->n_history;
    }
    if (s->mask_eos) {
        int32_t *dst = stok_reserve(r, *n_stok, 1 + sp->n_stop_ids);
        int32_t n = 0;
        if (s->eos_id >= 0) dst[n++] = s->eos_id;
        for (int32_t i = 0; i < sp->n_stop_ids; i++) dst[n++] = sp->stop_ids[i];
        pp->ban_offset = (int32_t)*n_stok;
        pp->n_ban = n;
        *n_stok += n;
    }
}

// Index of seq_id among the samples of the step begun last, or -1. Plans
// keep their order from step to step, so the search starts after the last hit.
static int32_t prev_sample(const pg_cuda_runner *r, int64_t seq_id, int32_t *hint) {
    const int b = r->next_buf ^ 1;
    const int32_t n = r->n_sampled[b];
    for (int32_t k = 0; k < n; k++) {
        int32_t j = (*hint + k) % n;
        if (r->sampled[b][j] == seq_id) {
            *hint = j + 1;
            return j;
        }
    }
    return -1;
}

int pg_cuda_runner_begin(pg_cuda_runner *r, const pg_batch_plan *p) {
    const int32_t nd = r->n_blocks, nh = r->n_host_blocks, bs = r->cfg.block_size;
    const int32_t vocab = r->model->cfg.vocab_size;
    if ((p->n_swap_out || p->n_swap_in) && nh == 0)
        return pg_err_set(PG_EINVAL, "plan: swap requested but there is no swap space");
    PG_TRY(pg_block_moves_check(p->swap_out, p->n_swap_out, nd, nh, "swap-out"));
    PG_TRY(pg_block_moves_check(p->swap_in, p->n_swap_in, nh, nd, "swap-in"));
    PG_TRY(pg_block_moves_check(p->copies, p->n_copies, nd, nd, "copy"));
    if (p->n_seqs > r->max_seqs)
        return pg_err_set(PG_EINVAL, "plan: %d sequences, the runner was sized for %d", p->n_seqs,
                          r->max_seqs);
    int64_t n_tokens = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) n_tokens += p->seqs[i].n_tokens;
    if (n_tokens > r->max_tokens)
        return pg_err_set(PG_EINVAL, "plan: %lld tokens, the runner was sized for %d",
                          (long long)n_tokens, r->max_tokens);

    // Decode sequences (one query token) first, each group in plan order.
    int32_t n_dec = 0, k = 0;
    for (int32_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].n_tokens == 1) r->order[n_dec++] = i;
    k = n_dec;
    for (int32_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].n_tokens != 1) r->order[k++] = i;

    // Validate, and find the block-table stride of this step.
    int32_t bt_stride = 1;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const pg_plan_seq *s = &p->seqs[i];
        int64_t ctx = (int64_t)s->start_pos + s->n_tokens;
        if (s->n_tokens <= 0 || s->start_pos < 0 || (int64_t)s->n_blocks * bs < ctx)
            return pg_err_set(PG_EINVAL, "plan: sequence %lld has %d blocks for %lld positions",
                              (long long)s->seq_id, s->n_blocks, (long long)ctx);
        int32_t nb = (int32_t)((ctx + bs - 1) / bs);
        if (nb > r->max_bt)
            return pg_err_set(PG_EINVAL,
                              "plan: sequence %lld reaches %lld tokens, beyond max model length %d",
                              (long long)s->seq_id, (long long)ctx, r->cfg.max_model_len);
        for (int32_t b = 0; b < nb; b++)
            if (s->block_table[b] <= 0 || s->block_table[b] >= nd)
                return pg_err_set(PG_EINVAL, "plan: block id %d out of range", s->block_table[b]);
        for (int32_t t = 0; t < s->n_tokens; t++)
            if ((s->tokens[t] < 0 || s->tokens[t] >= vocab) &&
                !(s->tokens[t] == PG_TOKEN_PENDING && s->n_tokens == 1))
                return pg_err_set(PG_EINVAL, "token id %d outside the vocabulary", s->tokens[t]);
        if (nb > bt_stride) bt_stride = nb;
    }

    if (r->n_open >= 2) return pg_err_set(PG_EINVAL, "cuda runner: two steps begun and not ended");
    // Flatten in device order.
    int32_t row = 0, max_dec_ctx = 0, max_q = 0, n_feed = 0, hint = 0;
    for (k = 0; k < p->n_seqs; k++) {
        const int32_t i = r->order[k];
        const pg_plan_seq *s = &p->seqs[i];
        const int32_t ctx = s->start_pos + s->n_tokens, nb = (ctx + bs - 1) / bs;
        r->row0[i] = row;
        r->seq_lens[k] = ctx;
        r->start_pos[k] = s->start_pos;
        memcpy(r->bt + (size_t)k * bt_stride, s->block_table, sizeof(int32_t) * (size_t)nb);
        if (k < n_dec) {
            if (ctx > max_dec_ctx) max_dec_ctx = ctx;
        } else {
            r->cu_q[k - n_dec] = row - n_dec;
            if (s->n_tokens > max_q) max_q = s->n_tokens;
        }
        for (int32_t t = 0; t < s->n_tokens; t++, row++) {
            int32_t pos = s->start_pos + t;
            r->tokens[row] = s->tokens[t];
            if (s->tokens[t] == PG_TOKEN_PENDING) { // sampled by the step begun last
                int32_t j = prev_sample(r, s->seq_id, &hint);
                if (j < 0)
                    return pg_err_set(PG_EINVAL,
                                      "plan: sequence %lld has a pending token but did not "
                                      "sample in the previous step",
                                      (long long)s->seq_id);
                r->tokens[row] = 0; // a valid id until the device writes the token
                r->feed[2 * n_feed] = row;
                r->feed[2 * n_feed + 1] = j;
                n_feed++;
            }
            r->pos[row] = pos;
            r->slots[row] = s->block_table[pos / bs] * bs + pos % bs;
        }
    }
    r->cu_q[p->n_seqs - n_dec] = row - n_dec;

    // Sampled sequences in plan order: the row of their last token.
    int32_t ns = 0;
    int64_t n_stok = 0;
    const int buf = r->next_buf;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const pg_plan_seq *s = &p->seqs[i];
        if (!s->sample) continue;
        r->sample_rows[ns] = r->row0[i] + s->n_tokens - 1;
        r->sampled[buf][ns] = s->seq_id;
        fill_params(r, s, &r->params[ns], &n_stok);
        ns++;
    }
    if (n_stok > INT32_MAX)
        return pg_err_set(PG_EINVAL, "plan: %lld history tokens", (long long)n_stok);

    pg_cuda_step st = {
        .n_tokens = (int32_t)n_tokens,
        .tokens = r->tokens,
        .pos = r->pos,
        .slots = r->slots,
        .n_seqs = p->n_seqs,
        .n_decode = n_dec,
        .block_tables = r->bt,
        .bt_stride = bt_stride,
        .seq_lens = r->seq_lens,
        .start_pos = r->start_pos,
        .cu_q = r->cu_q,
        .max_decode_ctx = max_dec_ctx,
        .max_prefill_q = max_q,
        .n_sample = ns,
        .sample_rows = r->sample_rows,
        .params = r->params,
        .sample_tokens = n_stok ? r->stok : r->tokens,
        .n_sample_tokens = (int32_t)n_stok,
        .n_swap_out = p->n_swap_out,
        .n_swap_in = p->n_swap_in,
        .n_copies = p->n_copies,
        .swap_out = (const int32_t *)p->swap_out,
        .swap_in = (const int32_t *)p->swap_in,
        .copies = (const int32_t *)p->copies,
        .n_feed = n_feed,
        .feed = r->feed,
    };
    PG_TRY(pg_cuda_model_step_begin(r->dev, &st));
    r->n_sampled[buf] = ns;
    r->open_buf[r->n_open++] = buf;
    r->next_buf = buf ^ 1;
    return 0;
}

int pg_cuda_runner_end(pg_cuda_runner *r, pg_step_output *out) {
    out->n = 0;
    out->outs = r->outs;
    if (r->n_open == 0) return pg_err_set(PG_EINVAL, "cuda runner: no step begun");
    const int buf = r->open_buf[0];
    r->open_buf[0] = r->open_buf[1];
    r->n_open--;
    PG_TRY(pg_cuda_model_step_end(r->dev, r->souts));
    const int32_t ns = r->n_sampled[buf];
    for (int32_t j = 0; j < ns; j++) {
        const pg_cuda_sample_out *so = &r->souts[j];
        pg_seq_output *o = &r->outs[j];
        memset(o, 0, sizeof *o);
        o->seq_id = r->sampled[buf][j];
        o->token = so->token;
        o->logprob = so->logprob;
        o->n_top = so->n_top < 0 ? 0 : so->n_top > PG_MAX_LOGPROBS ? PG_MAX_LOGPROBS : so->n_top;
        memcpy(o->top_ids, so->top_ids, sizeof(int32_t) * (size_t)o->n_top);
        memcpy(o->top_logprobs, so->top_logprobs, sizeof(float) * (size_t)o->n_top);
    }
    out->n = ns;
    return 0;
}

int pg_cuda_runner_execute(pg_cuda_runner *r, const pg_batch_plan *p, pg_step_output *out) {
    out->n = 0;
    out->outs = r->outs;
    if (r->n_open > 0) return pg_err_set(PG_EINVAL, "cuda runner: a begun step is not ended");
    PG_TRY(pg_cuda_runner_begin(r, p));
    return pg_cuda_runner_end(r, out);
}
