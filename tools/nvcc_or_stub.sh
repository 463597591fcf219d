#!/bin/sh
# Compiles one CUDA source for Hopper (sm_90a) where nvcc exists; elsewhere
# writes an empty object so the CPU-only build links unchanged. The CUDA
# backend registers itself only when its objects are real (kernels/kernels.h).
# Writes the header dependencies to $out.d (ninja's depfile) either way.
#
#   nvcc_or_stub.sh IN.cu OUT.o               compile
#   nvcc_or_stub.sh --link OUT IN.o IN.a ...  link a standalone GPU program
#       (static CUDA runtime, cuBLASLt, static libstdc++); without nvcc, OUT
#       is a script that says so and exits 77 (skipped).
set -e
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ "$1" = "--link" ]; then
    out=$2
    shift 2
    mkdir -p "$(dirname "$out")"
    if [ -x "$NVCC" ]; then
        CUDA=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
        exec "$NVCC" -o "$out" "$@" -cudart static -L"$CUDA/lib64" -lcublasLt \
            -Xcompiler -static-libstdc++,-static-libgcc -Xlinker -rpath,"$CUDA/lib64" \
            -Xlinker -rpath,/usr/local/cuda/lib64 -lpthread -ldl -lrt
    fi
    echo "skipped: no nvcc, $out is a stub" >&2
    printf '#!/bin/sh\necho "skipped: %s was built without nvcc"\nexit 77\n' "$out" >"$out"
    chmod +x "$out"
    exit 0
fi
in=$1 out=$2
mkdir -p "$(dirname "$out")"
if [ -x "$NVCC" ]; then
    case "$in" in
    *_cutlass.cu | *_cutlass_*.cu)
        # CUTLASS's headers from PyPI's nvidia-cutlass (deploy/quickstart.sh
        # puts it in .venv; CUTLASS_INC overrides). Hopper only. Without the
        # headers the file builds its PG_EUNSUPP fallback.
        inc=${CUTLASS_INC:-$(ls -d .venv/lib/python3*/site-packages/cutlass_library/source/include 2>/dev/null | head -1)}
        if [ -n "$inc" ] && [ -d "$inc" ]; then
            exec "$NVCC" -std=c++17 -O3 -lineinfo -I. -I"$inc" -I"$inc/../tools/util/include" -DPG_HAVE_CUTLASS \
                --expt-relaxed-constexpr -DNDEBUG -MD -MF "$out.d" -gencode arch=compute_90a,code=sm_90a \
                -Xcompiler -fPIC -c "$in" -o "$out"
        fi
        ;;
    *_flashinfer.cu)
        # FlashInfer's header library (attention/hopper/prefill_sm90.cuh) with
        # the CUTLASS and CCCL it bundles, from PyPI's flashinfer-python
        # (deploy/quickstart.sh puts it in .venv; FLASHINFER_INC names its
        # data/include folder). The flags are FlashInfer's own JIT's for sm90.
        # Without the headers the file builds its stub, which answers
        # PG_EUNSUPP (and bench/cuda/bench_fi_prefill exits 77).
        inc=${FLASHINFER_INC:-$(ls -d .venv/lib/python3*/site-packages/flashinfer/data/include 2>/dev/null | head -1)}
        if [ -n "$inc" ] && [ -f "$inc/flashinfer/attention/hopper/prefill_sm90.cuh" ]; then
            d=$inc/..
            exec "$NVCC" -std=c++17 -O3 -lineinfo -I. -I"$d/cccl/cub" -I"$d/cccl/libcudacxx/include" \
                -I"$d/cccl/thrust" -isystem "$inc" -isystem "$d/cutlass/include" \
                -isystem "$d/cutlass/tools/util/include" -DPG_HAVE_FLASHINFER -DNDEBUG \
                -DFLASHINFER_ENABLE_BF16 -DFLASHINFER_ENABLE_FP8_E4M3 -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED \
                --expt-relaxed-constexpr -use_fast_math -static-global-template-stub=false -MD -MF "$out.d" \
                -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC -c "$in" -o "$out"
        fi
        echo "FlashInfer's headers not found (.venv or FLASHINFER_INC): $in builds its stub" >&2
        ;;
    esac
    exec "$NVCC" -std=c++17 -O3 -g -lineinfo -I. -MD -MF "$out.d" \
        -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80 \
        -Xcompiler -fPIC,-Wall -c "$in" -o "$out"
fi
echo "nvcc not found: $in skipped (CPU-only build)" >&2
printf '%s: %s\n' "$out" "$in" >"$out.d"
printf '' | gcc -x c -c - -o "$out"
