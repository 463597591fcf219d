#!/bin/bash
# Device call A (session 22, issue 34: head_dim 256 on CUDA): the kernels
# against their references.
#   1. test_cuda_kernels -k hd256: decode v4 / v2 and prefill v1 at head_dim
#      256 (bf16, fp8, scaled fp8; windows 1-1024, soft-caps) against fp64,
#      prefill v2's refusal, the default's pick;
#   2. bench_fi_prefill --check: FlashInfer's sm90 prefill (bf16 and fp8)
#      against an fp32 host reference, the hd256 cases with the rest;
#   3. the FlashInfer / ours timing at 4/1/256, 16/8/256 (Gemma 3 270M, 12B)
#      and 32/8/128 (the shape, the figure before), and torch's
#      SDPA (cuDNN, FlashAttention-2) at 16/8/256 and 32/8/128;
#   4. the whole test_cuda_kernels (64 and 128 unchanged).
# Pack: .gpucarry/s24k.tar.xz (test_cuda_kernels, bench_fi_prefill).
set -u
. bench/gpu_call_lib.sh
call_init cA
[ -x build/gpu-pack/test_cuda_kernels ] || unpack s24k
K=build/gpu-pack
gpu_name
timeout 200 $K/test_cuda_kernels -k hd256 > $R/kernels_hd256.txt 2>&1
echo "kernels -k hd256 rc=$? at $(el)s: $(tail -1 $R/kernels_hd256.txt)"
grep -E "^FAIL" $R/kernels_hd256.txt | head -10
save
timeout 150 $K/bench_fi_prefill --check > $R/fi_check.txt 2>&1
echo "fi --check rc=$? at $(el)s: $(tail -1 $R/fi_check.txt)"
grep -E "hd256|FAIL" $R/fi_check.txt | head -20
save
for h in 4/1/256 16/8/256 32/8/128; do
    n=${h//\//_}
    timeout 100 $K/bench_fi_prefill --no-check --quick --heads $h > $R/fi_time_$n.txt 2>&1
    echo "fi timing $h rc=$? at $(el)s"
    grep -E "^causal|x " $R/fi_time_$n.txt
    save
done
for h in 16/8/256 32/8/128; do
    timeout 100 python3 bench/cuda/sdpa_peer.py --heads $h > $R/sdpa_${h//\//_}.txt 2>&1
    echo "torch SDPA $h rc=$? at $(el)s"
    cat $R/sdpa_${h//\//_}.txt
done
save
[ $(el) -gt 330 ] && { echo "done at $(el)s (whole kernel test left out)"; exit 0; }
timeout 240 $K/test_cuda_kernels > $R/kernels_all.txt 2>&1
echo "kernels all rc=$? at $(el)s: $(tail -1 $R/kernels_all.txt)"
grep -E "^FAIL" $R/kernels_all.txt | head -10
save
echo "done at $(el)s"
