#!/bin/bash
# Device call D (session 21): the W8A8 runner checks call A failed (c7: one
# greedy flip at a CPU top-2 gap of 0.382, over the 0.2 that counts) with
# FlashInfer's prefill and with paged's, the default shape pick and c7,
# each flip printed with its rms band (test_cuda_runner --gap-sigmas 4).
# Packs: .gpucarry/s21.tar.xz, s21r.tar.xz (that test_cuda_runner).
set -u
. bench/gpu_call_lib.sh
call_init cD
[ -x build/gpu-pack/paged ] || unpack s21
gpu_name
unpack s21r
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
for pf in flashinfer paged; do
    for cfg in pick c7; do
        e=""; [ $cfg = c7 ] && e="PAGED_CUDA_FP8_CUTLASS=1 PAGED_CUDA_FP8_CUTLASS_CFG=7"
        env $e PAGED_CUDA_PREFILL=$pf build/gpu-pack/test_cuda_runner $m64 --quantization fp8 --tol 0.1 --gap 0.2 \
            --gap-sigmas 4 > $R/w8a8_${cfg}_$pf.log 2>&1
        echo "W8A8 runner $cfg, $pf prefill: rc=$? $(tail -1 $R/w8a8_${cfg}_$pf.log | cut -c1-150)"
        grep -o "\[[A-F]: cpu [^]]*\]" $R/w8a8_${cfg}_$pf.log | tr '\n' ' '; echo
    done
done
save
echo "done at $(el)s"
