#!/bin/bash
# Device call C (session 25; issue 33's W4): the graph-safe LoRA op with
# tiles of rows (kernels/cuda/lora_graph.cu rows_per_cta: past 8 rows a CTA
# runs 2-16 consecutive rows, so a prefill chunk of one adapter reads A and
# B from the L2 once a tile), in one call:
#   1. test_cuda_lora (its "lora graph: tiles" cases) and the LoRA runner
#      check, plain and with PAGED_LORA_DEV_EAGER=1 (the eager mixed steps
#      through the tiled op);
#   2. served llama3-8b shape with 8 rank-16 adapters: W1 and W4 for this
#      build with BGMV in eager steps (new), with the tiled op in eager
#      steps (dev), W4 naming no adapter (base), and call A's build (old).
# Packs: .gpucarry/s32.tar.xz (this build: paged, test_cuda_runner,
# test_cuda_lora, lib), .gpucarry/s31old.tar.xz (6eceb4a's paged as
# paged_old).
set -u
. bench/gpu_call_lib.sh
call_init cC
[ -x build/gpu-pack/paged ] || unpack s32
[ -x build/gpu-pack/paged_old ] || unpack s31old
K=$PWD/build/gpu-pack
gpu_name
lora_checks "$K" 0
grep -E "graph" "$R/lora_kernels.txt" | head -8
PAGED_LORA_DEV_EAGER=1 timeout 120 "$K/test_cuda_runner" /tmp/paged-m64 --lora "$(ls -d /tmp/paged-m64-lora/* | paste -sd,)" > "$R/runner_lora_deveager.txt" 2>&1
echo "runner LoRA DEV_EAGER=1 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_deveager.txt" | cut -c1-200)"
save
lora_serve_runs "$K" 8 dev new base old
echo "done at $(el)s"
