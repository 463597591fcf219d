#!/usr/bin/env python3
"""deploy/grafana/paged.json against real data: a real Prometheus (Debian's
`prometheus`) scrapes a real `paged serve` every second while a little load
runs (completions, streamed chats sharing a system prompt so the prefix
cache hits, and some 400s and 404s); every PromQL expression of every panel,
with Grafana's variables filled in as the dashboard's defaults would
($model_name = All, $__rate_interval = 20s), must parse and return at
least one series, and the latency percentiles a number. The model variable's
label_values query is run through Prometheus's label API.

Grafana itself is not a Debian package, so it is not started here: the
dashboard's JSON is checked for what Grafana needs to import it (unique
panel ids, the datasource variable on every panel and target)."""
import json
import math
import os
import re
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
if not shutil.which("prometheus"):
    su.skip("prometheus is not installed (apt-get install prometheus)")

DASH = os.path.join(su.ROOT, "deploy", "grafana", "paged.json")
RATE = "20s"


def load(port, stop, counts):
    system = {"role": "system", "content": "You are a terse assistant. Answer in one short sentence. " * 4}
    i = 0
    while not stop.is_set():
        i += 1
        st, _ = su.post(port, "/v1/completions", {"prompt": f"Count to {i}:", "max_tokens": 4})
        counts[st] = counts.get(st, 0) + 1
        st, ev, _ = su.sse_stream(port, "/v1/chat/completions",
                                  {"messages": [system, {"role": "user", "content": f"Say {i}"}],
                                   "max_tokens": 6, "stream": True})
        counts[st] = counts.get(st, 0) + 1
        st, _ = su.post(port, "/v1/completions", {"prompt": "x", "max_tokens": -1})  # 400
        counts[st] = counts.get(st, 0) + 1
        st, _, _ = su.request(port, "GET", "/v1/nothing")  # 404
        counts[st] = counts.get(st, 0) + 1


def expressions(dash):
    out = []
    ids = set()
    for p in dash["panels"]:
        assert p["id"] not in ids, f"duplicate panel id {p['id']}"
        ids.add(p["id"])
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            out.append((p["title"], t["legendFormat"], t["expr"]))
    return out


def main():
    dash = json.load(open(DASH))
    exprs = expressions(dash)
    names = {v["name"] for v in dash["templating"]["list"]}
    assert names == {"datasource", "model_name"}, names
    for want in ("Request rate", "Token throughput", "Time to first token", "Time per output token",
                 "Inter-token latency", "Queue", "KV cache usage", "Preemptions", "Prefix-cache hit rate",
                 "Device memory", "HTTP errors"):
        assert any(t == want for t, _, _ in exprs), f"no panel {want}"
    with su.Server() as srv, su.Prometheus(f"127.0.0.1:{srv.port}") as prom:
        stop, counts = threading.Event(), {}
        th = threading.Thread(target=load, args=(srv.port, stop, counts), daemon=True)
        th.start()
        try:
            time.sleep(25)  # a full rate window of scrapes under load
            model = su.prom_get(prom.port, "/api/v1/label/model_name/values",
                                **{"match[]": "paged:num_requests_running"})["data"]
            assert model == [os.path.basename(su.MODEL)[:-5]], model
            print(f"ok   $model_name values from label_values: {model}")
            results = []
            for title, legend, expr in exprs:
                q = expr.replace("$__rate_interval", RATE).replace("$model_name", ".*")
                assert "$" not in q, q

                def answered():
                    r = prom.query(q)
                    assert r["status"] == "success", (q, r)
                    res = r["data"]["result"]
                    vals = [float(s["value"][1]) for s in res]
                    # Percentiles and ratios must be numbers (NaN = no data in the window).
                    return bool(res) and all(not math.isnan(v) for v in vals), (len(res), vals[:3])

                n, vals = su.wait_for(f"data for {title} / {legend}: {q}", answered, timeout=30)
                results.append((title, legend, n, vals))
        finally:
            stop.set()
            th.join(timeout=120)
        for title, legend, n, vals in results:
            print(f"ok   {title:24} {legend:22} {n} series, e.g. {vals[0]:.4g}")
        assert counts.get(200, 0) >= 4 and counts.get(400, 0) >= 1 and counts.get(404, 0) >= 1, counts
    print(f"test_grafana_dashboard: all {len(exprs)} expressions of {len(dash['panels'])} panels/rows return data "
          f"(load: {counts})")


if __name__ == "__main__":
    main()
