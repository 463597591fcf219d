// server/serve_metrics.h - the metrics `paged serve` exposes on /metrics.
//
// vLLM's names under a `paged:` prefix (vllm:num_requests_running ->
// paged:num_requests_running), with the same model_name label, so existing
// dashboards port by a prefix change. Gauges are refreshed from the
// engine's statistics at each scrape; counters and histograms are updated
// as requests finish. Full list: docs/server.md.
#pragma once
#include <stdbool.h>

#include "engine/engine.h"
#include "server/metrics.h"

typedef struct srv_metrics {
    met_registry *reg;
    // gauges
    met_child *running, *waiting, *swapped, *kv_usage, *gpu_usage, *host_kv_usage, *prefix_hit_rate;
    met_child *kv_blocks_total, *kv_blocks_used, *kv_blocks_cached, *block_size;
    met_family *mem;           // {model_name, device, category}: children made at the first refresh
    met_family *mem_total;     // {model_name, device}: the GPU's memory (no child on the CPU)
    met_family *host_mem;      // {model_name, category}: host memory by category
    met_child *host_blocks_total, *host_blocks_used, *host_blocks_cached;
    met_child *connections, *jobs;
    // counters
    met_child *prompt_tokens, *generation_tokens, *preemptions, *prefix_queries, *prefix_hits;
    met_child *prefix_host_hits, *host_offloads, *host_offloads_ahead;
    // Speculative decoding (vLLM's spec_decode counters); per position a
    // child per draft position, labelled 0 .. PG_MAX_DRAFT - 1.
    met_child *spec_drafts, *spec_draft_tokens, *spec_accepted;
    met_family *spec_accepted_pos;
    met_family *success;       // {model_name, finished_reason}
    met_family *http;          // {handler, status}
    // histograms
    met_child *ttft, *tpot, *itl, *e2e, *queue, *prefill, *decode, *prompt_len, *gen_len;
    met_child *frontend;       // engine publish -> chunk queued on the socket, per token
    // vLLM's lora_requests_info (made by srv_metrics_lora_enable): one
    // series whose labels name the adapters of running and waiting
    // requests, its value the time of the last change (vLLM's
    // set_to_current_time); lora_last holds those labels.
    met_family *lora_info;
    char lora_max[16], lora_last[2][1024];
    bool lora_stamped;
    const char *model_name;
} srv_metrics;

void srv_metrics_init(srv_metrics *m, const char *model_name, int32_t max_model_len);
void srv_metrics_free(srv_metrics *m);

// Refreshes the gauges and engine-side counters before a scrape.
void srv_metrics_refresh(srv_metrics *m, const pg_engine_stats *st, int n_connections, int n_jobs);

// Adds vLLM's LoRA family (when serving with --enable-lora).
void srv_metrics_lora_enable(srv_metrics *m, int32_t max_loras);
// Sets it from the adapter names of running and waiting requests
// (comma-separated, pg_engine_lora_names), at `now` (Unix seconds) when
// they changed.
void srv_metrics_lora(srv_metrics *m, const char *running, const char *waiting, double now);

// The exposition text of every family; with `vllm_names` (--metrics-compat
// vllm) the families vLLM also has are repeated under `vllm:` names, so
// autoscalers and gateways written for vLLM read paged unchanged.
void srv_metrics_render(const srv_metrics *m, bool vllm_names, sbuf *out);

// One request finished with `reason` ("stop", "length", "abort", "error").
void srv_metrics_finished(srv_metrics *m, const char *reason);
// One HTTP response (or 499: client gone before a response).
void srv_metrics_http(srv_metrics *m, const char *handler, int status);
