#!/bin/bash
# Device call A (session 25; issue 33): session 24's PDL step for the
# graph-safe LoRA kernels (bench/results/gpu_session24/lora_graph_pdl.patch:
# both kernels launched with PDL, the chunk of A and the row of B asked of
# the L2 before the wait, the expand's chunk loads four at a time) against
# the committed build (9013a96's kernels), in one call:
#   1. test_cuda_lora and the LoRA runner checks on the new build;
#   2. served llama3-8b shape with 8 rank-16 adapters: W1 without and with
#      an adapter, W4 100 clients over 8 adapters, new then old.
# Packs: .gpucarry/s31.tar.xz (9013a96 + the patch: paged, test_cuda_runner,
# test_cuda_lora, lib), .gpucarry/s30old.tar.xz (9013a96's paged as
# paged_old).
set -u
. bench/gpu_call_lib.sh
call_init cA
[ -x build/gpu-pack/paged ] || unpack s31
[ -x build/gpu-pack/paged_old ] || unpack s30old
K=$PWD/build/gpu-pack
gpu_name
lora_checks "$K" 0
grep -E "graph" $R/lora_kernels.txt | head -4
save
lora_serve_runs "$K" 8 new old
echo "done at $(el)s"
