// engine/runner/runner_int.h - the runner's state, shared by runner.c (steps,
// set-up) and runner_graphs.c (decode-graph buckets). Internal.
#pragma once
#include <string.h>

#include "engine/runner/runner.h"

// The decode graphs' bucket arrays (runner_graphs.c): batch sizes, contexts.
enum { RUNNER_MAX_BBUCKETS = 16, RUNNER_MAX_CBUCKETS = 32 };

// One step flattened on the host: rows of decode sequences (one query each,
// the last of its context) first: sequence s < n_decode owns row s;
// sequence s >= n_decode owns rows [n_decode + cu_q[s - n_decode],
// n_decode + cu_q[s - n_decode + 1]). Host arrays.
// With KV layer groups (kv_groups > 1) slots and block_tables hold a copy
// per group: [kv_groups][n_tokens] and [kv_groups][n_seqs][bt_stride].
typedef struct step_desc {
    int32_t n_tokens;
    const int32_t *tokens, *pos, *slots; // [n_tokens] (slots: per group)
    int32_t n_seqs, n_decode;
    int32_t kv_groups;                   // 0 or 1: one
    const int32_t *block_tables;         // [n_seqs][bt_stride] (per group)
    int32_t bt_stride;
    const int32_t *seq_lens, *start_pos; // [n_seqs]
    const int32_t *cu_q;                 // [n_seqs - n_decode + 1]
    int32_t max_decode_ctx, max_prefill_q;
    int32_t n_sample;
    const int32_t *sample_rows;          // [n_sample]
    const pg_sample_params *params;      // [n_sample]
    const int32_t *sample_tokens;        // histories and ban lists the params point into
    int32_t n_sample_tokens;
    int32_t n_feed;                      // async: [n_feed][2] (row, index among the
    const int32_t *feed;                 //   previous step's samples)
    const int32_t *lora_rows;            // host [n_tokens] adapter slots (-1: none); NULL: no LoRA row
    bool lora_on_dev;                    // upload lora_rows: the forward runs the graph-safe LoRA op
    int32_t lora_dev_rows;               // with lora_on_dev: pg_fwd_step's split (0: every row)
} step_desc;

// The same arrays after the upload, in backend memory.
typedef struct dev_in {
    const int32_t *tok, *pos, *slots, *bt, *lens, *start, *cu, *lora, *rows, *stok, *feed; // lora: NULL unless uploaded
    const pg_sample_params *params;
} dev_in;

struct pg_runner {
    const pg_model *model;
    pg_backend *be;
    pg_runner_config cfg;
    // Limits; max_bt: block-table entries of the longest sequence.
    int32_t max_tokens, max_seqs, max_bt;
    pg_bkv *kv;
    int32_t n_blocks, n_host_blocks;
    pg_kv_layout kv_layout; // KV layer groups (one group when off)

    // Workspace: one backend allocation carved for the limits.
    void *ws;
    size_t ws_bytes;
    pg_fwd_buffers bufs; // full-capacity views
    void *attn_ws;
    size_t attn_ws_bytes;
    void *samp_ws;
    size_t samp_ws_bytes;
    pg_sample_out *out_dev; // [max_seqs]
    float *kv_scales_dev;   // fp8 KV scales in the workspace (runner_kv_scales.c); NULL: none
    char *in_dev;           // packed step inputs
    size_t in_cap;
    int64_t workspace_measured;
    // Two pinned input images and output buffers, alternating per begun
    // step: step N + 2 reuses step N's, and begins only after N ended.
    char *in_host[2];
    pg_sample_out *out_host[2];
    int next_buf;
    struct {
        int buf;
        int32_t n_sample;
        int32_t n_seq_ids;
        int32_t n_plp; // scored prompt rows
    } open[2]; // begun, not ended, oldest first
    int n_open;
    int32_t last_n_sample; // of the last ended step (pg_runner_last_logits)
    bool logits_valid;     // the last queued step computed every logit (no exchange across ranks);
                           //   read by pg_runner_last_logits only when no step is open

    // Per-step host arrays, sized for the limits at create.
    int32_t *tokens, *pos, *slots;        // [max_tokens]
    int32_t *lora_rows;                   // [max_tokens] each row's adapter slot (-1: none)
    int32_t *bt;                          // [max_seqs][max_bt]
    int32_t *seq_lens, *start_pos, *cu_q; // [max_seqs] (+1 for cu_q)
    int32_t *order;                       // [max_seqs] device order -> plan index
    int32_t *row0;                        // [max_seqs] plan index -> first row
    int32_t *sample_rows;                 // [max_seqs]
    pg_sample_params *params;             // [max_seqs]
    int32_t *stok;                        // histories and ban lists (grown on demand)
    int64_t cap_stok;
    pg_seq_output *outs;                  // [max_seqs]
    // Per begun step: the seq ids of its samples in plan order.
    int64_t *sampled[2]; // [max_seqs]
    int32_t n_sampled[2];
    int32_t *feed;       // [max_seqs][2]
    // Per begun step: its outputs (runner_spec.c): sampled entries, each
    // with its seq id and drafts (k rows beyond its own: n_out <= rows).
    struct runner_spec_buf {
        int64_t *seq;   // [max_seqs]
        int32_t *k;     // [max_seqs]
        int32_t *draft; // [max_seqs][PG_MAX_DRAFT]
        int32_t n_out;
    } spec[2];
    // The tokens a verified draft emits, each as its own output with its
    // row's logprob and top entries (pg_seq_output.spec_rows points in):
    // one per sampled row at most, [max_seqs]; valid until the next end.
    pg_seq_output *spec_out;

    // Prompt logprobs (runner_prompt_logprobs.c): this begin's scored rows,
    // at most max_tokens. Device: inputs (rows, forced params) and scores
    // in the workspace; host: two pinned images alternating as in_host.
    char *plp_in_dev;            // [runner_plp_in_bytes]
    pg_sample_out *plp_out_dev;  // [max_tokens]
    char *plp_in_host[2];
    pg_sample_out *plp_host[2];  // [max_tokens]
    int64_t *plp_seq[2];         // [max_tokens] seq id and scored position per row
    int32_t *plp_pos[2];
    int32_t n_plp;               // of the step being begun
    pg_prompt_logprob *plp_outs; // [max_tokens] the last ended step's

    // Decode graphs [n_bbuckets][n_cbuckets] (runner_graphs.c).
    bool graphs_on;
    int64_t graph_reserve; // bytes planned for every bucket's graph
    int32_t bbuckets[RUNNER_MAX_BBUCKETS], n_bbuckets; // 1, 2, 4, ... < max_seqs, max_seqs
    int32_t cbuckets[RUNNER_MAX_CBUCKETS], n_cbuckets; // 256, 512, ... < max_model_len, max_model_len
    int32_t n_graph_sets; // 1, or 2 with graph-safe LoRA: [set][n_bbuckets][n_cbuckets]
    bool lora_dev_eager;  // PAGED_LORA_DEV_EAGER=1: eager LoRA steps take lora_apply_dev too
    bool lora_split;      // an eager step's decode rows take it, the rest lora_apply (CUDA's default; PAGED_LORA_SPLIT)
    void **graph_exec;
    int8_t *graph_state; // 0 none yet, 1 ready, -1 capture failed (stays eager)
    int64_t graph_bytes;
    int32_t n_graphs;
    // Padded host copies of a decode step: [max_seqs], g_bt [max_seqs][g_max_bt].
    int32_t *g_tok, *g_pos, *g_slots, *g_lens, *g_start, *g_bt;
    int32_t *g_lora; // [max_seqs] the rows' adapter slots (-1: none, and pad rows)
    int32_t g_max_bt;
};

// --- runner_step.c: below the runner, its graphs and its KV-scale calibration ---

// Packs the host arrays of `s` into this step's pinned image and uploads
// them in one copy. Offsets depend only on the array sizes, so two steps of
// one graph bucket find their inputs at the same device addresses.
int runner_pack(pg_runner *r, const step_desc *s, dev_in *d);
// The model's view of a packed step `s` (its inputs at d's device addresses).
pg_fwd_step runner_fwd_step(const pg_runner *r, const step_desc *s, const dev_in *d);
// The embedding and every layer for `s` (what a decode graph captures).
int runner_layers(pg_runner *r, const step_desc *s, const dev_in *d);
// A sample's top list (at most PG_MAX_LOGPROBS) into an output's arrays;
// returns its length. Generated tokens and scored prompt rows alike.
static inline int32_t runner_copy_top(const pg_sample_out *so, int32_t *ids, float *logprobs) {
    const int32_t n = so->n_top < 0 ? 0 : so->n_top > PG_MAX_LOGPROBS ? PG_MAX_LOGPROBS : so->n_top;
    memcpy(ids, so->top_ids, sizeof(int32_t) * (size_t)n);
    memcpy(logprobs, so->top_logprobs, sizeof(float) * (size_t)n);
    return n;
}

// fp8 KV: the scales into kv_scales_dev (the checkpoint's, or calibrated by
// one prefill on a temporary pool) and bufs.kv_scales; a no-op otherwise.
int runner_kv_scales_init(pg_runner *r);

// runner_prompt_logprobs.c: bytes of the device input image and scores.
size_t runner_plp_in_bytes(int32_t max_tokens);
size_t runner_plp_out_bytes(int32_t max_tokens);
// The pinned images and host arrays (create); free takes what alloc made.
int runner_plp_alloc(pg_runner *r);
void runner_plp_free(pg_runner *r);
// The plan's scored rows into image `buf` (begin, after the rows are
// flattened: r->row0); sets r->n_plp. PG_EINVAL on an entry that scores
// rows it does not have.
int runner_plp_collect(pg_runner *r, const pg_batch_plan *p, int buf);
// After the layers of a step of n_tokens rows: uploads image `buf`, scores
// the rows in slices of max_seqs and queues the copy of the scores back.
int runner_plp_enqueue(pg_runner *r, int32_t n_tokens, int buf);
// The n scores of the ended step that used `buf` into out->prompt_lp.
void runner_plp_output(pg_runner *r, int buf, int32_t n, pg_step_output *out);

// runner_spec.c: speculative decoding's rows (pg_plan_seq.n_draft).
void runner_spec_alloc(pg_runner *r);
void runner_spec_free(pg_runner *r);
// Sampled entry s of the plan begun in `buf`, its output index the next:
// records its seq id and drafts, and returns the rows it samples (k + 1,
// the last k + 1 of the entry), or PG_EINVAL for a bad n_draft.
int32_t runner_spec_record(pg_runner *r, int buf, const pg_plan_seq *s);
// Output e of the step ended from `buf`, from its rows so[0 .. k] (the
// step's sampled rows from `row` on): the greedy verification of its drafts
// (pg_spec_verify_greedy) into o, each emitted token also as its own
// output in r->spec_out[row ..] (o->spec_rows). Returns the rows it took.
int32_t runner_spec_output(const pg_runner *r, int buf, int32_t e, int32_t row, const pg_sample_out *so,
                           pg_seq_output *o);

// runner_graphs.c
int runner_graphs_setup(pg_runner *r);
void runner_graphs_free(pg_runner *r);
// A decode-only step padded to its bucket: *ps (host arrays in r->g_*)
// and *slot; false when the step is no graph candidate.
bool runner_graph_step(pg_runner *r, const step_desc *s, step_desc *ps, int32_t *slot);
// Captures runner_layers for the padded step on an idle stream; a failure
// leaves the bucket eager (logged), never an error.
void runner_graph_capture(pg_runner *r, const step_desc *ps, const dev_in *d, int32_t slot);
// Measures one graph's memory on the profiling pool and sets graph_reserve.
void runner_graphs_probe(pg_runner *r);
// Captures every start-up bucket (after the KV pool exists).
int runner_graphs_capture_all(pg_runner *r);
