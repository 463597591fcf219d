// engine/runner/runner.c - batch plan -> block moves, one upload, the forward,
// sampling; the workspace and the profiling forward. One runner for every
// backend (kernels/backend.h): on the CPU each op runs when called, on the
// GPU a step is queued in begin and read back in end.
//
// A step: the plan is validated (block, token and move ranges, limits),
// flattened with decode sequences first (the decode attention takes
// sequence s at row s), packed into a pinned image at 16-byte offsets and
// uploaded in one copy; then the embedding and the layers (one CUDA graph
// per decode bucket, runner_graphs.c), the logit rows, the sampler, and a
// copy of the samples (172 B per sequence) back to pinned memory. The
// packing and the layers are runner_step.c, below this file, the graphs
// (runner_graphs.c) and the KV-scale calibration (runner_kv_scales.c).
#include "engine/runner/runner_int.h"

#include "engine/runner/sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

_Static_assert(sizeof(pg_block_move) == 2 * sizeof(int32_t), "pg_block_move is an int32 pair");
_Static_assert(PG_MAX_LOGPROBS == PG_SAMPLE_MAX_LOGPROBS, "logprob list lengths agree");

#define ALIGN 256

static size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

// Carves aligned pieces out of one allocation (sizes first, then bases).
typedef struct {
    size_t used;
    char *base;
} carver;

static void *take(carver *c, size_t bytes) {
    size_t off = align_up(c->used, ALIGN);
    c->used = off + bytes;
    return c->base ? c->base + off : NULL;
}

static pg_tensor act(carver *c, int32_t dtype, int64_t rows, int64_t cols) {
    const size_t elem = dtype == PG_DTYPE_F32 ? 4 : 2;
    return (pg_tensor){take(c, (size_t)rows * (size_t)cols * elem), dtype, rows, cols, cols};
}

// Bytes of packed step inputs at the limits (each array padded to 16 bytes).
static size_t input_capacity(const pg_model_config *mc, const pg_runner_config *cfg, int32_t max_tokens,
                             int32_t max_seqs) {
    const size_t T = (size_t)max_tokens, S = (size_t)max_seqs;
    // The profiling step's prefill sequence may be longer than max_model_len.
    const int32_t bs = cfg->block_size, len = cfg->max_model_len;
    const int32_t longest = len > max_tokens ? len : max_tokens;
    const size_t max_bt = (size_t)((longest + bs - 1) / bs) + 1;
    pg_kv_layout lay;
    pg_kv_layout_make(mc, cfg->kv_layer_groups, &lay);
    const size_t G = (size_t)lay.n_groups;
    size_t n = 0;
    n += 2 * (T * 4 + 16) + G * T * 4 + 16;                // tokens, pos, slots (per KV group)
    n += G * S * max_bt * 4 + 16;                          // block tables (per KV group)
    n += 3 * (S * 4 + 16) + 4 + 16;                        // seq_lens, start_pos, cu_q (+1)
    n += T * 4 + 16;                                       // LoRA rows for the graph-safe op (queue_step)
    n += S * 4 + 16;                                       // sample rows
    n += S * sizeof(pg_sample_params) + 16;                // params
    n += S * ((size_t)len + PG_MAX_STOP_IDS + 1) * 4 + 16; // histories and ban lists
    // logit bias pairs and allowed-token masks
    n += S * (2 * (size_t)PG_MAX_LOGIT_BIAS + ((size_t)mc->vocab_size + 31) / 32) * 4;
    n += S * 2 * 4 + 16;                                   // fed tokens (row, sample) pairs
    return align_up(n, 4096);
}

// Where each piece of the workspace goes (offsets when c->base is null).
typedef struct {
    pg_fwd_buffers bufs;
    void *attn_ws, *samp_ws, *out_dev, *in_dev, *plp_in_dev, *plp_out_dev, *kv_scales;
} ws_carved;

// Carves the workspace for `p`'s limits: activations in dt, the backend's
// attention and sampler workspaces, the samples and the packed inputs.
static void carve_workspace(const pg_model_config *mc, const pg_model_shard *sh, int32_t dt,
                            const pg_runner_ws_plan *p, carver *c, ws_carved *o) {
    const int64_t T = p->max_tokens, S = p->max_seqs, H = mc->hidden, hd = mc->head_dim;
    // This rank's heads, FFN columns and vocabulary rows.
    const int64_t q_dim = (int64_t)sh->n_heads * hd, qkv_dim = q_dim + 2 * (int64_t)sh->n_kv_heads * hd;
    *o = (ws_carved){0}; // what this configuration has no use for stays NULL
    pg_fwd_buffers *b = &o->bufs;
    b->x = act(c, dt, T, H);
    b->xn = act(c, dt, T, H); // normalised rows, or a [T][hidden] product before the residual add
    b->qkv = act(c, dt, T, qkv_dim);
    b->attn = act(c, dt, T, q_dim);
    b->gu = act(c, dt, T, 2 * (int64_t)sh->ffn);
    b->h = act(c, dt, T, sh->ffn);
    b->lg_in = act(c, dt, S, H);
    // 16-byte rows for cuBLASLt and the sampler: vocab rounded up to 8.
    const int64_t ld = ((int64_t)mc->vocab_size + 7) / 8 * 8;
    b->logits = act(c, dt, S, ld);
    b->logits.cols = mc->vocab_size;
    if (sh->comm) { // tensor parallelism (engine/model/model.c pg_model_forward_logits, engine/runner/sampler.c)
        b->lg_part = act(c, dt, S, sh->vocab);
        b->lg_all = take(c, (size_t)sh->size * (size_t)S * (size_t)sh->vocab * (dt == PG_DTYPE_F32 ? 4 : 2));
        b->cand = take(c, sizeof(pg_argmax) * (size_t)sh->size * (size_t)S);
        b->topk = take(c, sizeof(pg_argmax) * (size_t)sh->size * (size_t)S * PG_TOPK_EXCHANGE_MAX);
    }
    if (p->moe) { // mixture-of-experts layers (engine/model/moe.c)
        b->moe_ws = take(c, p->moe);
        b->moe_ws_bytes = p->moe;
    }
    if (p->lora) { // LoRA adapters (engine/model/lora.c)
        b->lora_ws = take(c, p->lora);
        b->lora_ws_bytes = p->lora;
    }
    o->attn_ws = p->attn ? take(c, p->attn) : NULL;
    o->samp_ws = p->sample ? take(c, p->sample) : NULL;
    o->out_dev = take(c, sizeof(pg_sample_out) * (size_t)S);
    o->plp_in_dev = take(c, runner_plp_in_bytes(p->max_tokens)); // prompt logprobs (runner_prompt_logprobs.c)
    o->plp_out_dev = take(c, runner_plp_out_bytes(p->max_tokens));
    o->in_dev = take(c, p->inputs);
    o->kv_scales = p->kv_scales ? take(c, p->kv_scales) : NULL; // fp8 KV (runner_kv_scales.c)
}

// The lora_apply workspace for max_tokens rows of any projection of the
// model's shard (0 without adapters).
static size_t lora_ws_bytes(const pg_model *m, int32_t max_tokens) {
    const pg_model_lora *lo = &m->lora;
    if (lo->n_slots == 0 || !m->be->ops->lora_workspace_bytes) return 0; // (the rank cap: slots fill at run time)
    const int32_t width = pg_model_lora_width(&m->cfg, &m->shard); // in and out alike
    return m->be->ops->lora_workspace_bytes(m->be, max_tokens, width, width, lo->max_rank, lo->n_slots);
}

void pg_runner_ws_limits(const pg_runner_config *cfg, int32_t *max_tokens, int32_t *max_seqs) {
    *max_tokens = cfg->max_num_batched_tokens;
    *max_seqs = cfg->max_num_seqs < cfg->max_num_batched_tokens ? cfg->max_num_seqs : cfg->max_num_batched_tokens;
}

void pg_runner_workspace_plan(const pg_model_config *mc, const pg_model_shard *sh, const pg_runner_config *cfg,
                              int32_t act_dtype, const pg_runner_ws_sizes *ws, pg_runner_ws_plan *out) {
    *out = (pg_runner_ws_plan){.attn = ws->attn, .sample = ws->sample, .moe = ws->moe, .lora = ws->lora};
    pg_runner_ws_limits(cfg, &out->max_tokens, &out->max_seqs);
    out->inputs = input_capacity(mc, cfg, out->max_tokens, out->max_seqs);
    if (cfg->kv_dtype == PG_KV_FP8_E4M3 && cfg->kv_scales != PG_KV_SCALES_ONE)
        out->kv_scales = sizeof(float) * (size_t)mc->n_layers * 2 * (size_t)sh->n_kv_heads;
    carver c = {0};
    ws_carved o;
    carve_workspace(mc, sh, act_dtype, out, &c, &o);
    out->bytes = align_up(c.used, ALIGN);
    out->pinned = 2 * (out->inputs + sizeof(pg_sample_out) * (size_t)out->max_seqs +
                       runner_plp_in_bytes(out->max_tokens) + runner_plp_out_bytes(out->max_tokens));
}

// Logit rows, sampling and the copy of the samples to `host`; does not wait.
// Under tensor parallelism the sampler's exchanges (engine/runner/sampler.h)
// spare gathering every logit where the rows allow it.
static int enqueue_tail(pg_runner *r, const step_desc *s, const dev_in *d, pg_sample_out *host) {
    if (s->n_sample == 0) return 0;
    pg_backend *be = r->be;
    pg_fwd_step fs = runner_fwd_step(r, s, d);
    const int32_t k = pg_sampler_exchange_k(s->params, s->n_sample, r->model->comm && !r->cfg.full_logits);
    // Every logit is in bufs.logits only when they were gathered (the
    // top-k exchange leaves -inf outside the ranks' candidates).
    r->logits_valid = k == 0;
    if (k == 1) {
        PG_TRY(pg_sampler_tp_greedy(r->model, &r->bufs, &fs, r->out_dev));
        return be->dev->download(be, host, r->out_dev, sizeof(pg_sample_out) * (size_t)s->n_sample);
    }
    if (k > 1)
        PG_TRY(pg_sampler_tp_topk(r->model, &r->bufs, &fs, d->params, k));
    else
        PG_TRY(pg_model_forward_logits(r->model, &r->bufs, &fs));
    pg_tensor logits = pg_tensor_view(r->bufs.logits, 0, s->n_sample, 0, r->bufs.logits.cols);
    PG_TRY(be->ops->sample(be, r->out_dev, logits, d->params, s->n_sample_tokens ? d->stok : d->tok,
                      r->samp_ws, r->samp_ws_bytes));
    return be->dev->download(be, host, r->out_dev, sizeof(pg_sample_out) * (size_t)s->n_sample);
}

// --- set-up -----------------------------------------------------------------------------

static void *xmalloc_n(size_t n, size_t size) {
    return pg_xcalloc(n ? n : 1, size);
}

// The profiling step: every kernel path at the largest size, on a
// temporary KV pool. n_dec decode sequences of 16 context tokens (they
// share one block, so their cache writes race; the values do not matter),
// then one prefill sequence with the remaining tokens from position 0.
// Every sequence samples; one asks for logprobs and one for top-p.
static int profile(pg_runner *r) {
    pg_backend *be = r->be;
    const pg_model_config *mc = &r->model->cfg;
    const int32_t T = r->max_tokens, S = r->max_seqs, bs = r->cfg.block_size;
    const int32_t n_dec = S > 1 ? S - 1 : 0, n_pre_tok = T - n_dec;
    const int32_t pre_blocks = (n_pre_tok + bs - 1) / bs, tmp_blocks = pre_blocks + 2;
    const int32_t bt_stride = pre_blocks > 1 ? pre_blocks : 1;
    const int32_t n_seqs = n_dec + (n_pre_tok > 0 ? 1 : 0);
    const size_t n_groups = (size_t)r->kv_layout.n_groups;
    int32_t *tok = xmalloc_n((size_t)T, 4), *pos = xmalloc_n((size_t)T, 4), *slots = xmalloc_n((size_t)T * n_groups, 4);
    int32_t *bt = xmalloc_n(n_groups * (size_t)n_seqs * (size_t)bt_stride, 4), *lens = xmalloc_n((size_t)n_seqs, 4);
    int32_t *start = xmalloc_n((size_t)n_seqs, 4), *rows = xmalloc_n((size_t)n_seqs, 4);
    int32_t cu[2] = {0, n_pre_tok};
    pg_sample_params *pp = xmalloc_n((size_t)n_seqs, sizeof *pp);
    for (int32_t i = 0; i < n_dec; i++) {
        tok[i] = i % mc->vocab_size;
        pos[i] = 15, slots[i] = 1 * bs + 15;
        bt[(size_t)i * bt_stride] = 1;
        lens[i] = 16, start[i] = 15, rows[i] = i;
    }
    for (int32_t t = 0; t < n_pre_tok; t++) {
        tok[n_dec + t] = (7 * t) % mc->vocab_size;
        pos[n_dec + t] = t;
        slots[n_dec + t] = (2 + t / bs) * bs + t % bs;
    }
    if (n_pre_tok > 0) {
        for (int32_t b = 0; b < pre_blocks; b++) bt[(size_t)n_dec * bt_stride + b] = 2 + b;
        lens[n_dec] = n_pre_tok, start[n_dec] = 0, rows[n_dec] = T - 1;
    }
    for (int32_t i = 0; i < n_seqs; i++)
        pp[i] = (pg_sample_params){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                   .logprobs = -1, .seed = (uint64_t)i};
    pp[0].logprobs = 5;
    if (n_seqs > 1) pp[1].temperature = 0.8f, pp[1].top_p = 0.9f;
    // KV layer groups: every group the same blocks (the values do not matter).
    const int32_t G = r->kv_layout.n_groups;
    for (int32_t g = 1; g < G; g++) {
        memcpy(slots + (size_t)g * T, slots, sizeof(int32_t) * (size_t)T);
        memcpy(bt + (size_t)g * n_seqs * bt_stride, bt, sizeof(int32_t) * (size_t)n_seqs * (size_t)bt_stride);
    }
    step_desc st = {.n_tokens = T, .tokens = tok, .pos = pos, .slots = slots, .n_seqs = n_seqs,
                    .n_decode = n_dec, .kv_groups = G, .block_tables = bt, .bt_stride = bt_stride, .seq_lens = lens,
                    .start_pos = start, .cu_q = cu, .max_decode_ctx = 16, .max_prefill_q = n_pre_tok,
                    .n_sample = n_seqs, .sample_rows = rows, .params = pp, .sample_tokens = tok,
                    .n_sample_tokens = 1};
    pg_kv_shape ks = {tmp_blocks, bs, r->model->shard.n_kv_heads, mc->head_dim, r->cfg.kv_dtype, NULL, false, 0, 0.0f};
    int rc = be->store->kv_create(be, r->kv_layout.n_slots, ks, 0, &r->kv);
    // Twice: the first loads kernels and creates GEMM plans, the second
    // shows the steady state (and is what a capture would see).
    for (int it = 0; it < 2 && rc == 0; it++) {
        dev_in d;
        if ((rc = runner_pack(r, &st, &d)) == 0 && (rc = runner_layers(r, &st, &d)) == 0 &&
            (rc = enqueue_tail(r, &st, &d, r->out_host[0])) == 0)
            rc = be->dev->sync(be);
    }
    if (rc < 0)
        pg_err_wrap(rc, "profiling step (%d tokens, %d sequences): ", T, n_seqs);
    else if (r->graphs_on)
        runner_graphs_probe(r); // on the temporary pool; never an error
    be->store->kv_free(be, r->kv);
    r->kv = NULL;
    free(tok), free(pos), free(slots), free(bt), free(lens), free(start), free(rows), free(pp);
    return rc;
}

int pg_runner_create(const pg_model *model, const pg_runner_config *cfg, pg_runner **out) {
    *out = NULL;
    if (cfg->block_size <= 0 || cfg->max_num_seqs <= 0 || cfg->max_num_batched_tokens <= 0 ||
        cfg->max_model_len <= 0)
        return pg_err_set(PG_EINVAL, "runner: block size, max_num_seqs, max_num_batched_tokens and "
                                     "max_model_len must be positive");
    pg_runner *r = pg_xcalloc(1, sizeof *r);
    pg_backend *be = model->be;
    const pg_model_config *mc = &model->cfg;
    r->model = model;
    r->be = be;
    r->cfg = *cfg;
    pg_runner_ws_limits(cfg, &r->max_tokens, &r->max_seqs);
    r->max_bt = (cfg->max_model_len + cfg->block_size - 1) / cfg->block_size;
    int rc = 0;
    if (cfg->kv_layer_groups && !be->caps->attn_window) {
        rc = pg_err_set(PG_EINVAL, "runner: KV layer groups need an attention that runs windows");
        goto fail;
    }
    pg_kv_layout_make(mc, cfg->kv_layer_groups, &r->kv_layout);
    int64_t free0 = 0, total = 0;
    if ((rc = be->dev->sync(be)) < 0 || (rc = be->dev->mem_info(be, &free0, &total)) < 0) goto fail;
    r->attn_ws_bytes = be->ops->attn_workspace_bytes(be, r->max_seqs, r->model->shard.n_heads, r->model->shard.n_kv_heads,
                                                mc->head_dim, cfg->max_model_len);
    r->samp_ws_bytes = be->ops->sample_workspace_bytes(be, r->max_seqs, mc->vocab_size);
    // The same pure plan `paged plan` sizes (engine/memplan.c).
    const size_t moe_ws = mc->n_experts > 0 && be->ops->moe_workspace_bytes
                              ? be->ops->moe_workspace_bytes(be, r->max_tokens, mc->hidden, model->shard.moe_ffn,
                                                             mc->n_experts, mc->n_experts_used)
                              : 0;
    const pg_runner_ws_sizes sizes = {.attn = r->attn_ws_bytes, .sample = r->samp_ws_bytes, .moe = moe_ws,
                                      .lora = lora_ws_bytes(model, r->max_tokens)};
    pg_runner_ws_plan wp;
    pg_runner_workspace_plan(mc, &model->shard, cfg, be->caps->act_dtype, &sizes, &wp);
    r->in_cap = wp.inputs;
    r->ws_bytes = wp.bytes;
    if ((rc = be->dev->alloc(be, r->ws_bytes, &r->ws)) < 0) {
        pg_err_wrap(rc, "the workspace for %d tokens / %d sequences per step (%.2f GiB; lower "
                        "--max-num-batched-tokens or --max-num-seqs): ",
                    r->max_tokens, r->max_seqs, (double)r->ws_bytes / (1 << 30));
        goto fail;
    }
    carver c = {0, r->ws};
    ws_carved o;
    carve_workspace(mc, &model->shard, be->caps->act_dtype, &wp, &c, &o);
    r->bufs = o.bufs;
    r->attn_ws = o.attn_ws, r->samp_ws = o.samp_ws;
    r->out_dev = o.out_dev, r->in_dev = o.in_dev;
    r->plp_in_dev = o.plp_in_dev, r->plp_out_dev = o.plp_out_dev;
    r->kv_scales_dev = o.kv_scales;
    for (int i = 0; i < 2; i++)
        if ((rc = be->dev->host_alloc(be, r->in_cap, (void **)&r->in_host[i])) < 0 ||
            (rc = be->dev->host_alloc(be, sizeof(pg_sample_out) * (size_t)r->max_seqs, (void **)&r->out_host[i])) < 0)
            goto fail;
    if ((rc = runner_plp_alloc(r)) < 0) goto fail;
    const size_t T = (size_t)r->max_tokens, S = (size_t)r->max_seqs;
    const size_t G = (size_t)r->kv_layout.n_groups;
    r->tokens = xmalloc_n(T, 4), r->pos = xmalloc_n(T, 4), r->slots = xmalloc_n(T * G, 4);
    r->lora_rows = xmalloc_n(T, 4);
    r->bt = xmalloc_n(G * S * (size_t)r->max_bt, 4);
    r->seq_lens = xmalloc_n(S, 4), r->start_pos = xmalloc_n(S, 4), r->cu_q = xmalloc_n(S + 1, 4);
    r->order = xmalloc_n(S, 4), r->row0 = xmalloc_n(S, 4), r->sample_rows = xmalloc_n(S, 4);
    r->params = xmalloc_n(S, sizeof(pg_sample_params));
    r->outs = xmalloc_n(S, sizeof(pg_seq_output));
    r->sampled[0] = xmalloc_n(S, sizeof(int64_t)), r->sampled[1] = xmalloc_n(S, sizeof(int64_t));
    r->feed = xmalloc_n(2 * S, 4);
    runner_spec_alloc(r);
    if ((rc = runner_graphs_setup(r)) < 0) goto fail;
    {
        const char *e = getenv("PAGED_LORA_DEV_EAGER");
        r->lora_dev_eager = model->lora.dev_table && e && atoi(e) != 0;
        // The split is the default where the backend has graphs (CUDA: the
        // graph-safe op's tiles beat BGMV on an eager step's decode rows,
        // +1.4% served W4 with 8 adapters on an H100, docs/lora.md "Split
        // eager steps"); on the CPU the graph-safe op is only the reference,
        // so there it stays off unless asked for. PAGED_LORA_SPLIT=0|1 says.
        e = getenv("PAGED_LORA_SPLIT");
        const bool split_default = be->caps->has_graphs;
        r->lora_split = model->lora.dev_table && (e && *e ? atoi(e) != 0 : split_default);
        if (r->lora_dev_eager || r->lora_split)
            PG_LOGI("LoRA: %s through the graph-safe op (%s)",
                    r->lora_dev_eager ? "eager steps" : "eager steps' decode rows",
                    r->lora_dev_eager ? "PAGED_LORA_DEV_EAGER=1"
                    : e && *e          ? "PAGED_LORA_SPLIT=1"
                                       : "the default with graphs; PAGED_LORA_SPLIT=0 turns it off");
    }
    // The profiling forward, where the backend can measure what it takes
    // (lazily loaded kernels, library plans, graph memory); elsewhere the
    // workspace is what was allocated.
    if (be->caps->measures_memory && (rc = profile(r)) < 0) goto fail;
    if ((rc = runner_kv_scales_init(r)) < 0) goto fail;
    int64_t free1 = free0;
    if ((rc = be->dev->sync(be)) < 0 || (rc = be->dev->mem_info(be, &free1, &total)) < 0) goto fail;
    r->workspace_measured = be->caps->measures_memory ? free0 - free1 : 0;
    if (r->workspace_measured < (int64_t)r->ws_bytes) r->workspace_measured = (int64_t)r->ws_bytes;
    *out = r;
    return 0;
fail:
    pg_runner_free(r);
    return rc;
}

void pg_runner_free(pg_runner *r) {
    if (!r) return;
    pg_backend *be = r->be;
    be->dev->sync(be);
    runner_graphs_free(r);
    if (r->kv) be->store->kv_free(be, r->kv);
    be->dev->free(be, r->ws);
    for (int i = 0; i < 2; i++) {
        be->dev->host_free(be, r->in_host[i]);
        be->dev->host_free(be, r->out_host[i]);
    }
    runner_plp_free(r);
    free(r->tokens), free(r->pos), free(r->slots), free(r->bt), free(r->lora_rows);
    free(r->seq_lens), free(r->start_pos), free(r->cu_q), free(r->order), free(r->row0);
    free(r->sample_rows), free(r->params), free(r->stok), free(r->outs);
    free(r->sampled[0]), free(r->sampled[1]), free(r->feed);
    runner_spec_free(r);
    free(r);
}

const pg_bkv *pg_runner_kv(const pg_runner *r) { return r->kv; }

size_t pg_runner_kv_bytes_per_block(const pg_runner *r) {
    const pg_model_config *mc = &r->model->cfg;
    pg_kv_shape s = {1, r->cfg.block_size, r->model->shard.n_kv_heads, mc->head_dim, r->cfg.kv_dtype, NULL, false, 0, 0.0f};
    return r->be->store->kv_block_bytes(r->be, r->kv_layout.n_slots, s);
}

const pg_kv_layout *pg_runner_kv_layout(const pg_runner *r) { return &r->kv_layout; }

void pg_runner_mem_get(const pg_runner *r, pg_runner_mem *out) {
    memset(out, 0, sizeof *out);
    pg_backend *be = r->be;
    if (be->dev->mem_info(be, &out->free, &out->total) < 0) out->free = out->total = 0;
    out->weights = r->model->weight_bytes;
    out->kv = r->kv ? (int64_t)r->kv->bytes : 0;
    out->workspace = r->workspace_measured;
    out->workspace_buffers = (int64_t)r->ws_bytes;
    out->graphs = r->graph_bytes;
    out->n_graphs = r->n_graphs;
    if (r->graphs_on && r->graph_reserve > r->graph_bytes)
        out->graphs_reserved = r->graph_reserve - r->graph_bytes;
    out->host_swap = r->kv ? (int64_t)r->kv->host_bytes : 0;
    // (Offload slots are the backend's own memory, not the mapping.)
    out->host_weights_mapped = be->caps->weights_borrow ? r->model->weight_bytes - r->model->offload.slots_bytes : 0;
    out->host_weights_offloaded = r->model->offload.host_bytes;
    out->host_kv = strcmp(be->name, "cpu") == 0 ? out->kv : 0;
    out->host_pinned = 2 * ((int64_t)r->in_cap + (int64_t)sizeof(pg_sample_out) * r->max_seqs);
    // On the CPU the machine's memory holds everything else too: "other"
    // means something only where mem_info tracks the backend's allocations.
    if (be->caps->measures_memory) {
        out->other = out->total - out->free - out->weights - out->kv - out->workspace - out->graphs;
        if (out->other < 0) out->other = 0;
    }
    be->dev->describe(be, out->device, sizeof out->device);
}

int pg_runner_alloc_kv(pg_runner *r, int32_t n_blocks, int32_t n_host_blocks) {
    PG_ARG(!r->kv, "runner: alloc_kv twice");
    PG_ARG(n_blocks >= 2 && n_host_blocks >= 0, "runner: %d KV blocks", n_blocks);
    const pg_model_config *mc = &r->model->cfg;
    pg_kv_shape s = {n_blocks, r->cfg.block_size, r->model->shard.n_kv_heads, mc->head_dim, r->cfg.kv_dtype, NULL, false, 0, 0.0f};
    PG_TRY(r->be->store->kv_create(r->be, r->kv_layout.n_slots, s, n_host_blocks, &r->kv));
    r->n_blocks = n_blocks;
    r->n_host_blocks = n_host_blocks;
    return runner_graphs_capture_all(r); // a no-op unless graphs are captured at start-up
}

int pg_runner_last_logits(pg_runner *r, float *out, int32_t n) {
    PG_ARG(n >= 0 && n <= r->last_n_sample, "last_logits: %d rows, the last step sampled %d", n,
           r->last_n_sample);
    // A step begun since has overwritten the logits (and logits_valid).
    PG_ARG(r->n_open == 0, "last_logits: a later step is begun, so the last ended step's logits are gone");
    if (n == 0) return 0;
    if (!r->logits_valid)
        return pg_err_set(PG_EINVAL, "last_logits: the last step was greedy across tensor-parallel ranks and "
                                     "gathered no logits (pg_runner_config.full_logits)");
    return r->be->ops->read_f32(r->be, r->bufs.logits, n, out);
}

// --- a step -----------------------------------------------------------------------------

static int32_t *stok_reserve(pg_runner *r, int64_t used, int64_t more) {
    if (used + more > r->cap_stok) {
        r->cap_stok = (used + more) * 2;
        r->stok = pg_xrealloc(r->stok, sizeof(int32_t) * (size_t)r->cap_stok);
    }
    return r->stok + used;
}

// The plan's sampling parameters for the sampler, field by field; the
// history only when a penalty reads it, the bans only while min_tokens is
// not reached.
// A draft's row t (speculative decoding) sees the history and the first t
// drafts as its output so far: `drafts` [n_drafts] extend the penalties'
// history, as if plain decoding had emitted them.
static void fill_params(pg_runner *r, const pg_plan_seq *s, int32_t mask_words, pg_sample_params *pp,
                        int64_t *n_stok, const int32_t *drafts, int32_t n_drafts) {
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
        const int32_t n = s->n_history + n_drafts;
        int32_t *dst = stok_reserve(r, *n_stok, n);
        memcpy(dst, s->history, sizeof(int32_t) * (size_t)s->n_history);
        if (n_drafts) memcpy(dst + s->n_history, drafts, sizeof(int32_t) * (size_t)n_drafts);
        pp->hist_offset = (int32_t)*n_stok;
        pp->n_history = n;
        pp->n_prompt = s->n_prompt;
        *n_stok += n;
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
    if (sp->n_logit_bias > 0) {
        int32_t n = sp->n_logit_bias > PG_MAX_LOGIT_BIAS ? PG_MAX_LOGIT_BIAS : sp->n_logit_bias;
        int32_t *dst = stok_reserve(r, *n_stok, 2 * (int64_t)n);
        for (int32_t i = 0; i < n; i++) {
            dst[2 * i] = sp->bias_ids[i];
            memcpy(&dst[2 * i + 1], &sp->bias_values[i], sizeof(float));
        }
        pp->bias_offset = (int32_t)*n_stok;
        pp->n_bias = n;
        *n_stok += 2 * n;
    }
    if (s->mask && mask_words > 0) { // the plan's token mask (pg_plan_seq.mask), copied at begin
        int32_t *dst = stok_reserve(r, *n_stok, mask_words);
        // A draft's row t has its own, after the first t drafts.
        memcpy(dst, s->mask + (size_t)n_drafts * (size_t)mask_words, sizeof(uint32_t) * (size_t)mask_words);
        pp->mask_offset = (int32_t)*n_stok;
        pp->n_mask = mask_words;
        *n_stok += mask_words;
    }
}

// Index of seq_id among the samples of the step begun last, or -1. Plans
// keep their order from step to step, so the search starts after the last hit.
static int32_t prev_sample(const pg_runner *r, int64_t seq_id, int32_t *hint) {
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

static int check_plan(const pg_runner *r, const pg_batch_plan *p, int32_t *bt_stride) {
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
    const int32_t G = r->kv_layout.n_groups;
    if ((p->kv_groups > 1 ? p->kv_groups : 1) != G)
        return pg_err_set(PG_EINVAL, "plan: %d KV groups, the runner's layout has %d", p->kv_groups, G);
    *bt_stride = 1;
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
            for (int32_t g = 0; g < G; g++) {
                // A windowed group's blocks before every query's window are
                // dropped: null (0), never read.
                const int32_t id = s->block_table[(size_t)b * G + g], w = r->kv_layout.window[g];
                const bool dropped = w > 0 && (int64_t)(b + 1) * bs <= (int64_t)s->start_pos - w + 1;
                if (id < (dropped ? 0 : 1) || id >= nd)
                    return pg_err_set(PG_EINVAL, "plan: block id %d out of range", id);
            }
        if (s->lora_id < 0 || s->lora_id > r->model->lora.n_slots)
            return pg_err_set(PG_EINVAL, "plan: sequence %lld asks for LoRA adapter %d of %d", (long long)s->seq_id,
                              s->lora_id, r->model->lora.n_slots);
        for (int32_t t = 0; t < s->n_tokens; t++)
            if ((s->tokens[t] < 0 || s->tokens[t] >= vocab) &&
                !(s->tokens[t] == PG_TOKEN_PENDING && s->n_tokens == 1))
                return pg_err_set(PG_EINVAL, "token id %d outside the vocabulary", s->tokens[t]);
        if (nb > *bt_stride) *bt_stride = nb;
    }
    return 0;
}

// The embedding, the layers (a graph replay for a captured decode bucket),
// the tail, and the record of this step's event.
static int queue_step(pg_runner *r, const step_desc *s) {
    pg_backend *be = r->be;
    step_desc padded;
    int32_t slot = -1;
    // Decode steps replay a graph: with LoRA rows one of the LoRA set's
    // (runner_graphs.c), when the backend has graph-safe LoRA.
    const bool g = runner_graph_step(r, s, &padded, &slot);
    const step_desc *run = g ? &padded : s;
    // docs/lora.md: with the split (the default on CUDA, PAGED_LORA_SPLIT)
    // an eager step's decode rows (rows 0 .. n_decode - 1) take the
    // graph-safe op, and the prefill chunks after them keep lora_apply
    // (runs of one adapter through dense products); under measurement,
    // PAGED_LORA_DEV_EAGER=1: eager steps' LoRA rows all take it.
    step_desc dev_rows;
    if (!g && s->lora_rows && (r->lora_dev_eager || (r->lora_split && s->n_decode > 0))) {
        dev_rows = *s;
        dev_rows.lora_on_dev = true;
        dev_rows.lora_dev_rows = r->lora_dev_eager ? 0 : s->n_decode;
        run = &dev_rows;
    }
    dev_in d;
    PG_TRY(runner_pack(r, run, &d));
    // Tokens sampled by the step before (async scheduling), straight from
    // its sampler output, which that step's copy to the host has already
    // read in stream order and this step's sampler overwrites later.
    if (s->n_feed > 0) PG_TRY(be->ops->feed_tokens(be, (int32_t *)d.tok, r->out_dev, d.feed, s->n_feed));
    if (g && r->graph_state[slot] == 1)
        PG_TRY(be->dev->graph_launch(be, r->graph_exec[slot]));
    else
        PG_TRY(runner_layers(r, run, &d));
    PG_TRY(runner_plp_enqueue(r, s->n_tokens, r->next_buf)); // before the tail: it reuses the logits
    PG_TRY(enqueue_tail(r, run, &d, r->out_host[r->next_buf]));
    // First eager step of this bucket: capture it for the next ones. The
    // capture wants an idle stream; this step then ends synchronously.
    if (g && r->graph_state[slot] == 0) {
        PG_TRY(be->dev->sync(be));
        runner_graph_capture(r, run, &d, slot);
    }
    return 0;
}

int pg_runner_begin(pg_runner *r, const pg_batch_plan *p) {
    pg_backend *be = r->be;
    const int32_t bs = r->cfg.block_size;
    int32_t bt_stride = 1;
    PG_TRY(check_plan(r, p, &bt_stride));
    if (r->n_open >= 2) return pg_err_set(PG_EINVAL, "runner: two steps begun and not ended");
    PG_ARG(r->kv, "runner: no KV cache (alloc_kv first)");

    // Block moves first: swap-out, swap-in (ordered after the compute work
    // queued so far), then copy-on-write copies. The host tier's copies
    // ahead (the last n_swap_out_ahead swap-outs) touch nothing of this
    // step: where the backend can, they run beside it, and the next step
    // waits for them (kv_swap_join below).
    const bool ahead = p->n_swap_out_ahead > 0 && be->store->kv_swap_ahead;
    const int32_t n_out = ahead ? p->n_swap_out - p->n_swap_out_ahead : p->n_swap_out;
    if (ahead)
        PG_TRY(be->store->kv_swap_ahead(be, r->kv, (const int32_t *)(p->swap_out + n_out), p->n_swap_out_ahead));
    if (n_out) PG_TRY(be->store->kv_swap(be, r->kv, (const int32_t *)p->swap_out, n_out, true));
    if (p->n_swap_in) PG_TRY(be->store->kv_swap(be, r->kv, (const int32_t *)p->swap_in, p->n_swap_in, false));
    if (p->n_copies) PG_TRY(be->store->kv_copy(be, r->kv, (const int32_t *)p->copies, p->n_copies));

    // Decode sequences (one query token) first, each group in plan order.
    int32_t n_dec = 0, k;
    for (int32_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].n_tokens == 1) r->order[n_dec++] = i;
    k = n_dec;
    for (int32_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].n_tokens != 1) r->order[k++] = i;

    int32_t row = 0, max_dec_ctx = 0, max_q = 0, n_feed = 0, hint = 0;
    bool lora = false;
    // KV layer groups: a block table and a slot per group ([g][n_seqs][bt_stride]
    // and, compacted below, [g][rows]; slots fill at a stride of max_tokens).
    const int32_t G = r->kv_layout.n_groups;
    const size_t bt_group = (size_t)p->n_seqs * (size_t)bt_stride;
    for (k = 0; k < p->n_seqs; k++) {
        const int32_t i = r->order[k];
        const pg_plan_seq *s = &p->seqs[i];
        const int32_t ctx = s->start_pos + s->n_tokens, nb = (ctx + bs - 1) / bs;
        r->row0[i] = row;
        r->seq_lens[k] = ctx;
        r->start_pos[k] = s->start_pos;
        if (G == 1) {
            memcpy(r->bt + (size_t)k * bt_stride, s->block_table, sizeof(int32_t) * (size_t)nb);
        } else {
            for (int32_t g = 0; g < G; g++)
                for (int32_t b = 0; b < nb; b++)
                    r->bt[g * bt_group + (size_t)k * bt_stride + b] = s->block_table[(size_t)b * G + g];
        }
        lora |= s->lora_id > 0;
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
            for (int32_t g = 0; g < G; g++)
                r->slots[(size_t)g * r->max_tokens + row] = s->block_table[(size_t)(pos / bs) * G + g] * bs + pos % bs;
            r->lora_rows[row] = s->lora_id - 1;
        }
    }
    r->cu_q[p->n_seqs - n_dec] = row - n_dec;
    for (int32_t g = 1; g < G; g++)
        memmove(r->slots + (size_t)g * row, r->slots + (size_t)g * r->max_tokens, sizeof(int32_t) * (size_t)row);

    // Sampled sequences in plan order: the row of their last token, or
    // with drafts their last n_draft + 1 rows (the target's view after the
    // last token and after each draft), all with the entry's parameters.
    int32_t ns = 0;
    int64_t n_stok = 0;
    const int buf = r->next_buf;
    r->spec[buf].n_out = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const pg_plan_seq *s = &p->seqs[i];
        if (!s->sample) continue;
        const int32_t rows = runner_spec_record(r, buf, s);
        if (rows < 0) return rows;
        if (ns + rows > r->max_seqs)
            return pg_err_set(PG_EINVAL, "plan: %d sampled rows, the runner was sized for %d", ns + rows,
                              r->max_seqs);
        for (int32_t t = 0; t < rows; t++) {
            r->sample_rows[ns] = r->row0[i] + s->n_tokens - rows + t;
            // A draft's rows feed no later step (such a sequence never runs ahead).
            r->sampled[buf][ns] = rows == 1 ? s->seq_id : -1;
            fill_params(r, s, p->mask_words, &r->params[ns], &n_stok, s->tokens + s->n_tokens - rows + 1, t);
            // Row t decides output position n_generated + t: its draw is
            // the one plain decoding would make there (runner_spec.c).
            r->params[ns].n_generated += t;
            ns++;
        }
    }
    PG_TRY(runner_plp_collect(r, p, buf));
    if (n_stok > INT32_MAX) return pg_err_set(PG_EINVAL, "plan: %lld history tokens", (long long)n_stok);

    if (row > 0 || ns > 0 || r->n_plp > 0) {
        step_desc st = {.n_tokens = row, .tokens = r->tokens, .pos = r->pos, .slots = r->slots,
                        .n_seqs = p->n_seqs, .n_decode = n_dec, .kv_groups = G, .block_tables = r->bt,
                        .bt_stride = bt_stride, .seq_lens = r->seq_lens, .start_pos = r->start_pos,
                        .cu_q = r->cu_q, .max_decode_ctx = max_dec_ctx, .max_prefill_q = max_q,
                        .n_sample = ns, .sample_rows = r->sample_rows, .params = r->params,
                        .sample_tokens = n_stok ? r->stok : r->tokens,
                        .n_sample_tokens = (int32_t)n_stok, .n_feed = n_feed, .feed = r->feed,
                        .lora_rows = lora ? r->lora_rows : NULL};
        PG_TRY(queue_step(r, &st));
    }
    PG_TRY(be->dev->record(be, buf));
    // After the step's own event: its outputs do not wait for the copies
    // ahead, the next step's work does.
    if (ahead) PG_TRY(be->store->kv_swap_join(be));
    r->n_sampled[buf] = ns;
    r->open[r->n_open].buf = buf;
    r->open[r->n_open].n_sample = ns;
    r->open[r->n_open].n_plp = r->n_plp;
    r->n_open++;
    r->next_buf = buf ^ 1;
    return 0;
}

int pg_runner_end(pg_runner *r, pg_step_output *out) {
    out->n = 0;
    out->outs = r->outs;
    out->n_prompt_lp = 0;
    out->prompt_lp = NULL;
    if (r->n_open == 0) return pg_err_set(PG_EINVAL, "runner: no step begun");
    const int buf = r->open[0].buf;
    const int32_t ns = r->open[0].n_sample, n_plp = r->open[0].n_plp;
    r->open[0] = r->open[1];
    r->n_open--;
    PG_TRY(r->be->dev->wait(r->be, buf));
    r->last_n_sample = ns;
    const int32_t n_out = r->spec[buf].n_out;
    for (int32_t e = 0, j = 0; e < n_out && j < ns; e++) {
        const pg_sample_out *so = &r->out_host[buf][j];
        pg_seq_output *o = &r->outs[e];
        memset(o, 0, sizeof *o);
        o->seq_id = r->spec[buf].seq[e];
        o->token = so->token;
        o->logprob = so->logprob;
        o->n_top = runner_copy_top(so, o->top_ids, o->top_logprobs);
        j += runner_spec_output(r, buf, e, j, so, o);
    }
    out->n = n_out;
    runner_plp_output(r, buf, n_plp, out);
    return 0;
}

int pg_runner_execute(pg_runner *r, const pg_batch_plan *p, pg_step_output *out) {
    out->n = 0;
    out->outs = r->outs;
    out->n_prompt_lp = 0;
    out->prompt_lp = NULL;
    if (r->n_open > 0) return pg_err_set(PG_EINVAL, "runner: a begun step is not ended");
    PG_TRY(pg_runner_begin(r, p));
    return pg_runner_end(r, out);
}
