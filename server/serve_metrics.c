// server/serve_metrics.c - the /metrics families of `paged serve`.
#include "server/serve_metrics.h"

#include <stdio.h>
#include <string.h>

#include "common/err.h"

// vLLM's bucket boundaries, so histogram_quantile panels read the same.
static const double TTFT_BUCKETS[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                      0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                      20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double TPOT_BUCKETS[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                      0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double LATENCY_BUCKETS[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                         5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                         60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

// 1, 2, 5, 10, 20, 50, ... up to max (vLLM's build_1_2_5_buckets).
static int buckets_125(double *out, int cap, double max) {
    int n = 0;
    for (double mag = 1; n < cap; mag *= 10) {
        static const double m[] = {1, 2, 5};
        for (int i = 0; i < 3 && n < cap; i++) {
            double v = m[i] * mag;
            if (v > max) return n;
            out[n++] = v;
        }
    }
    return n;
}

static met_child *one(met_family *f, const char *model) {
    PG_CHECK(f != NULL);
    return met_child1(f, model);
}

void srv_metrics_init(srv_metrics *m, const char *model_name, int32_t max_model_len) {
    memset(m, 0, sizeof *m);
    m->model_name = model_name;
    met_registry *r = m->reg = met_registry_create();
    const char *mn = model_name;
    const char *L = "model_name";

    m->running = one(met_gauge(r, "paged:num_requests_running", "Number of requests in model execution batches.", L), mn);
    m->waiting = one(met_gauge(r, "paged:num_requests_waiting", "Number of requests waiting to be processed.", L), mn);
    m->swapped = one(met_gauge(r, "paged:num_requests_swapped", "Number of requests swapped to CPU.", L), mn);
    m->kv_usage = one(met_gauge(r, "paged:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", L), mn);
    m->gpu_usage = one(met_gauge(r, "paged:gpu_cache_usage_perc", "Device KV-cache usage. 1 means 100 percent usage.", L), mn);
    m->host_kv_usage = one(met_gauge(r, "paged:cpu_cache_usage_perc", "Host KV-cache usage: blocks held by swapped requests or cached by the host tier. 1 means 100 percent usage.", L), mn);
    m->prefix_hit_rate = one(met_gauge(r, "paged:gpu_prefix_cache_hit_rate", "Prefix cache hit rate (tokens found / tokens looked up).", L), mn);
    met_family *blocks = met_gauge(r, "paged:kv_cache_blocks", "Device KV blocks by state (total usable, used by requests, cached by the prefix cache and free to evict).", "model_name,state");
    PG_CHECK(blocks != NULL);
    m->kv_blocks_total = met_child_get(blocks, (const char *[]){mn, "total"});
    m->kv_blocks_used = met_child_get(blocks, (const char *[]){mn, "used"});
    m->kv_blocks_cached = met_child_get(blocks, (const char *[]){mn, "cached_free"});
    met_family *hblocks = met_gauge(r, "paged:host_kv_cache_blocks", "Host KV blocks by state (total, used by swapped requests or a step's copies, cached by the host tier and free to evict).", "model_name,state");
    PG_CHECK(hblocks != NULL);
    m->host_blocks_total = met_child_get(hblocks, (const char *[]){mn, "total"});
    m->host_blocks_used = met_child_get(hblocks, (const char *[]){mn, "used"});
    m->host_blocks_cached = met_child_get(hblocks, (const char *[]){mn, "cached_free"});
    m->host_mem = met_gauge(r, "paged:host_memory_bytes",
                            "Host memory by category: weights_mapped (the model file's bytes the weights "
                            "point into: CPU), weights_offloaded (layer weights kept in host memory by "
                            "--cpu-offload-gb), kv_cache (the KV pool when the device is the host: CPU), "
                            "swap (host KV blocks: swap space and host tier), pinned (the workspace's "
                            "pinned step images).",
                            "model_name,category");
    PG_CHECK(m->host_mem != NULL);
    m->block_size = one(met_gauge(r, "paged:kv_cache_block_size", "Tokens per KV block.", L), mn);
    m->mem = met_gauge(r, "paged:device_memory_bytes",
                       "Memory by category: weights, kv_cache, workspace; on a GPU also graphs, other "
                       "and free (they sum to paged:device_memory_total_bytes). device=\"cpu\": host "
                       "memory of the CPU backend.",
                       "model_name,device,category");
    PG_CHECK(m->mem != NULL);
    m->mem_total = met_gauge(r, "paged:device_memory_total_bytes", "Memory of the GPU the model runs on.",
                             "model_name,device");
    PG_CHECK(m->mem_total != NULL);
    m->connections = one(met_gauge(r, "paged:http_connections", "Open HTTP connections.", L), mn);
    m->jobs = one(met_gauge(r, "paged:http_requests_in_progress", "Generation requests being served (tokenizing or in the engine).", L), mn);

    m->prompt_tokens = one(met_counter(r, "paged:prompt_tokens_total", "Number of prefill tokens processed.", L), mn);
    m->generation_tokens = one(met_counter(r, "paged:generation_tokens_total", "Number of generation tokens processed.", L), mn);
    m->preemptions = one(met_counter(r, "paged:num_preemptions_total", "Cumulative number of preemptions from the engine.", L), mn);
    m->prefix_queries = one(met_counter(r, "paged:prefix_cache_queries_total", "Prefix cache queries, in tokens.", L), mn);
    m->prefix_hits = one(met_counter(r, "paged:prefix_cache_hits_total", "Prefix cache hits, in tokens (device and host tier).", L), mn);
    m->prefix_host_hits = one(met_counter(r, "paged:prefix_cache_host_hits_total", "Of the prefix cache hits, tokens loaded from the host tier.", L), mn);
    m->host_offloads = one(met_counter(r, "paged:kv_host_offloads_total", "Cached device KV blocks copied to the host tier (on eviction, or ahead of it).", L), mn);
    m->host_offloads_ahead = one(met_counter(r, "paged:kv_host_offloads_ahead_total", "Of the host tier's copies, those made a plan ahead of eviction (PAGED_KV_OFFLOAD_AHEAD=1).", L), mn);
    m->spec_drafts = one(met_counter(r, "paged:spec_decode_num_drafts_total", "Speculative decoding: drafts verified.", L), mn);
    m->spec_draft_tokens = one(met_counter(r, "paged:spec_decode_num_draft_tokens_total", "Speculative decoding: draft tokens verified.", L), mn);
    m->spec_accepted = one(met_counter(r, "paged:spec_decode_num_accepted_tokens_total", "Speculative decoding: draft tokens accepted.", L), mn);
    m->spec_accepted_pos = met_counter(r, "paged:spec_decode_num_accepted_tokens_per_pos_total", "Speculative decoding: draft tokens accepted, by position in the draft.", "model_name,position");
    PG_CHECK(m->spec_accepted_pos != NULL);
    m->success = met_counter(r, "paged:request_success_total", "Count of finished requests by finish reason.", "model_name,finished_reason");
    PG_CHECK(m->success != NULL);
    static const char *reasons[] = {"stop", "length", "abort", "error"};
    for (int i = 0; i < 4; i++) met_child_get(m->success, (const char *[]){mn, reasons[i]});
    m->http = met_counter(r, "paged:http_requests_total", "HTTP responses by handler and status (499: client closed first).", "handler,status");
    PG_CHECK(m->http != NULL);

    m->ttft = one(met_histogram(r, "paged:time_to_first_token_seconds", "Histogram of time to first token in seconds.", L, TTFT_BUCKETS, N(TTFT_BUCKETS)), mn);
    m->tpot = one(met_histogram(r, "paged:time_per_output_token_seconds", "Histogram of time per output token in seconds (per request).", L, TPOT_BUCKETS, N(TPOT_BUCKETS)), mn);
    m->itl = one(met_histogram(r, "paged:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", L, TPOT_BUCKETS, N(TPOT_BUCKETS)), mn);
    m->e2e = one(met_histogram(r, "paged:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", L, LATENCY_BUCKETS, N(LATENCY_BUCKETS)), mn);
    m->queue = one(met_histogram(r, "paged:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", L, LATENCY_BUCKETS, N(LATENCY_BUCKETS)), mn);
    m->prefill = one(met_histogram(r, "paged:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", L, LATENCY_BUCKETS, N(LATENCY_BUCKETS)), mn);
    m->decode = one(met_histogram(r, "paged:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", L, LATENCY_BUCKETS, N(LATENCY_BUCKETS)), mn);
    double lb[64];
    int nlb = buckets_125(lb, 64, max_model_len > 0 ? max_model_len : 1);
    m->prompt_len = one(met_histogram(r, "paged:request_prompt_tokens", "Number of prefill tokens processed.", L, lb, nlb), mn);
    m->gen_len = one(met_histogram(r, "paged:request_generation_tokens", "Number of generation tokens processed.", L, lb, nlb), mn);
    double fb[24];
    met_buckets_exp(fb, 24, 1e-6, 2.0);  // 1 us .. 8 s
    m->frontend = one(met_histogram(r, "paged:frontend_token_latency_seconds", "Per streamed token: time from the engine publishing it to its chunk being queued on the socket.", L, fb, 24), mn);
}

void srv_metrics_lora_enable(srv_metrics *m, int32_t max_loras) {
    m->lora_info = met_gauge(m->reg, "paged:lora_requests_info", "Running stats on lora requests.",
                             "max_lora,running_lora_adapters,waiting_lora_adapters");
    PG_CHECK(m->lora_info != NULL);
    snprintf(m->lora_max, sizeof m->lora_max, "%d", max_loras);
    m->lora_last[0][0] = m->lora_last[1][0] = 0;
    met_set(met_child_get(m->lora_info, (const char *[]){m->lora_max, "", ""}), 0);
}

void srv_metrics_lora(srv_metrics *m, const char *running, const char *waiting, double now) {
    if (!m->lora_info) return;
    if (m->lora_stamped && !strcmp(running, m->lora_last[0]) && !strcmp(waiting, m->lora_last[1])) return;
    m->lora_stamped = true;
    snprintf(m->lora_last[0], sizeof m->lora_last[0], "%s", running);
    snprintf(m->lora_last[1], sizeof m->lora_last[1], "%s", waiting);
    met_family_clear(m->lora_info);
    met_set(met_child_get(m->lora_info, (const char *[]){m->lora_max, running, waiting}), now);
}

void srv_metrics_free(srv_metrics *m) {
    met_registry_free(m->reg);
    memset(m, 0, sizeof *m);
}

void srv_metrics_refresh(srv_metrics *m, const pg_engine_stats *st, int n_connections, int n_jobs) {
    const sched_stats *s = &st->sched;
    met_set(m->running, s->n_running);
    met_set(m->waiting, s->n_waiting);
    met_set(m->swapped, s->n_swapped);
    met_set(m->kv_usage, s->kv.usage);
    met_set(m->gpu_usage, s->kv.usage);
    met_set(m->host_kv_usage, s->kv.host_usage);
    met_set(m->prefix_hit_rate,
            s->kv.prefix_queries > 0 ? (double)s->kv.prefix_hits / (double)s->kv.prefix_queries : 0);
    met_set(m->kv_blocks_total, s->kv.num_blocks);
    met_set(m->kv_blocks_used, s->kv.num_used);
    met_set(m->kv_blocks_cached, s->kv.num_cached_free);
    met_set(m->block_size, st->block_size);
    met_set(m->host_blocks_total, s->kv.num_host_blocks);
    met_set(m->host_blocks_used, s->kv.num_host_used);
    met_set(m->host_blocks_cached, s->kv.num_host_cached_free);
    static const char *hcats[] = {"weights_mapped", "weights_offloaded", "kv_cache", "swap", "pinned"};
    const double hmem[] = {(double)st->host_weights_mapped_bytes, (double)st->host_weights_offloaded_bytes,
                           (double)st->host_kv_bytes, (double)st->host_swap_bytes, (double)st->host_pinned_bytes};
    for (int i = 0; i < 5; i++) met_set(met_child_get(m->host_mem, (const char *[]){m->model_name, hcats[i]}), hmem[i]);
    // Memory: on the GPU every category of the card (they sum to its total);
    // on the CPU the host bytes the backend holds (weights as loaded, the
    // f32 KV pool, activation buffers), with no total, free or graphs.
    // Under tensor parallelism one device label per rank ("cuda:1"), each
    // with its own categories; one device keeps the plain "cuda" / "cpu".
    static const char *cats[] = {"weights", "kv_cache", "workspace", "graphs", "other", "free"};
    const int32_t n_ranks = st->n_ranks > 1 ? st->n_ranks : 1;
    for (int32_t r = 0; r < n_ranks && r < PG_ENGINE_MAX_RANKS; r++) {
        // One device: the flat fields (rank 0's) are the figures.
        const pg_engine_rank_mem one = {.weights = st->weight_bytes, .kv = st->kv_bytes,
                                        .workspace = st->workspace_bytes, .graphs = st->graph_bytes,
                                        .other = st->other_bytes, .total = st->gpu_total_bytes,
                                        .free = st->gpu_free_bytes};
        const pg_engine_rank_mem *rm = n_ranks > 1 ? &st->ranks[r] : &one;
        const double mem[] = {(double)rm->weights, (double)rm->kv, (double)rm->workspace,
                              (double)rm->graphs, (double)rm->other, (double)rm->free};
        char dev[24];
        if (n_ranks > 1) snprintf(dev, sizeof dev, "%s:%d", st->on_gpu ? "cuda" : "cpu", r);
        else snprintf(dev, sizeof dev, "%s", st->on_gpu ? "cuda" : "cpu");
        for (int i = 0; i < (st->on_gpu ? 6 : 3); i++)
            met_set(met_child_get(m->mem, (const char *[]){m->model_name, dev, cats[i]}), mem[i]);
        if (st->on_gpu)
            met_set(met_child_get(m->mem_total, (const char *[]){m->model_name, dev}), (double)rm->total);
    }
    met_set(m->connections, n_connections);
    met_set(m->jobs, n_jobs);
    // Counters mirrored from the engine's monotonic totals.
    met_set(m->preemptions, (double)(s->n_preempt_recompute + s->n_preempt_swap));
    met_set(m->prefix_queries, (double)s->kv.prefix_queries);
    met_set(m->prefix_hits, (double)s->kv.prefix_hits);
    met_set(m->prefix_host_hits, (double)s->kv.host_hits);
    met_set(m->host_offloads, (double)s->kv.offloads);
    met_set(m->host_offloads_ahead, (double)s->kv.offloads_ahead);
    met_set(m->spec_drafts, (double)s->n_spec_drafts);
    met_set(m->spec_draft_tokens, (double)s->n_spec_draft_tokens);
    met_set(m->spec_accepted, (double)s->n_spec_accepted);
    // Positions appear once a draft reached them (a draft of k has k).
    for (int32_t i = 0; i < PG_MAX_DRAFT && s->n_spec_accepted_pos[i] > 0; i++) {
        char pos[12];
        snprintf(pos, sizeof pos, "%d", i);
        met_set(met_child_get(m->spec_accepted_pos, (const char *[]){m->model_name, pos}),
                (double)s->n_spec_accepted_pos[i]);
    }
}

void srv_metrics_finished(srv_metrics *m, const char *reason) {
    met_inc(met_child_get(m->success, (const char *[]){m->model_name, reason}), 1);
}

void srv_metrics_http(srv_metrics *m, const char *handler, int status) {
    char s[8];
    snprintf(s, sizeof s, "%d", status);
    met_inc(met_child_get(m->http, (const char *[]){handler, s}), 1);
}

// The families vLLM has under the same name (v1, plus the v0 gauges
// gateways still read: gpu_cache_usage_perc, num_requests_swapped, ...).
// paged's own (kv_cache_blocks, device_memory_*, http_*, frontend_*) are
// left out: no vLLM client knows them.
static const char *const VLLM_NAMES[] = {
    "num_requests_running", "num_requests_waiting", "num_requests_swapped",
    "kv_cache_usage_perc", "gpu_cache_usage_perc", "cpu_cache_usage_perc", "gpu_prefix_cache_hit_rate",
    "prompt_tokens_total", "generation_tokens_total", "num_preemptions_total",
    "prefix_cache_queries_total", "prefix_cache_hits_total", "request_success_total",
    "time_to_first_token_seconds", "time_per_output_token_seconds", "inter_token_latency_seconds",
    "e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
    "request_decode_time_seconds", "request_prompt_tokens", "request_generation_tokens",
    "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos_total",
    "lora_requests_info",
    NULL,
};

void srv_metrics_render(const srv_metrics *m, bool vllm_names, sbuf *out) {
    met_render(m->reg, out);
    if (vllm_names) met_render_alias(m->reg, out, "paged:", "vllm:", VLLM_NAMES);
}
