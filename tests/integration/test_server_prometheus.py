#!/usr/bin/env python3
"""A real Prometheus (Debian package `prometheus`) scrapes `paged serve`'s
/metrics every second, with the API key as a bearer token: its own API shows
the target up with no scrape error, and the paged: series (gauges, counters,
histograms) queryable with PromQL."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
PROMETHEUS = shutil.which("prometheus")
if not PROMETHEUS:
    su.skip("prometheus is not installed (apt-get install prometheus)")

KEY = "scrape-key"


prom_get = su.prom_get
wait_for = su.wait_for


def main():
    tmp = tempfile.mkdtemp(prefix="paged-prom-")
    prom = None
    try:
        with su.Server("--api-key", KEY) as srv:
            # Some traffic so the counters and histograms have samples.
            auth = {"Authorization": f"Bearer {KEY}"}
            for i in range(3):
                st, r = su.post(srv.port, "/v1/completions", {"prompt": f"Hello {i}", "max_tokens": 3}, auth)
                assert st == 200, r
            prom_port = su.free_port()
            cfg = os.path.join(tmp, "prometheus.yml")
            with open(cfg, "w") as f:
                f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: paged
    metrics_path: /metrics
    authorization:
      credentials: {KEY}
    static_configs:
      - targets: ["127.0.0.1:{srv.port}"]
""")
            log = open(os.path.join(tmp, "prometheus.log"), "w")
            prom = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
                                     f"--web.listen-address=127.0.0.1:{prom_port}"],
                                    stdout=log, stderr=subprocess.STDOUT)

            def target_up():
                t = prom_get(prom_port, "/api/v1/targets")["data"]["activeTargets"]
                return bool(t) and t[0]["health"] == "up", t

            targets = wait_for("the paged target to be up", target_up)
            assert targets[0]["lastError"] == "", targets
            assert targets[0]["labels"]["job"] == "paged"
            print(f"ok   target up: {targets[0]['scrapeUrl']}")

            wanted = [
                "paged:num_requests_running", "paged:num_requests_waiting", "paged:num_requests_swapped",
                "paged:gpu_cache_usage_perc", "paged:cpu_cache_usage_perc", "paged:gpu_prefix_cache_hit_rate",
                "paged:device_memory_bytes", "paged:kv_cache_blocks",
                "paged:prompt_tokens_total", "paged:generation_tokens_total", "paged:num_preemptions_total",
                "paged:request_success_total", "paged:http_requests_total",
                "paged:time_to_first_token_seconds_bucket", "paged:time_per_output_token_seconds_count",
                "paged:inter_token_latency_seconds_bucket", "paged:e2e_request_latency_seconds_sum",
                "paged:request_queue_time_seconds_count", "paged:request_prompt_tokens_bucket",
                "paged:request_generation_tokens_bucket",
            ]

            def all_present():
                missing = [w for w in wanted if not prom_get(prom_port, "/api/v1/query", query=w)["data"]["result"]]
                return not missing, missing

            wait_for("paged: series in Prometheus", all_present)
            print(f"ok   {len(wanted)} paged: series queryable")
            r = prom_get(prom_port, "/api/v1/query", query='sum(paged:request_success_total{finished_reason="length"})')
            assert float(r["data"]["result"][0]["value"][1]) >= 3, r
            r = prom_get(prom_port, "/api/v1/query",
                         query="histogram_quantile(0.5, sum by (le) (paged:time_to_first_token_seconds_bucket))")
            assert r["status"] == "success" and r["data"]["result"], r
            # Scrapes count themselves from the next scrape on.
            def scrapes_counted():
                r = prom_get(prom_port, "/api/v1/query", query='paged:http_requests_total{handler="/metrics",status="200"}')
                res = r["data"]["result"]
                return bool(res) and float(res[0]["value"][1]) >= 1, r
            wait_for("scrapes in paged:http_requests_total", scrapes_counted)
            meta = prom_get(prom_port, "/api/v1/metadata", metric="paged:time_to_first_token_seconds")
            assert meta["data"]["paged:time_to_first_token_seconds"][0]["type"] == "histogram", meta
            print("ok   PromQL over counters and histograms")
    finally:
        if prom:
            prom.terminate()
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_server_prometheus: all passed")


if __name__ == "__main__":
    main()
