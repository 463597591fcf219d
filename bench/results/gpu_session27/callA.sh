#!/bin/bash
# Device call A (session 27; issue 33): the graph-safe LoRA op in tiles of
# one adapter on the tensor cores (kernels/cuda/lora_tiles.cu, behind
# PAGED_CUDA_LORA_TILES=N). .gpucarry/s39.tar.xz holds the new build's
# programs and HEAD's paged (3a51bb2) as paged_old. Checks: test_cuda_lora
# (the graph cases a CTA a row and in tiles), the runner's LoRA check with
# tiles in the graphs and the eager steps; then one layer's LoRA by batch
# size (bench_cuda_lora: dev = a CTA a row, tiles); then the served
# llama3-8b shape with 8 rank-16 adapters: tiles from 16 rows, the new
# build's default (a CTA a row), the base (no adapter named), tiles in the
# eager steps too, and HEAD's build, as time allows.
set -u
. bench/gpu_call_lib.sh
call_begin cA "${PACK:-s39}"
lora_checks "$K"
save
timeout 150 "$K/bench_cuda_lora" --m 8,16,32,64,92,128,256,1024 > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
grep -E "^(group|layer)" "$R/bench_lora.txt"
save
LORA_STOP=${LORA_STOP:-400} lora_serve_runs "$K" 8 tiles new base tilesdev old
echo "done at $(el)s"
