#!/bin/sh
# tools/pack_gpu.sh - packs what the lent GPU machine needs to run paged.
#
# That machine has CUDA and python3 + numpy but none of libuv, libcjson,
# OpenBLAS, PCRE2 or xxHash. This relinks build/paged and the GPU test
# programs with libuv static and rpath $ORIGIN/lib, copies every shared
# library they need
# that is not glibc, libstdc++/libgcc or CUDA's into lib/, and writes
#
#   build/gpu-pack/                paged, test_cuda_runner, test_cuda_kernels,
#                                  bench_cuda_attention, bench_cuda_gemv,
#                                  lib/*.so*
#   build/gpu-pack.tar.xz          the same, compressed (about 10 MB), which
#                                  is what a device run carries: the
#                                  uncompressed folder (OpenBLAS alone is
#                                  36 MB) would crowd the 64 MiB limit
#
# Not part of the default build. Needs nvcc here (the CUDA objects must be
# real). On the GPU machine tests/gpu/run_gpu_tests.sh unpacks the archive.
set -eu
cd "$(dirname "$0")/.."
python3 tools/gen_build.py
ninja -j2 build/paged build/gpu/test_cuda_runner build/gpu/test_cuda_kernels build/gpu/bench_cuda_attention \
    build/gpu/bench_cuda_gemv build/gpu/test_cuda_fp8_gemm build/gpu/bench_cuda_gemm_fp8 build/gpu/test_cuda_moe \
    build/gpu/test_cuda_gemma_ops build/gpu/test_cuda_lora build/gpu/bench_cuda_lora build/gpu/bench_fi_prefill build/bench/bench_structured
cudalib=build/rel/libpaged_cuda.a
if ! nm "$cudalib" 2>/dev/null | grep -q ' T pg_backend_cuda_create'; then
    echo "pack_gpu: $cudalib holds no CUDA objects (no nvcc?); nothing to pack" >&2
    exit 1
fi
out=build/gpu-pack
rm -rf "$out" "$out.tar.xz"
mkdir -p "$out/lib"

# The same link as build.ninja's link_cuda rule, plus the rpath, with libuv
# static (libuv1-dev's libuv_a.a); Debian ships no static cJSON, OpenBLAS
# or PCRE2 worth linking in, so those travel in lib/.
link() { # NAME OBJECT
    # shellcheck disable=SC2016,SC2046
    gcc -pthread -o "$out/$1" "$2" -Wl,--whole-archive "$cudalib" -Wl,--no-whole-archive build/rel/libpaged.a \
        -l:libuv_a.a -lcjson -lopenblas -lpcre2-8 -lxxhash -lssl -lcrypto -lm -lpthread -ldl $(tools/cuda_libs.sh "$cudalib") \
        -Wl,-rpath,'$ORIGIN/lib'
    strip --strip-debug "$out/$1"
}
link paged build/rel/obj/server/main.o
link test_cuda_runner build/rel/obj/tests/gpu/test_cuda_runner.o
# The structured-output mask benchmark, for the GPU host's CPU (the target
# of docs/structured_outputs.md is measured there).
link bench_structured build/rel/obj/bench/bench_structured.o
cp build/gpu/test_cuda_kernels build/gpu/bench_cuda_attention build/gpu/bench_cuda_gemv build/gpu/test_cuda_fp8_gemm \
    build/gpu/bench_cuda_gemm_fp8 build/gpu/test_cuda_moe build/gpu/test_cuda_gemma_ops build/gpu/test_cuda_lora build/gpu/bench_cuda_lora \
    build/gpu/bench_fi_prefill "$out/"

# Shared libraries beyond what every Linux with CUDA has.
for lib in $(ldd "$out/paged" "$out/test_cuda_runner" "$out/bench_structured" | awk '/=> \// {print $3}' | sort -u); do
    case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux* | libstdc++.so.* | \
        libgcc_s.so.* | libcublas*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
    esac
done
tar -C build -cJf "$out.tar.xz" gpu-pack
ls -la "$out" "$out/lib"
du -sh "$out" "$out.tar.xz"
