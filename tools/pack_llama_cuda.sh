#!/bin/sh
# tools/pack_llama_cuda.sh - packs llama.cpp's CUDA llama-server and
# llama-bench for the lent GPU machine (the peer of bench/run_gpu_compare.sh).
#
#   tools/pack_llama_cuda.sh            # from $LLAMA_BUILD (default below)
#   LLAMA_BUILD=/path/to/build-dir tools/pack_llama_cuda.sh
#
# Writes
#   build/llama-cuda/                llama-server, llama-bench (stripped),
#                                    lib/*.so* (whatever they need beyond
#                                    glibc, libstdc++/libgcc and CUDA's own
#                                    libraries: libgomp, libllama/libggml
#                                    when the build is shared, ...)
#   build/llama-cuda-pack.tar.xz     the same, compressed (xz -9): what a
#                                    device run carries; over PACK_LIMIT_MB
#                                    (40) without llama-bench
# No rpath is set (no patchelf here): run the binaries with
#   LD_LIBRARY_PATH=build/llama-cuda/lib:/usr/local/cuda/lib64
# as bench/run_gpu_compare.sh does. The build itself is not started here
# (it takes hours on two cores): the script says how far it got and stops.
set -eu
cd "$(dirname "$0")/.."
LLAMA_BUILD=${LLAMA_BUILD:-/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build-cuda}
bin=$LLAMA_BUILD/bin
for b in llama-server llama-bench; do
    if [ ! -x "$bin/$b" ]; then
        echo "pack_llama_cuda: $bin/$b is not built yet" >&2
        [ -f /work/ref/ninja-cuda.log ] && echo "  build progress: $(tail -1 /work/ref/ninja-cuda.log)" >&2
        exit 1
    fi
done
out=build/llama-cuda
rm -rf "$out" "build/llama-cuda-pack.tar.xz"
mkdir -p "$out/lib"
for b in llama-server llama-bench; do
    cp "$bin/$b" "$out/"
    strip --strip-unneeded "$out/$b"
done
# Libraries: resolve with the build tree first (a shared build's libllama,
# libggml*), then the system; skip glibc, the C++ runtime and CUDA's
# libraries (the GPU machine has them under /usr/local/cuda; the driver's
# libcuda.so.1 is the machine's own).
export LD_LIBRARY_PATH="$bin:$LLAMA_BUILD/src:$LLAMA_BUILD/ggml/src${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing=$(ldd "$out/llama-server" "$out/llama-bench" | awk '/not found/ {print $1}' | sort -u)
for lib in $(ldd "$out/llama-server" "$out/llama-bench" | awk '/=> \// {print $3}' | sort -u); do
    case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux* | libstdc++.so.* | \
        libgcc_s.so.* | libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | \
        libnvidia-* | libnccl.so.*) ;;
    *)
        cp -L "$lib" "$out/lib/"
        strip --strip-unneeded "$out/lib/$(basename "$lib")" 2>/dev/null || true
        ;;
    esac
done
for m in $missing; do
    case "$m" in
    libcuda.so.* | libcudart.so.* | libcublas*.so.*) ;;  # on the GPU machine
    *) echo "pack_llama_cuda: warning: $m not found here; the GPU machine must have it" >&2 ;;
    esac
done
echo "needed by llama-server: $(readelf -d "$out/llama-server" | awk '/NEEDED/ {gsub(/[][]/, "", $5); printf "%s ", $5}')"
"$out/llama-server" --version 2>&1 | grep -m1 -i version || true
# Both binaries hold the same static ggml-cuda kernels (tens of MB of
# already-compressed fatbins): xz -9 (64 MiB window, one thread) finds the
# second copy. A device run carries at most 64 MiB with the repository and
# build/gpu-pack.tar.xz, so past PACK_LIMIT_MB llama-bench is left out.
pack() { tar -C build -cf - llama-cuda | xz -9 -T1 >build/llama-cuda-pack.tar.xz; }
pack
limit=${PACK_LIMIT_MB:-40}
if [ "$(du -m build/llama-cuda-pack.tar.xz | cut -f1)" -gt "$limit" ]; then
    echo "pack_llama_cuda: $(du -m build/llama-cuda-pack.tar.xz | cut -f1) MB > ${limit} MB: leaving llama-bench out" >&2
    rm -f "$out/llama-bench"
    pack
fi
ls -la "$out" "$out/lib"
du -sh "$out" build/llama-cuda-pack.tar.xz
