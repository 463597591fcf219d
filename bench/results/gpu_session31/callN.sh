#!/bin/bash
# Device call N (session 31), issue 33's W1: gate|up's activation in its
# expand (lora_graph.cu lora_dev_expand_silu_kernel, behind
# PAGED_CUDA_LORA_EXPAND_SILU=1; the patch lora_expand_silu.patch beside
# this file, applied to the build the pack holds): a LoRA graph step's FFN
# is the GEMV, the shrink and the expand with silu_mul folded in (one
# launch fewer a layer; W1 with an adapter 1.127x the base, the target
# 1.1x):
#   1. test_cuda_lora -k "lora graph" (the graph cases and "lora graph
#      silu": the fused expand bit for bit against the expand, then
#      silu_mul, eager and replayed); test_cuda_runner --lora against the
#      CPU with PAGED_CUDA_LORA_EXPAND_SILU=0 and =1;
#   2. ncu of the graph-safe op at one row (bench_cuda_lora --m 1): each
#      shrink and expand launch alone, after the shrink's load fix;
#   3. served llama3-8b-shape with 8 rank-16 adapters: W1 (a0 and none)
#      with the default (new) and with PAGED_CUDA_LORA_EXPAND_SILU=1 (silu).
# Pack: .gpucarry/${PACK:-s46}.tar.xz (this build with the patch).
set -u
. bench/gpu_call_lib.sh
call_begin cN "${PACK:-s46}"

m64=/tmp/paged-m64
timeout 120 "$K/test_cuda_lora" -k "lora graph" > "$R/lora_kernels.txt" 2>&1
echo "test_cuda_lora -k 'lora graph' rc=$? at $(el)s: $(tail -1 "$R/lora_kernels.txt")"
grep -E "^FAIL" "$R/lora_kernels.txt" | head -8
grep -E "lora graph silu" "$R/lora_kernels.txt" | head -4
dirs=$(m64_lora)
for si in 0 1; do
    PAGED_CUDA_LORA_EXPAND_SILU=$si timeout 60 "$K/test_cuda_runner" $m64 --lora "$dirs" \
        > "$R/runner_lora_silu$si.txt" 2>&1
    echo "runner LoRA EXPAND_SILU=$si rc=$? at $(el)s: $(tail -1 "$R/runner_lora_silu$si.txt" | cut -c1-200)"
done
save
# The shrink's loads fixed (981d5ca): each launch alone at one row (call A,
# before it: shrink 12.0-12.5 us, expand 5.7-6.1).
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
    timeout 100 "$NCU" --kernel-name regex:'lora_dev_(shrink|expand)' --launch-count 300 \
        --metrics gpu__time_duration.sum --csv "$K/bench_cuda_lora" --m 1 > "$R/ncu_lora_m1.csv" 2> "$R/ncu.err"
    echo "ncu rc=$? at $(el)s"
    ncu_summary "$R/ncu_lora_m1.csv"
fi
save
LORA_W4=0 LORA_STOP=${LORA_STOP:-300} lora_serve_runs "$K" 8 new silu
echo "done at $(el)s"
