#!/bin/bash
# Device call J (session 26; issue 33): the graph-safe op doing all it can
# before its PDL wait (the shrink everything but its stores, the expand
# its row of B and its element of out) and a CTA a row at every size (the
# wide kernels of call I removed), and the expand two columns a thread
# (PAGED_CUDA_LORA_EXPAND_COLS=2), against call G's build. Packs:
# .gpucarry/s38.tar.xz (this build: paged, test_cuda_runner,
# test_cuda_lora, bench_cuda_lora, lib), .gpucarry/s35old.tar.xz (call G's
# paged as paged_old). In one call:
#   0. bench_cuda_lora by batch size, one and two columns a thread;
#   1. test_cuda_lora (and its graph cases with two columns), the LoRA
#      runner check (runs by default, BGMV alone), and with the
#      graph-safe op in the eager steps too (one and two columns);
#   2. served llama3-8b shape, 8 rank-16 adapters (no base run: calls G
#      and I have it): new (this build),
#      cols2 (two columns a thread),
#      oldruns (call G's build with the runs through cuBLASLt, the eager
#      default here): W1 with and without an adapter, W4 100 clients
#      30 s.
# (Since this call two columns a thread is the default: the cols2 run is
# what HEAD runs, the new run is PAGED_CUDA_LORA_EXPAND_COLS=1.)
set -u
. bench/gpu_call_lib.sh
call_init cJ
[ -x build/gpu-pack/paged ] || unpack s38
[ -x build/gpu-pack/paged_old ] || unpack s35old
K=$PWD/build/gpu-pack
gpu_name
timeout 90 "$K/bench_cuda_lora" --m 1,8,64,128,256 > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
PAGED_CUDA_LORA_EXPAND_COLS=2 timeout 90 "$K/bench_cuda_lora" --m 1,8,64,128,256 > "$R/bench_lora_cols2.txt" 2>&1
echo "bench_cuda_lora EXPAND_COLS=2 rc=$? at $(el)s"
paste <(grep -E "^(layer|gate)" "$R/bench_lora.txt" | awk '{print $1,$2,$3,$5}') \
    <(grep -E "^(layer|gate)" "$R/bench_lora_cols2.txt" | awk '{print $5}')
save
lora_checks "$K" 0
grep -E "unaligned|m 300|m 2100" "$R/lora_kernels.txt" | cut -c1-200
PAGED_CUDA_LORA_EXPAND_COLS=2 timeout 120 "$K/test_cuda_lora" -k "lora graph" > "$R/lora_kernels_cols2.txt" 2>&1
echo "test_cuda_lora -k 'lora graph' EXPAND_COLS=2 rc=$? at $(el)s: $(tail -1 "$R/lora_kernels_cols2.txt")"
grep -E "^FAIL" "$R/lora_kernels_cols2.txt" | head -5
PAGED_LORA_DEV_EAGER=1 timeout 60 "$K/test_cuda_runner" /tmp/paged-m64 \
    --lora "$(ls -d /tmp/paged-m64-lora/* | paste -sd,)" > "$R/runner_lora_dev.txt" 2>&1
echo "runner LoRA DEV_EAGER=1 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_dev.txt" | cut -c1-200)"
PAGED_CUDA_LORA_EXPAND_COLS=2 PAGED_LORA_DEV_EAGER=1 timeout 60 "$K/test_cuda_runner" /tmp/paged-m64 \
    --lora "$(ls -d /tmp/paged-m64-lora/* | paste -sd,)" > "$R/runner_lora_dev2.txt" 2>&1
echo "runner LoRA DEV_EAGER=1 EXPAND_COLS=2 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_dev2.txt" | cut -c1-200)"
save
lora_serve_runs "$K" 8 new cols2 oldruns
echo "done at $(el)s"
