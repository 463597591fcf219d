#!/usr/bin/env python3
"""Plots from bench_serve.py result JSONs (PNG).

  bench/plot_serve.py bench/results/w4_*.json --out-dir bench/results/plots

Draws, for what the files hold:
  throughput_vs_concurrency.png  closed-loop runs: output tok/s and TPOT p50
                                 against the number of clients, one line per engine
  latency_vs_rate.png            open-loop runs at finite rates: TTFT p50/p99,
                                 TPOT p50 and goodput against the request rate
  latency_cdf.png                TTFT, TPOT, ITL and end-to-end latency CDFs,
                                 one line per file

The engine of a result is its --label (else its --backend). Needs matplotlib;
without it, prints a message and exits 0.
"""
import argparse
import glob
import json
import os
import sys


def tput(r):
    """Output tok/s; where requests were cancelled at the window's end, what
    they streamed counts too (bench_serve's window_output_throughput)."""
    if r.get("cancelled") and r.get("window_output_throughput") is not None:
        return r["window_output_throughput"]
    return r["output_throughput"]


def load(paths):
    out = []
    for pat in paths:
        files = sorted(glob.glob(pat)) or [pat]
        for f in files:
            try:
                with open(f) as fh:
                    r = json.load(fh)
            except (OSError, ValueError) as e:
                print(f"plot_serve: skipping {f}: {e}", file=sys.stderr)
                continue
            if r.get("tool") != "bench_serve.py":
                print(f"plot_serve: skipping {f}: not a bench_serve.py result", file=sys.stderr)
                continue
            r["_file"] = os.path.basename(f)
            out.append(r)
    return out


def engine(r):
    return r.get("label") or r.get("backend") or "?"


def short(r):
    c = r["config"]
    il, ol = c["input_len"], c["output_len"]
    lens = (f"{il[0]}" if il[0] == il[1] else f"{il[0]}-{il[1]}") + "/" + \
           (f"{ol[0]}" if ol[0] == ol[1] else f"{ol[0]}-{ol[1]}")
    load = f"c={c['concurrency']}" if c["mode"] == "closed-loop" else f"rate={c['request_rate']}"
    return f"{engine(r)} {lens} {load}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="result JSON files or globs")
    ap.add_argument("--out-dir", default="bench/results/plots")
    ap.add_argument("--prefix", default="", help="prefix of the PNG file names")
    ap.add_argument("--title", default="")
    ap.add_argument("--log-latency", action="store_true", help="log scale on the CDFs' latency axis")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401
    except ImportError:
        print("plot_serve: matplotlib is not installed; no plots drawn (pip install matplotlib)")
        return 0
    res = load(args.results)
    if not res:
        print("plot_serve: no results to plot")
        return 1
    os.makedirs(args.out_dir, exist_ok=True)
    written = []
    title = (args.title + ": ") if args.title else ""

    closed = [r for r in res if r["config"]["mode"] == "closed-loop" and r["completed"]]
    if closed:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for eng in sorted({engine(r) for r in closed}):
            pts = sorted((r["config"]["concurrency"], r) for r in closed if engine(r) == eng)
            xs = [p[0] for p in pts]
            ax1.plot(xs, [tput(p[1]) for p in pts], "o-", label=f"{eng} output")
            ax1.plot(xs, [p[1]["total_token_throughput"] for p in pts], "o--", alpha=0.5, label=f"{eng} total")
            ax2.plot(xs, [p[1]["tpot_ms"]["p50"] for p in pts], "o-", label=f"{eng} p50")
            ax2.plot(xs, [p[1]["tpot_ms"]["p99"] for p in pts], "o--", alpha=0.5, label=f"{eng} p99")
        ax1.set(xlabel="concurrent clients", ylabel="tokens/s", title=title + "throughput vs concurrency")
        ax2.set(xlabel="concurrent clients", ylabel="ms", title="TPOT")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            cs = sorted({r["config"]["concurrency"] for r in closed})
            if len(cs) > 2 and cs[-1] / cs[0] > 8:
                ax.set_xscale("log")
            ax.set_xticks(cs)
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        fig.tight_layout()
        p = os.path.join(args.out_dir, args.prefix + "throughput_vs_concurrency.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)

    rated = [r for r in res if r["config"]["mode"] == "open-loop" and r["config"]["request_rate"] != "inf"
             and r["completed"]]
    if rated:
        fig, axs = plt.subplots(1, 3, figsize=(14, 4.2))
        for eng in sorted({engine(r) for r in rated}):
            pts = sorted((float(r["config"]["request_rate"]), r) for r in rated if engine(r) == eng)
            xs = [p[0] for p in pts]
            axs[0].plot(xs, [p[1]["ttft_ms"]["p50"] for p in pts], "o-", label=f"{eng} p50")
            axs[0].plot(xs, [p[1]["ttft_ms"]["p99"] for p in pts], "o--", alpha=0.5, label=f"{eng} p99")
            axs[1].plot(xs, [p[1]["tpot_ms"]["p50"] for p in pts], "o-", label=f"{eng} p50")
            axs[2].plot(xs, [100 * p[1]["goodput"]["fraction"] for p in pts], "o-", label=eng)
        axs[0].set(xlabel="request rate (req/s)", ylabel="ms", title=title + "TTFT")
        axs[1].set(xlabel="request rate (req/s)", ylabel="ms", title="TPOT")
        axs[2].set(xlabel="request rate (req/s)", ylabel="% of requests", title="goodput", ylim=(0, 105))
        for ax in axs:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        p = os.path.join(args.out_dir, args.prefix + "latency_vs_rate.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)

    fig, axs = plt.subplots(2, 2, figsize=(11, 8))
    any_cdf = False
    for ax, key, name in zip(axs.flat, ("ttft", "tpot", "itl", "e2el"),
                             ("TTFT", "TPOT", "inter-token latency", "end-to-end latency")):
        for r in res:
            q = r.get("cdf_ms", {}).get(key) or []
            if q:
                ax.plot(q, [k / 100 for k in range(len(q))], label=short(r))
                any_cdf = True
        if args.log_latency:
            ax.set_xscale("log")
        ax.set(xlabel="ms", ylabel="fraction of " + ("tokens" if key == "itl" else "requests"),
               title=(title if key == "ttft" else "") + name + " CDF", ylim=(0, 1.01))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    if any_cdf:
        p = os.path.join(args.out_dir, args.prefix + "latency_cdf.png")
        fig.savefig(p, dpi=110)
        written.append(p)
    plt.close(fig)
    for p in written:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
