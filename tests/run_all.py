#!/usr/bin/env python3
"""Runs every test of paged and prints `N passed, N failed` last.

  unit:NAME      build/tests/test_* (cmocka), one entry per binary
  asan:NAME      the same under AddressSanitizer + UBSan (build/asan/tests)
  tsan:NAME      the few unit tests built under ThreadSanitizer too
                 (build/tsan/tests, TSAN_UNIT_TESTS in tools/gen_build.py)
  fuzz:NAME      each fuzz target replays its corpus and mutates for a few
                 seconds (build/fuzz/fuzz_*, ASan build)
  libfuzzer:NAME the same targets under clang's libFuzzer (coverage-guided,
                 build/fuzz/libfuzzer_*) for a few seconds each, new inputs
                 into a scratch directory (the seed corpus stays as it is)
  integ:NAME     tests/integration/test_*.py and test_*.sh: the real binary,
                 the real model, real sockets
  gpu:NAME       tests/gpu/run_gpu_tests.sh: every GPU check, or a SKIP line
                 saying why not (no GPU)

Usage: tests/run_all.py [-k SUBSTRING] [--fuzz-seconds N] [--no-asan] [--no-tsan]
Exits non-zero when any test fails. Run by deploy/quickstart.sh test.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(name, cmd, timeout, env=None):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, env=env)
        ok, out = p.returncode == 0, p.stdout.decode(errors="replace")
        # Exit code 77 is the conventional "skipped" (automake, meson).
        status = "skip" if p.returncode == 77 else ("pass" if ok else "fail")
    except subprocess.TimeoutExpired as e:
        status, out = "fail", (e.stdout or b"").decode(errors="replace") + f"\nTIMEOUT after {timeout}s"
    dt = time.time() - t0
    print(f"{status.upper():4} {name} ({dt:.1f}s)", flush=True)
    if status == "fail":
        print("\n".join("    | " + l for l in out.rstrip().splitlines()[-60:]), flush=True)
    elif status == "skip":
        last = out.strip().splitlines()[-1] if out.strip() else ""
        print(f"    | {last}", flush=True)
    return status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="", help="only tests whose name contains this")
    ap.add_argument("--fuzz-seconds", type=int, default=int(os.environ.get("PAGED_FUZZ_SECONDS", "10")))
    ap.add_argument("--no-asan", action="store_true")
    ap.add_argument("--no-tsan", action="store_true")
    args = ap.parse_args()

    tests = [("build:ninja-fresh", [sys.executable, "tools/gen_build.py", "--check"], 60),
             ("build:layering", [sys.executable, "tools/gen_build.py", "--check-layering"], 60)]
    # No circle of calls between the files of the engine, nor of text/
    # (tools/file_calls.py reads the built objects).
    obj = "build/rel/obj/"
    tests.append(("build:file-circles-engine", [sys.executable, "tools/file_calls.py"] +
                  [obj + d for d in ("engine", "engine/model", "engine/runner", "engine/dist", "engine/spec")], 60))
    tests.append(("build:file-circles-text", [sys.executable, "tools/file_calls.py"] +
                  [obj + d for d in ("text/tokenizer", "text/template", "text/grammar")], 60))
    for t in sorted(glob.glob(os.path.join(ROOT, "tests/tools/test_*.py"))):
        tests.append((f"tools:{os.path.basename(t)}", [sys.executable, t], 120))
    for b in sorted(glob.glob(os.path.join(ROOT, "build/tests/test_*"))):
        if not b.endswith(".d"):
            tests.append((f"unit:{os.path.basename(b)}", [b], 600))
    if not args.no_asan:
        for b in sorted(glob.glob(os.path.join(ROOT, "build/asan/tests/test_*"))):
            if not b.endswith(".d"):
                tests.append((f"asan:{os.path.basename(b)}", [b], 900))
    if not args.no_tsan:
        for b in sorted(glob.glob(os.path.join(ROOT, "build/tsan/tests/test_*"))):
            if not b.endswith(".d"):
                tests.append((f"tsan:{os.path.basename(b)}", [b], 300))
    for b in sorted(glob.glob(os.path.join(ROOT, "build/fuzz/fuzz_*"))):
        name = os.path.basename(b)
        corpus = os.path.join(ROOT, "tests/fuzz/corpus", name[len("fuzz_"):])
        cmd = [b, "-t", str(args.fuzz_seconds)] + ([corpus] if os.path.isdir(corpus) else [])
        tests.append((f"fuzz:{name}", cmd, args.fuzz_seconds + 120))
    scratch = tempfile.mkdtemp(prefix="paged-libfuzzer-")
    for b in sorted(glob.glob(os.path.join(ROOT, "build/fuzz/libfuzzer_*"))):
        name = os.path.basename(b)[len("libfuzzer_"):]
        corpus = os.path.join(ROOT, "tests/fuzz/corpus", name)
        new = os.path.join(scratch, name)
        os.makedirs(new, exist_ok=True)
        cmd = [b, f"-max_total_time={args.fuzz_seconds}", "-rss_limit_mb=4096", "-print_final_stats=1",
               f"-artifact_prefix={scratch}/crash-{name}-", new] + ([corpus] if os.path.isdir(corpus) else [])
        tests.append((f"libfuzzer:{name}", cmd, args.fuzz_seconds + 120))
    for t in sorted(glob.glob(os.path.join(ROOT, "tests/integration/test_*"))):
        if t.endswith(".py"):
            tests.append((f"integ:{os.path.basename(t)}", [sys.executable, t], 1800))
        elif t.endswith(".sh"):
            tests.append((f"integ:{os.path.basename(t)}", ["bash", t], 1800))

    # The GPU checks: on a machine without a GPU the script prints why and
    # exits 77, listed as SKIP (CI compiles the CUDA code but has no GPU).
    tests.append(("gpu:run_gpu_tests.sh", ["bash", "tests/gpu/run_gpu_tests.sh"], 3600))

    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    # A race report fails the test (exit code 66) even when the test passes.
    env.setdefault("TSAN_OPTIONS", "halt_on_error=0 exitcode=66 second_deadlock_stack=1")
    counts = {"pass": 0, "fail": 0, "skip": 0}
    failed = []
    for name, cmd, timeout in tests:
        if args.k not in name:
            continue
        s = run(name, cmd, timeout, env)
        counts[s] += 1
        if s == "fail":
            failed.append(name)
    shutil.rmtree(scratch, ignore_errors=True)
    if failed:
        print("failed: " + " ".join(failed))
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
