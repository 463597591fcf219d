#!/bin/sh
# Prints the link flags for the CUDA backend when the CUDA archive given as
# $1 holds real objects (nvcc existed at build time), else nothing. The CUDA
# runtime is linked statically; cuBLAS dynamically (the GPU machine has it).
[ -n "$1" ] && [ -f "$1" ] || exit 0
if nm "$1" 2>/dev/null | grep -q ' T pg_cuda_'; then
    CUDA=${CUDA_HOME:-/usr/local/cuda}
    echo "-L$CUDA/lib64 -Wl,-rpath,$CUDA/lib64 -lcudart_static -lcublasLt -lcublas -lrt -ldl -lstdc++"
fi
