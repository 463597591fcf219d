#!/bin/bash
# Device call B (session 31), issue 33's W1: the graph-safe shrink's loads
# of A all in flight (lora_int.cuh pg_lora_piece_fma; call A's ncu: 12 us
# a shrink at one row, its loads one rank at a time) and the one-kernel
# path for small steps behind PAGED_CUDA_LORA_FUSED=N (lora_fused.cu),
# against call A's build (s44: paged_old, bench_cuda_lora_old) in the same
# call:
#   1. test_cuda_lora whole (the graph cases a CTA a row, in tiles, and
#      fused); test_cuda_runner --lora against the CPU with the defaults
#      and with PAGED_CUDA_LORA_FUSED=8 (graph buckets of up to 8 rows);
#   2. bench_cuda_lora --m 1,8,16,24,32,48,64,92, old and new;
#   3. served llama3-8b-shape with 8 rank-16 adapters: W1 (a0 and none)
#      with the old build, the new, the new with FUSED=8;
#   4. W4 (100 clients, 30 s): no LoRA, the new build, the old one.
# Pack: .gpucarry/s45.tar.xz (this build, and beside it
# gpu-pack/paged_old and bench_cuda_lora_old: eeeea41, call A's).
set -u
. bench/gpu_call_lib.sh
call_begin cB "${PACK:-s45}"

m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
timeout 120 "$K/test_cuda_lora" > "$R/lora_kernels.txt" 2>&1
echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 "$R/lora_kernels.txt")"
grep -E "^FAIL" "$R/lora_kernels.txt" | head -8
dirs=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
for fu in 0 8; do
    PAGED_CUDA_LORA_FUSED=$fu timeout 60 "$K/test_cuda_runner" $m64 --lora "$dirs" > "$R/runner_lora_fused$fu.txt" 2>&1
    echo "runner LoRA FUSED=$fu rc=$? at $(el)s: $(tail -1 "$R/runner_lora_fused$fu.txt" | cut -c1-200)"
done
save
for b in new old; do
    bin=$K/bench_cuda_lora
    [ $b = old ] && bin=$K/bench_cuda_lora_old
    timeout 60 "$bin" --m 1,8,16,24,32,48,64,92 > "$R/bench_lora_$b.txt" 2>&1
    echo "bench_cuda_lora $b rc=$? at $(el)s"
    grep -E "^(group|layer)" "$R/bench_lora_$b.txt"
done
grep -E "^(qkv|o |gate|down)" "$R/bench_lora_new.txt" | grep -E " 1 one"
save
LORA_W4=0 LORA_STOP=${LORA_STOP:-300} lora_serve_runs "$K" 8 old new fused
LORA_TAG=_w4 LORA_STOP=${LORA_STOP_W4:-430} lora_serve_runs "$K" 8 nolora new old
echo "done at $(el)s"
