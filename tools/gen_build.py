#!/usr/bin/env python3
"""Writes build.ninja from the source tree.

Run after adding or removing a source file: `python3 tools/gen_build.py`.
`--check` exits non-zero when build.ninja is stale (the test runner calls it).

Conventions the generator relies on (docs/build.md):
  every library directory of MODULES (common/ ... server/) *.c -> build/libpaged.a
      (server/main.c is the CLI entry and is linked only into build/paged;
      kernels/cuda/cuda_stub.c and kernels/comm/comm_nccl_stub.c are the CUDA
      backend and NCCL entry points of a build without CUDA)
  kernels/cuda/*.cu, kernels/comm/*.cu -> compiled by tools/nvcc_or_stub.sh: real CUDA objects
      where nvcc exists, an empty object elsewhere (the CPU build still links)
  tests/unit/test_*.c -> build/tests/test_* (cmocka), and the same under
      AddressSanitizer + UBSan as build/asan/tests/test_* (`ninja asan`)
  server/main.c -> build/paged, and build/asan/paged (ASan + UBSan, `ninja asan`),
      and build/tsan/paged (ThreadSanitizer, `ninja tsan`)
  TSAN_UNIT_TESTS (tests/unit/test_comm*.c) -> also build/tsan/tests/test_*
      under ThreadSanitizer (`ninja tsan`; tests/run_all.py runs them as tsan:*)
  tests/fuzz/fuzz_*.c -> build/fuzz/fuzz_* (standalone replay + mutation
      driver, gcc) and build/fuzz/libfuzzer_* (clang -fsanitize=fuzzer,
      `ninja fuzz-libfuzzer`)
  bench/*.c -> build/bench/*
  tests/tools/*.c -> build/tests/tools/* (programs the integration tests drive)
  EMBEDS (server/webui/index.html, server/openapi.json) -> build/gen/*.c
      by tools/embed.py (a C array and its length), compiled into libpaged.a
  build/paged links build/rel/libpaged_cuda.a whole and before libpaged.a,
      so real CUDA objects (where nvcc built them) win over the stubs; every
      other program gets the stubs ("built without CUDA")
  tests/gpu/test_*.c -> build/gpu/test_* (C programs over libpaged and the
      CUDA archive, linked like build/paged; tests/gpu/run_gpu_tests.sh)
  tests/gpu/test_*.cu, bench/bench_cuda_*.cu, bench/cuda/bench_fi_*.cu
      -> build/gpu/* (standalone GPU
      programs: nvcc links them with the CUDA archive, common/err.o and, for
      tests, kernels/cpu/sampling.o and kernels/dtype.o, and only libcublasLt dynamically; without nvcc
      they are stubs that print "skipped" and exit 77)
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The modules of ARCHITECTURE.md, bottom first, each with the modules its
# files may include besides its own (arrows point down the table). The
# directories of a module's library sources follow. Everything else (tests/,
# bench/, tools/) may include anything. `--check-layering` (run by
# tests/run_all.py) fails on an include outside these sets.
MODULES = {
    "common": {"deps": [], "dirs": ["common"]},
    "kvpool": {"deps": ["common"], "dirs": ["kvpool"]},
    "scheduler": {"deps": ["kvpool", "common"], "dirs": ["scheduler"]},
    "kernels": {"deps": ["common"], "dirs": ["kernels", "kernels/cpu", "kernels/cuda", "kernels/comm"]},
    # The model-file readers (GGUF, safetensors): below text/ (the tokenizer
    # and chat template come out of a GGUF file) and engine/ (the weights).
    "formats": {"deps": ["kernels", "common"], "dirs": ["formats"]},
    # What turns text into tokens and back and constrains them: used by the
    # server (templates, tokenizing, stop strings) and the engine (grammar
    # masks). Never includes the engine.
    "text": {"deps": ["formats", "common"], "dirs": ["text/tokenizer", "text/template", "text/grammar"]},
    "engine": {"deps": ["text", "formats", "kernels", "scheduler", "kvpool", "common"], "dirs": ["engine", "engine/model", "engine/runner", "engine/dist", "engine/spec"]},
    "server": {"deps": ["engine", "text", "scheduler", "kvpool", "common"], "dirs": ["server"]},
}
LIB_DIRS = [d for m in MODULES.values() for d in m["dirs"]]
SOURCE_EXTS = (".c", ".h", ".cu", ".cuh")
LLHTTP_DIR = "/usr/share/llhttp"
LLHTTP_SRCS = ["api.c", "http.c", "llhttp.c"]
# Unit tests that also run under ThreadSanitizer (build/tsan/tests/test_*):
# the ones whose subject is threads meeting each other. Few, since every one
# costs a TSan build of its objects and CI time.
TSAN_UNIT_TESTS = ["tests/unit/test_comm.c", "tests/unit/test_comm_a2a.c"]
# Files compiled into the binary as C arrays (tools/embed.py): source, symbol.
EMBEDS = [("server/webui/index.html", "paged_webui_index_html"),
          ("server/openapi.json", "paged_openapi_json")]


def sources(d, ext=".c", prefix=""):
    p = os.path.join(ROOT, d)
    if not os.path.isdir(p):
        return []
    return sorted(
        os.path.join(d, f)
        for f in os.listdir(p)
        if f.endswith(ext) and f.startswith(prefix)
    )


def obj(src, variant):
    base = os.path.splitext(src)[0]
    return f"build/{variant}/obj/{base}.o"


def generate():
    lib_srcs = [s for d in LIB_DIRS for s in sources(d) if s != "server/main.c"]
    cuda_srcs = sources("kernels/cuda", ".cu") + sources("kernels/comm", ".cu")
    unit_tests = sources("tests/unit", prefix="test_")
    test_support = [s for s in sources("tests/unit") if not os.path.basename(s).startswith("test_")]
    fuzz_targets = sources("tests/fuzz", prefix="fuzz_")
    bench_srcs = sources("bench")
    gpu_prog_srcs = sources("tests/gpu", ".cu", prefix="test_") + sources("bench", ".cu", prefix="bench_cuda_")
    # FlashInfer's sm90 prefill beside ours (issue 29): real only where
    # tools/nvcc_or_stub.sh finds FlashInfer's headers, a stub otherwise
    gpu_prog_srcs += sources("bench/cuda", ".cu", prefix="bench_fi_")
    gpu_c_tests = sources("tests/gpu", ".c", prefix="test_")

    out = []
    w = out.append
    w("# Generated by tools/gen_build.py; do not edit. Regenerate after adding files.")
    w("ninja_required_version = 1.10")
    w("")
    w("cc = gcc")
    w("clang = clang")
    w("incs = -I. -I/usr/share/include/llhttp -I/usr/include/x86_64-linux-gnu/openblas-pthread")
    w("# x86-64-v3 (AVX2, FMA, F16C) is the baseline; anything wider is dispatched at run time.")
    w("cflags = -std=c11 -D_GNU_SOURCE -O2 -g -march=x86-64-v3 -pthread -Wall -Wextra -Wno-unused-parameter -Wshadow -Wvla -Werror=implicit-function-declaration -Werror=incompatible-pointer-types -fno-strict-aliasing $incs")
    w("asanflags = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined")
    w("tsanflags = -fsanitize=thread -fno-omit-frame-pointer")
    w("libs = -luv -lcjson -lopenblas -lpcre2-8 -lxxhash -lssl -lcrypto -lm -lpthread -ldl")
    w("cudalibs = $$(tools/cuda_libs.sh)")
    w("")
    w("rule cc")
    w("  command = $cc -MMD -MF $out.d $cflags $extra -c $in -o $out")
    w("  depfile = $out.d")
    w("  deps = gcc")
    w("  description = CC $out")
    w("rule cc_third_party")
    w("  command = $cc -MMD -MF $out.d -std=c11 -O2 -g -march=x86-64-v3 $incs $extra -w -c $in -o $out")
    w("  depfile = $out.d")
    w("  deps = gcc")
    w("  description = CC $out")
    w("rule nvcc")
    w("  command = tools/nvcc_or_stub.sh $in $out")
    w("  depfile = $out.d")
    w("  deps = gcc")
    w("  description = NVCC $out")
    w("rule nvcc_link")
    w("  command = tools/nvcc_or_stub.sh --link $out $in")
    w("  description = NVCC-LINK $out")
    w("rule ar")
    w("  command = rm -f $out && ar crs $out $in")
    w("  description = AR $out")
    w("rule link")
    w("  command = $cc $extra -pthread -o $out $in $libs $$(tools/cuda_libs.sh $cudaobjs)")
    w("  description = LINK $out")
    w("# Programs that run the engine on the GPU: the CUDA archive whole and first,")
    w("# so its objects replace kernels/cuda/cuda_stub.c (which stays in libpaged.a).")
    w("rule link_cuda")
    w("  command = $cc $extra -pthread -o $out $objs -Wl,--whole-archive $cudaobjs -Wl,--no-whole-archive $archives $libs $$(tools/cuda_libs.sh $cudaobjs)")
    w("  description = LINK $out")
    w("rule clang_cc")
    w("  command = $clang -MMD -MF $out.d -std=c11 -D_GNU_SOURCE -O1 -g -march=x86-64-v3 $incs -fsanitize=fuzzer-no-link,address,undefined -c $in -o $out")
    w("  depfile = $out.d")
    w("  deps = gcc")
    w("  description = CLANG $out")
    w("rule clang_link")
    w("  command = $clang -fsanitize=fuzzer,address,undefined -o $out $in $libs")
    w("  description = LINK $out")
    w("rule embed")
    w("  command = python3 tools/embed.py $in $out $sym")
    w("  description = EMBED $out")
    w("rule regen")
    w("  command = python3 tools/gen_build.py")
    w("  generator = 1")
    w("  description = REGEN build.ninja")
    w("")
    w("build build.ninja: regen tools/gen_build.py")
    w("")

    defaults = []
    variants = {"rel": "", "asan": "$asanflags"}
    embed_srcs = []
    for src, sym in EMBEDS:
        gen = f"build/gen/{os.path.splitext(src)[0]}_{os.path.splitext(src)[1][1:]}.c"
        w(f"build {gen}: embed {src} | tools/embed.py")
        w(f"  sym = {sym}")
        embed_srcs.append(gen)
    libs = {}
    for variant, extra in variants.items():
        objs = []
        for s in lib_srcs:
            o = obj(s, variant)
            w(f"build {o}: cc {s}")
            if extra:
                w(f"  extra = {extra}")
            objs.append(o)
        for s in embed_srcs:
            o = f"build/{variant}/obj/{os.path.splitext(s)[0][len('build/'):]}.o"
            w(f"build {o}: cc {s}")
            if extra:
                w(f"  extra = {extra}")
            objs.append(o)
        for s in LLHTTP_SRCS:
            o = f"build/{variant}/obj/third_party/llhttp/{os.path.splitext(s)[0]}.o"
            w(f"build {o}: cc_third_party {LLHTTP_DIR}/{s}")
            if extra:
                w(f"  extra = {extra}")
            objs.append(o)
        lib = f"build/{variant}/libpaged.a"
        w(f"build {lib}: ar {' '.join(objs)}")
        libs[variant] = lib
        for s in test_support:
            o = obj(s, variant)
            w(f"build {o}: cc {s}")
            if extra:
                w(f"  extra = {extra}")
        w("")

    cuda_objs = []
    for s in cuda_srcs:
        o = obj(s, "rel").replace(".o", ".cu.o")
        w(f"build {o}: nvcc {s} | tools/nvcc_or_stub.sh")
        cuda_objs.append(o)
    cuda_lib = "build/rel/libpaged_cuda.a"
    w(f"build {cuda_lib}: ar {' '.join(cuda_objs)}" if cuda_objs else f"build {cuda_lib}: ar")
    w("")

    main_o = obj("server/main.c", "rel")
    w(f"build {main_o}: cc server/main.c")
    w(f"build build/paged: link_cuda {main_o} {libs['rel']} {cuda_lib}")
    w(f"  objs = {main_o}")
    w(f"  archives = {libs['rel']}")
    w(f"  cudaobjs = {cuda_lib}")
    defaults.append("build/paged")
    # The same binary under AddressSanitizer + UBSan, for the server's HTTP
    # edge-case tests (PAGED_BIN=build/asan/paged); CPU only.
    asan_main_o = obj("server/main.c", "asan")
    w(f"build {asan_main_o}: cc server/main.c")
    w("  extra = $asanflags")
    w(f"build build/asan/paged: link {asan_main_o} {libs['asan']} {cuda_lib}")
    w("  extra = $asanflags")
    w(f"  cudaobjs = {cuda_lib}")

    # The server under ThreadSanitizer (build/tsan/paged, `ninja tsan`; CPU
    # only): tests/integration/test_server_tsan.py drives the loop thread,
    # the engine thread and both thread pools (libuv's, the CPU backend's).
    tsan_objs = []
    for s in lib_srcs + ["server/main.c"]:
        o = obj(s, "tsan")
        w(f"build {o}: cc {s}")
        w("  extra = $tsanflags")
        tsan_objs.append(o)
    for s in embed_srcs:
        o = f"build/tsan/obj/{os.path.splitext(s)[0][len('build/'):]}.o"
        w(f"build {o}: cc {s}")
        w("  extra = $tsanflags")
        tsan_objs.append(o)
    for s in LLHTTP_SRCS:
        o = f"build/tsan/obj/third_party/llhttp/{os.path.splitext(s)[0]}.o"
        w(f"build {o}: cc_third_party {LLHTTP_DIR}/{s}")
        w("  extra = $tsanflags")
        tsan_objs.append(o)
    w(f"build build/tsan/paged: link {' '.join(tsan_objs)} {cuda_lib}")
    w("  extra = $tsanflags")
    w(f"  cudaobjs = {cuda_lib}")
    # The same objects (less main.o) as an archive, for the TSan unit tests.
    tsan_main_o = obj("server/main.c", "tsan")
    w(f"build build/tsan/libpaged.a: ar {' '.join(o for o in tsan_objs if o != tsan_main_o)}")
    tsan_test_bins = []
    for s in TSAN_UNIT_TESTS:
        if not os.path.exists(os.path.join(ROOT, s)):
            continue
        name = os.path.splitext(os.path.basename(s))[0]
        o = obj(s, "tsan")
        w(f"build {o}: cc {s}")
        w("  extra = $tsanflags")
        b = f"build/tsan/tests/{name}"
        w(f"build {b}: link {o} build/tsan/libpaged.a")
        w("  libs = $libs -lcmocka")
        w("  extra = $tsanflags")
        tsan_test_bins.append(b)

    test_bins = {"rel": [], "asan": []}
    for variant, extra in variants.items():
        support_objs = " ".join(obj(s, variant) for s in test_support)
        for s in unit_tests:
            name = os.path.splitext(os.path.basename(s))[0]
            o = obj(s, variant)
            w(f"build {o}: cc {s}")
            if extra:
                w(f"  extra = {extra}")
            b = f"build/tests/{name}" if variant == "rel" else f"build/asan/tests/{name}"
            w(f"build {b}: link {o} {support_objs} {libs[variant]}")
            w(f"  libs = $libs -lcmocka")
            if extra:
                w(f"  extra = {extra}")
            test_bins[variant].append(b)
    defaults += test_bins["rel"]

    fuzz_bins, libfuzzer_bins = [], []
    driver_o = obj("tests/fuzz/driver_standalone.c", "asan")
    if os.path.exists(os.path.join(ROOT, "tests/fuzz/driver_standalone.c")):
        w(f"build {driver_o}: cc tests/fuzz/driver_standalone.c")
        w("  extra = $asanflags")
    for s in fuzz_targets:
        name = os.path.splitext(os.path.basename(s))[0]
        o = obj(s, "asan")
        w(f"build {o}: cc {s}")
        w("  extra = $asanflags")
        b = f"build/fuzz/{name}"
        w(f"build {b}: link {o} {driver_o} {libs['asan']}")
        w("  extra = $asanflags")
        fuzz_bins.append(b)
        # libFuzzer build: the library sources are compiled with clang too.
        lo = f"build/libfuzzer/obj/{name}.o"
        w(f"build {lo}: clang_cc {s}")
        lib_objs = []
        for ls in lib_srcs:
            lso = f"build/libfuzzer/obj/{os.path.splitext(ls)[0]}.o"
            lib_objs.append(lso)
        lb = f"build/fuzz/libfuzzer_{name[len('fuzz_'):]}"
        # Linked through an archive so that only the objects a target needs
        # are pulled in (llhttp is in it too, for the server's targets).
        w(f"build {lb}: clang_link {lo} build/libfuzzer/libpaged.a")
        libfuzzer_bins.append(lb)
    if fuzz_targets:
        for ls in lib_srcs:
            lso = f"build/libfuzzer/obj/{os.path.splitext(ls)[0]}.o"
            w(f"build {lso}: clang_cc {ls}")
        for ls in LLHTTP_SRCS:
            lso = f"build/libfuzzer/obj/third_party/llhttp/{os.path.splitext(ls)[0]}.o"
            w(f"build {lso}: clang_cc {LLHTTP_DIR}/{ls}")
            lib_objs.append(lso)
        for ls in embed_srcs:  # the files compiled into the binary (chat page, OpenAPI)
            lso = f"build/libfuzzer/obj/{os.path.splitext(ls)[0][len('build/'):]}.o"
            w(f"build {lso}: clang_cc {ls}")
            lib_objs.append(lso)
        w(f"build build/libfuzzer/libpaged.a: ar {' '.join(lib_objs)}")

    # Test tools (tests/tools/*.c): programs the integration tests drive.
    tool_bins = []
    for s in sources("tests/tools"):
        name = os.path.splitext(os.path.basename(s))[0]
        o = obj(s, "rel")
        w(f"build {o}: cc {s}")
        b = f"build/tests/tools/{name}"
        # Like build/paged (they run the engine's executor, which can make
        # CUDA backends): the CUDA archive whole and first.
        w(f"build {b}: link_cuda {o} {libs['rel']} {cuda_lib}")
        w(f"  objs = {o}")
        w(f"  archives = {libs['rel']}")
        w(f"  cudaobjs = {cuda_lib}")
        tool_bins.append(b)
    defaults += tool_bins

    bench_bins = []
    for s in bench_srcs:
        name = os.path.splitext(os.path.basename(s))[0]
        o = obj(s, "rel")
        w(f"build {o}: cc {s}")
        b = f"build/bench/{name}"
        w(f"build {b}: link {o} {libs['rel']} {cuda_lib}")
        w(f"  cudaobjs = {cuda_lib}")
        bench_bins.append(b)
    defaults += bench_bins

    # Standalone GPU test and benchmarks (tests/gpu/run_gpu_tests.sh runs them).
    gpu_bins = []
    for s in gpu_prog_srcs:
        name = os.path.splitext(os.path.basename(s))[0]
        o = obj(s, "rel").replace(".o", ".cu.o")
        w(f"build {o}: nvcc {s} | tools/nvcc_or_stub.sh")
        # the quantizers / dequantizers the quantized-weight cases and
        # benchmarks take their data from (and qgemv.cu's type names)
        # (and the log, which the library's FlashInfer prefill writes to)
        support = [obj("common/err.c", "rel"), obj("common/log.c", "rel"), obj("kernels/dtype.c", "rel")]
        if s.startswith("tests/"):
            support += [obj("kernels/cpu/sampling.c", "rel")]  # the CPU sampler
        b = f"build/gpu/{name}"
        w(f"build {b}: nvcc_link {o} {cuda_lib} {' '.join(support)} | tools/nvcc_or_stub.sh")
        gpu_bins.append(b)
    # (not in `ninja gpu`: these need libpaged's libraries, which the GPU
    # machine lacks; tools/pack_gpu.sh carries them there)
    gpu_c_bins = []
    for s in gpu_c_tests:
        name = os.path.splitext(os.path.basename(s))[0]
        o = obj(s, "rel")
        w(f"build {o}: cc {s}")
        b = f"build/gpu/{name}"
        w(f"build {b}: link_cuda {o} {libs['rel']} {cuda_lib}")
        w(f"  objs = {o}")
        w(f"  archives = {libs['rel']}")
        w(f"  cudaobjs = {cuda_lib}")
        gpu_c_bins.append(b)
    defaults += gpu_bins + gpu_c_bins

    w("")
    w(f"build asan: phony build/asan/paged {' '.join(test_bins['asan'] + fuzz_bins)}")
    w(f"build fuzz: phony {' '.join(fuzz_bins)}")
    w(f"build tsan: phony build/tsan/paged {' '.join(tsan_test_bins)}")
    w(f"build gpu: phony {' '.join(gpu_bins)}")
    w(f"build fuzz-libfuzzer: phony {' '.join(libfuzzer_bins)}")
    w(f"build all: phony {' '.join(defaults + ['build/asan/paged'] + test_bins['asan'] + fuzz_bins + libfuzzer_bins + ['build/tsan/paged'] + tsan_test_bins)}")
    w(f"default {' '.join(defaults)}")
    return "\n".join(out) + "\n"


def module_of(path):
    """The module a repository path belongs to (its first directory), or None."""
    top = path.replace(os.sep, "/").split("/", 1)[0]
    return top if top in MODULES else None


def layering_violations(root=ROOT, modules=None):
    """Every include of a module's source that names a module outside its
    allowed set, as 'file:line: includes "x" (module m may include ...)'."""
    modules = modules or MODULES
    bad = []
    for name, m in modules.items():
        allowed = set(m["deps"]) | {name}
        for d in sorted(set(m["dirs"])):
            p = os.path.join(root, d)
            if not os.path.isdir(p):
                continue
            for f in sorted(os.listdir(p)):
                if not f.endswith(SOURCE_EXTS):
                    continue
                rel = f"{d}/{f}"
                with open(os.path.join(p, f), errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        s = line.strip()
                        if not s.startswith("#include") or '"' not in s:
                            continue
                        inc = s.split('"')[1]
                        top = inc.split("/", 1)[0]
                        if top in modules and top not in allowed:
                            bad.append(f'{rel}:{n}: includes "{inc}" (module {name} may include '
                                       f'{", ".join(sorted(allowed))})')
    return bad


def folder_cycles(root=ROOT, modules=None):
    """Circles between the folders of one module (engine/model, engine/runner,
    ...): each as 'a -> b -> a (a/x.c:3 includes "b/y.h"; ...)'. Files of one
    folder may include each other; folders point one way."""
    modules = modules or MODULES
    bad = []
    for name, m in modules.items():
        dirs = sorted(set(m["dirs"]))
        if len(dirs) < 2:
            continue
        edges = {d: {} for d in dirs}  # folder -> {included folder: first file:line}
        for d in dirs:
            p = os.path.join(root, d)
            if not os.path.isdir(p):
                continue
            for f in sorted(os.listdir(p)):
                if not f.endswith(SOURCE_EXTS):
                    continue
                with open(os.path.join(p, f), errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        s = line.strip()
                        if not s.startswith("#include") or '"' not in s:
                            continue
                        to = os.path.dirname(s.split('"')[1])
                        if to in edges and to != d:
                            edges[d].setdefault(to, f'{d}/{f}:{n} includes "{s.split(chr(34))[1]}"')
        seen = set()

        def walk(path):
            for to in sorted(edges[path[-1]]):
                if to == path[0]:
                    cyc = path + [to]
                    key = frozenset(cyc)
                    if key not in seen:
                        seen.add(key)
                        why = "; ".join(edges[a][b] for a, b in zip(cyc, cyc[1:]))
                        bad.append(f'{" -> ".join(cyc)} ({why})')
                elif to not in path and to > path[0]:
                    walk(path + [to])

        for d in dirs:
            walk([d])
    return bad


# Modules whose files stay under MAX_LINES lines (a file holds one concern;
# the engine and text/ were split to this, and stay so).
SIZE_CHECKED = ("engine", "text")
MAX_LINES = 800


def oversized_files(root=ROOT, modules=None):
    """Every source file of SIZE_CHECKED's modules over MAX_LINES lines, as
    'path: N lines (at most MAX_LINES)'."""
    modules = modules or MODULES
    bad = []
    for name in SIZE_CHECKED:
        for d in sorted(set(modules.get(name, {}).get("dirs", []))):
            p = os.path.join(root, d)
            if not os.path.isdir(p):
                continue
            for f in sorted(os.listdir(p)):
                if f.endswith(SOURCE_EXTS):
                    with open(os.path.join(p, f), errors="replace") as fh:
                        n = sum(1 for _ in fh)
                    if n > MAX_LINES:
                        bad.append(f"{d}/{f}: {n} lines (at most {MAX_LINES} in {name}/)")
    return bad


def main():
    if "--check-layering" in sys.argv:
        bad = layering_violations()
        for b in bad:
            print(b, file=sys.stderr)
        if bad:
            print(f"{len(bad)} include(s) outside the module table of tools/gen_build.py", file=sys.stderr)
        cyc = folder_cycles()
        for c in cyc:
            print(f"circle between folders: {c}", file=sys.stderr)
        big = oversized_files()
        for b in big:
            print(b, file=sys.stderr)
        if bad or cyc or big:
            return 1
        print(f"layering: {len(MODULES)} modules, no include outside their dependencies, "
              f"no circle between folders, no file of {'/, '.join(SIZE_CHECKED)}/ over {MAX_LINES} lines")
        return 0
    text = generate()
    path = os.path.join(ROOT, "build.ninja")
    if "--check" in sys.argv:
        cur = open(path).read() if os.path.exists(path) else ""
        if cur != text:
            print("build.ninja is stale: run python3 tools/gen_build.py", file=sys.stderr)
            return 1
        return 0
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)
    else:
        # Unchanged, but ninja asked (the generator looked newer, as after a
        # fresh clone): touch it, or ninja would ask again forever.
        os.utime(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
