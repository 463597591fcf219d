#!/bin/bash
# Device call I (session 26; issue 33): the graph-safe op's wide kernels
# past 8 rows (PAGED_CUDA_LORA_DEV_TILES=1: the shrink a warp a row, the
# expand 4 rows x 8 columns a thread; docs/lora.md "Wide kernels") and
# the runs through cuBLASLt as the eager default. Packs:
# .gpucarry/s36.tar.xz (this build: paged, test_cuda_runner,
# test_cuda_lora, bench_cuda_lora, lib), .gpucarry/s35old.tar.xz (call
# G's build's paged as paged_old: the per-row kernels' reduce-scatter
# keeps their bits, and W1 must not move). In one call:
#   0. bench_cuda_lora by batch size, tiles off then on;
#   1. test_cuda_lora (its graph cases again with tiles on), the LoRA
#      runner check (runs by default, BGMV alone), and with the graph-safe
#      op in eager steps with tiles on;
#   2. served llama3-8b shape, 8 rank-16 adapters: new (this build), tiles
#      (the wide kernels in the decode graphs past 8 rows), old (call G's
#      build, BGMV in eager steps), base (no adapter named); W1 with and
#      without an adapter, W4 100 clients 30 s.
# (Session 26: the wide kernels lost and are gone, with the flag and
# lora_serve_runs' "tiles" kind; docs/lora.md "Fewer, wider CTAs".)
set -u
. bench/gpu_call_lib.sh
call_init cI
[ -x build/gpu-pack/paged ] || unpack s36
[ -x build/gpu-pack/paged_old ] || unpack s35old
K=$PWD/build/gpu-pack
gpu_name
timeout 90 "$K/bench_cuda_lora" --m 1,8,64,128,256 > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
PAGED_CUDA_LORA_DEV_TILES=1 timeout 90 "$K/bench_cuda_lora" --m 64,128,256 > "$R/bench_lora_tiles.txt" 2>&1
echo "bench_cuda_lora DEV_TILES=1 rc=$? at $(el)s"
grep -E "^(layer|rank)" "$R/bench_lora.txt" "$R/bench_lora_tiles.txt" | cut -d: -f2 | awk '{print $1,$2,$3,$5}'
save
lora_checks "$K" 0
grep -E "unaligned|m 300" "$R/lora_kernels.txt" "$R/lora_kernels_tiles.txt" | cut -c1-230
PAGED_LORA_DEV_EAGER=1 PAGED_CUDA_LORA_DEV_TILES=1 timeout 60 "$K/test_cuda_runner" /tmp/paged-m64 \
    --lora "$(ls -d /tmp/paged-m64-lora/* | paste -sd,)" > "$R/runner_lora_tiles.txt" 2>&1
echo "runner LoRA DEV_EAGER=1 TILES=1 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_tiles.txt" | cut -c1-200)"
save
lora_serve_runs "$K" 8 tiles new old base
echo "done at $(el)s"
