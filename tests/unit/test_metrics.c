// tests/unit/test_metrics.c - the Prometheus registry renders the text
// format exactly (labels, escaping, cumulative buckets), rejects bad names,
// and the serve metrics carry vLLM's names under `paged:`.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/metrics.h"
#include "server/serve_metrics.h"

static char *render(met_registry *r) {
    sbuf b = {0};
    met_render(r, &b);
    return sbuf_steal(&b, NULL);
}

static void test_counter_and_gauge_text(void **state) {
    met_registry *r = met_registry_create();
    met_family *c = met_counter(r, "paged:prompt_tokens_total", "Prompt tokens.", NULL);
    met_family *g = met_gauge(r, "paged:num_requests_running", "Running.", "model_name");
    assert_non_null(c);
    assert_non_null(g);
    met_inc0(c, 5);
    met_inc0(c, 2);
    met_set(met_child1(g, "m"), 3);
    met_set(met_child1(g, "m"), 1.5);
    char *t = render(r);
    assert_string_equal(t,
                        "# HELP paged:prompt_tokens_total Prompt tokens.\n"
                        "# TYPE paged:prompt_tokens_total counter\n"
                        "paged:prompt_tokens_total 7\n"
                        "# HELP paged:num_requests_running Running.\n"
                        "# TYPE paged:num_requests_running gauge\n"
                        "paged:num_requests_running{model_name=\"m\"} 1.5\n");
    free(t);
    met_registry_free(r);
}

static void test_labels_escaped_and_children_distinct(void **state) {
    met_registry *r = met_registry_create();
    met_family *f = met_counter(r, "x_total", "help with \\ and\nnewline", "handler,status");
    met_inc(met_child_get(f, (const char *[]){"/a", "200"}), 1);
    met_inc(met_child_get(f, (const char *[]){"/a", "404"}), 1);
    met_inc(met_child_get(f, (const char *[]){"/a", "200"}), 1);
    met_inc(met_child_get(f, (const char *[]){"q\"b\\s\nn", "500"}), 1);
    char *t = render(r);
    assert_non_null(strstr(t, "# HELP x_total help with \\\\ and\\nnewline\n"));
    assert_non_null(strstr(t, "x_total{handler=\"/a\",status=\"200\"} 2\n"));
    assert_non_null(strstr(t, "x_total{handler=\"/a\",status=\"404\"} 1\n"));
    assert_non_null(strstr(t, "x_total{handler=\"q\\\"b\\\\s\\nn\",status=\"500\"} 1\n"));
    assert_true(met_value(met_child_get(f, (const char *[]){"/a", "200"})) == 2);
    free(t);
    met_registry_free(r);
}

static void test_histogram_cumulative_buckets(void **state) {
    met_registry *r = met_registry_create();
    const double b[] = {0.1, 1, 10};
    met_family *h = met_histogram(r, "lat_seconds", "Latency.", NULL, b, 3);
    assert_non_null(h);
    met_observe0(h, 0.0625);
    met_observe0(h, 0.1);  // le is inclusive
    met_observe0(h, 5);
    met_observe0(h, 100);
    char *t = render(r);
    assert_string_equal(t,
                        "# HELP lat_seconds Latency.\n"
                        "# TYPE lat_seconds histogram\n"
                        "lat_seconds_bucket{le=\"0.1\"} 2\n"
                        "lat_seconds_bucket{le=\"1\"} 2\n"
                        "lat_seconds_bucket{le=\"10\"} 3\n"
                        "lat_seconds_bucket{le=\"+Inf\"} 4\n"
                        "lat_seconds_sum 105.1625\n"
                        "lat_seconds_count 4\n");
    assert_true(met_value(met_child_get(h, NULL)) == 4);
    free(t);
    met_registry_free(r);
}

static void test_histogram_with_labels_puts_le_last(void **state) {
    met_registry *r = met_registry_create();
    const double b[] = {1};
    met_family *h = met_histogram(r, "h", "", "model_name", b, 1);
    met_observe(met_child1(h, "m"), 0.5);
    char *t = render(r);
    assert_non_null(strstr(t, "h_bucket{model_name=\"m\",le=\"1\"} 1\n"));
    assert_non_null(strstr(t, "h_bucket{model_name=\"m\",le=\"+Inf\"} 1\n"));
    assert_non_null(strstr(t, "h_sum{model_name=\"m\"} 0.5\n"));
    free(t);
    met_registry_free(r);
}

static void test_bad_definitions_rejected(void **state) {
    met_registry *r = met_registry_create();
    assert_null(met_counter(r, "1abc", "", NULL));
    assert_null(met_counter(r, "a-b", "", NULL));
    assert_null(met_gauge(r, "ok", "", "bad:label"));
    const double unsorted[] = {2, 1};
    assert_null(met_histogram(r, "h", "", NULL, unsorted, 2));
    const double one[] = {1};
    assert_null(met_histogram(r, "h", "", "le", one, 1));
    char *t = render(r);
    assert_string_equal(t, "");
    free(t);
    met_registry_free(r);
}

// The families dashboards built for vLLM look for, under `paged:`.
static void test_serve_metrics_use_vllm_names(void **state) {
    srv_metrics m;
    srv_metrics_init(&m, "tiny", 8192);
    pg_engine_stats st;
    memset(&st, 0, sizeof st);
    st.sched.n_running = 2;
    st.sched.n_waiting = 3;
    st.sched.kv.usage = 0.25;
    st.sched.kv.num_blocks = 100;
    st.sched.kv.num_used = 25;
    st.sched.kv.prefix_queries = 10;
    st.sched.kv.prefix_hits = 4;
    st.sched.n_preempt_recompute = 1;
    st.sched.n_preempt_swap = 2;
    st.block_size = 16;
    st.weight_bytes = 1000;
    srv_metrics_refresh(&m, &st, 5, 1);
    srv_metrics_finished(&m, "stop");
    srv_metrics_http(&m, "/health", 200);
    met_observe(m.ttft, 0.2);
    sbuf b = {0};
    met_render(m.reg, &b);
    const char *t = sbuf_str(&b);
    const char *want[] = {
        "paged:num_requests_running{model_name=\"tiny\"} 2\n",
        "paged:num_requests_waiting{model_name=\"tiny\"} 3\n",
        "paged:num_requests_swapped{model_name=\"tiny\"} 0\n",
        "paged:gpu_cache_usage_perc{model_name=\"tiny\"} 0.25\n",
        "paged:kv_cache_usage_perc{model_name=\"tiny\"} 0.25\n",
        "paged:cpu_cache_usage_perc{model_name=\"tiny\"} 0\n",
        "paged:gpu_prefix_cache_hit_rate{model_name=\"tiny\"} 0.4\n",
        "paged:kv_cache_blocks{model_name=\"tiny\",state=\"used\"} 25\n",
        "paged:device_memory_bytes{model_name=\"tiny\",device=\"cpu\",category=\"weights\"} 1000\n",
        "paged:device_memory_bytes{model_name=\"tiny\",device=\"cpu\",category=\"kv_cache\"} 0\n",
        "paged:device_memory_bytes{model_name=\"tiny\",device=\"cpu\",category=\"workspace\"} 0\n",
        "# TYPE paged:device_memory_total_bytes gauge\n",
        "paged:num_preemptions_total{model_name=\"tiny\"} 3\n",
        "# TYPE paged:prompt_tokens_total counter\n",
        "# TYPE paged:generation_tokens_total counter\n",
        "paged:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 1\n",
        "paged:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 0\n",
        "paged:http_requests_total{handler=\"/health\",status=\"200\"} 1\n",
        "paged:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.25\"} 1\n",
        "# TYPE paged:time_per_output_token_seconds histogram\n",
        "# TYPE paged:inter_token_latency_seconds histogram\n",
        "# TYPE paged:e2e_request_latency_seconds histogram\n",
        "# TYPE paged:request_queue_time_seconds histogram\n",
        "# TYPE paged:request_prompt_tokens histogram\n",
        "# TYPE paged:request_generation_tokens histogram\n",
        "paged:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"5000\"} 0\n",
        "# TYPE paged:prefix_cache_hits_total counter\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(t, want[i])) fail_msg("missing: %s", want[i]);
    // 1-2-5 length buckets stop at the model length.
    assert_null(strstr(t, "paged:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"10000\"}"));
    // The CPU has no graphs, and free/other/total of the host are not ours to report.
    assert_null(strstr(t, "category=\"graphs\""));
    assert_null(strstr(t, "category=\"free\""));
    assert_null(strstr(t, "paged:device_memory_total_bytes{"));
    sbuf_free(&b);
    srv_metrics_free(&m);
}

static void test_serve_metrics_gpu_memory_categories(void **state) {
    (void)state;
    srv_metrics m;
    srv_metrics_init(&m, "big", 4096);
    pg_engine_stats st;
    memset(&st, 0, sizeof st);
    st.on_gpu = true;
    st.weight_bytes = 100, st.kv_bytes = 600, st.workspace_bytes = 50;
    st.graph_bytes = 20, st.other_bytes = 30, st.gpu_free_bytes = 200, st.gpu_total_bytes = 1000;
    srv_metrics_refresh(&m, &st, 0, 0);
    sbuf b = {0};
    met_render(m.reg, &b);
    const char *t = sbuf_str(&b);
    const char *want[] = {
        "paged:device_memory_bytes{model_name=\"big\",device=\"cuda\",category=\"weights\"} 100\n",
        "paged:device_memory_bytes{model_name=\"big\",device=\"cuda\",category=\"kv_cache\"} 600\n",
        "paged:device_memory_bytes{model_name=\"big\",device=\"cuda\",category=\"workspace\"} 50\n",
        "paged:device_memory_bytes{model_name=\"big\",device=\"cuda\",category=\"graphs\"} 20\n",
        "paged:device_memory_bytes{model_name=\"big\",device=\"cuda\",category=\"other\"} 30\n",
        "paged:device_memory_bytes{model_name=\"big\",device=\"cuda\",category=\"free\"} 200\n",
        "paged:device_memory_total_bytes{model_name=\"big\",device=\"cuda\"} 1000\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(t, want[i])) fail_msg("missing: %s", want[i]);
    // A second scrape updates the same children.
    st.gpu_free_bytes = 190, st.graph_bytes = 30;
    srv_metrics_refresh(&m, &st, 0, 0);
    sbuf_free(&b);
    b = (sbuf){0};
    met_render(m.reg, &b);
    t = sbuf_str(&b);
    assert_non_null(strstr(t, "category=\"free\"} 190\n"));
    assert_null(strstr(t, "category=\"free\"} 200\n"));
    sbuf_free(&b);
    srv_metrics_free(&m);
}

// --metrics-compat vllm: the listed families again under vllm:, same
// values; paged-only families and unlisted ones are not repeated.
static void test_alias_renders_listed_families_under_new_prefix(void **state) {
    met_registry *r = met_registry_create();
    met_family *run = met_gauge(r, "paged:num_requests_running", "Running.", "model_name");
    met_family *own = met_gauge(r, "paged:http_connections", "Open.", NULL);
    double b[] = {0.5};
    met_family *h = met_histogram(r, "paged:time_to_first_token_seconds", "TTFT.", NULL, b, 1);
    met_set(met_child1(run, "m"), 2);
    met_set0(own, 7);
    met_observe0(h, 0.25);
    static const char *const names[] = {"num_requests_running", "time_to_first_token_seconds", NULL};
    sbuf o = {0};
    met_render_alias(r, &o, "paged:", "vllm:", names);
    assert_string_equal(sbuf_str(&o),
                        "# HELP vllm:num_requests_running Running.\n"
                        "# TYPE vllm:num_requests_running gauge\n"
                        "vllm:num_requests_running{model_name=\"m\"} 2\n"
                        "# HELP vllm:time_to_first_token_seconds TTFT.\n"
                        "# TYPE vllm:time_to_first_token_seconds histogram\n"
                        "vllm:time_to_first_token_seconds_bucket{le=\"0.5\"} 1\n"
                        "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n"
                        "vllm:time_to_first_token_seconds_sum 0.25\n"
                        "vllm:time_to_first_token_seconds_count 1\n");
    sbuf_free(&o);
    met_registry_free(r);
}

static void test_serve_metrics_vllm_compat(void **state) {
    srv_metrics m;
    srv_metrics_init(&m, "mdl", 2048);
    sbuf plain = {0}, compat = {0};
    srv_metrics_render(&m, false, &plain);
    srv_metrics_render(&m, true, &compat);
    assert_null(strstr(sbuf_str(&plain), "vllm:"));
    assert_memory_equal(compat.p, plain.p, plain.len);  // paged: first, unchanged
    const char *extra = compat.p + plain.len;
    static const char *const want[] = {"vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
                                       "vllm:gpu_cache_usage_perc{", "vllm:prompt_tokens_total{",
                                       "vllm:time_to_first_token_seconds_bucket{",
                                       "vllm:request_success_total{model_name=\"mdl\",finished_reason=\"stop\"}"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!strstr(extra, want[i])) fail_msg("missing %s", want[i]);
    }
    assert_null(strstr(extra, "vllm:http_"));
    assert_null(strstr(extra, "vllm:device_memory"));
    assert_null(strstr(extra, "vllm:kv_cache_blocks"));
    sbuf_free(&plain);
    sbuf_free(&compat);
    srv_metrics_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_and_gauge_text),
        cmocka_unit_test(test_labels_escaped_and_children_distinct),
        cmocka_unit_test(test_histogram_cumulative_buckets),
        cmocka_unit_test(test_histogram_with_labels_puts_le_last),
        cmocka_unit_test(test_bad_definitions_rejected),
        cmocka_unit_test(test_serve_metrics_use_vllm_names),
        cmocka_unit_test(test_serve_metrics_gpu_memory_categories),
        cmocka_unit_test(test_alias_renders_listed_families_under_new_prefix),
        cmocka_unit_test(test_serve_metrics_vllm_compat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
