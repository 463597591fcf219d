#!/bin/bash
# Device call H (session 18, for the next session): FlashInfer's sm90 paged
# prefill (FA3-style) beside ours on the issue 29 shapes, and its check
# against an fp32 reference (bench/cuda/bench_fi_prefill.cu,
# docs/cuda_kernels.md "FlashInfer's sm90 prefill beside ours"), then the
# same under compute-sanitizer; then the CUDA LoRA op's test
# (tests/gpu/test_cuda_lora.cu, issue 33, also under memcheck). Pack:
# .gpucarry/fi1.tar.xz (bench_fi_prefill built with flashinfer-python
# 0.7.4's headers at af0aa83, test_cuda_lora at 02fb063; 2.5 MB).
set -u
. bench/gpu_call_lib.sh
call_init cH
unpack ${PACK:-fi1}
gpu_name
timeout 240 build/gpu-pack/bench_fi_prefill > $R/fi_prefill.txt 2>&1; echo "bench_fi_prefill rc=$? at $(el)s"
tail -30 $R/fi_prefill.txt
save
timeout 200 compute-sanitizer --tool memcheck build/gpu-pack/bench_fi_prefill --check > $R/fi_memcheck.txt 2>&1
echo "memcheck rc=$? at $(el)s"; tail -4 $R/fi_memcheck.txt
save
timeout 120 build/gpu-pack/test_cuda_lora > $R/lora.txt 2>&1; echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 $R/lora.txt)"
grep -m8 FAIL $R/lora.txt
timeout 200 compute-sanitizer --tool memcheck build/gpu-pack/test_cuda_lora > $R/lora_memcheck.txt 2>&1
echo "test_cuda_lora memcheck rc=$? at $(el)s"; tail -3 $R/lora_memcheck.txt
save
echo "done at $(el)s"
