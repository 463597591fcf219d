#!/bin/bash
# Device call I (session 21, issue 29): FlashInfer's paged prefill at
# head_dim 128 with 128-key K/V tiles (PAGED_CUDA_FI_KV_TILE=128, its
# ragged kernel's choice) against its paged default of 96, one binary:
# bench_fi_prefill's checks and timing with the variable, then the default
# timing. Pack: .gpucarry/s23.tar.xz (bench_fi_prefill alone). The
# variable was a temporary branch in prefill_flashinfer.cu's launch_bf16
# (AttentionKernelTraits<false, 128, 128, 128, 128, 2, ...> through
# BatchPrefillWithPagedKVCacheKernelTraitsDispatched); it did not win
# (docs/cuda_kernels.md) and was taken out again.
set -u
. bench/gpu_call_lib.sh
call_init cI
[ -x build/gpu-pack/bench_fi_prefill ] || unpack s23
G=build/gpu-pack
gpu_name
PAGED_CUDA_FI_KV_TILE=128 timeout 120 $G/bench_fi_prefill > $R/fi_kv128.log 2>&1
echo "kv tile 128 rc=$? at $(el)s: $(grep '^check:' $R/fi_kv128.log)"; grep -v " ok$" $R/fi_kv128.log | grep -E "FAIL|^[0-9]+ x " | head -10
timeout 60 $G/bench_fi_prefill --no-check --quick > $R/fi_kv96.log 2>&1
echo "kv tile 96 (default) rc=$? at $(el)s"; grep -E "^[0-9]+ x " $R/fi_kv96.log | head -4
save
echo "done at $(el)s"
