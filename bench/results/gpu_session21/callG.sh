#!/bin/bash
# Device call G (session 21, issue 29): the build with FlashInfer's fp8
# prefill the default for fp8 KV (after call F):
#   1. tests/gpu/run_gpu_tests.sh --skip-kernels (check 10: the runner with
#      an fp8 cache against the CPU with FlashInfer's fp8 kernel and ours,
#      check 3b's generate through it; W8A8 with the rms band);
#   2. bench_fi_prefill's timing with 32- and 64-token KV blocks (pages)
#      beside the 16 of call A: does the page gather cost FlashInfer its
#      gap to cuDNN (0.83-0.92x on 2 x 8,192, 8 x 4,096, 1 x 32,768)?
#   3. with the time left (issue 30, gpu_checklist 0f): served W4 with the
#      host KV tier copying every evicted block (--host-kv-offload all, the
#      default) against only reused ones (reused), llama3-8b-shape, dummy
#      bf16 weights.
# Pack: .gpucarry/s22.tar.xz (paged, test_cuda_runner, bench_fi_prefill, lib).
set -u
. bench/gpu_call_lib.sh
call_init cG
[ -x build/gpu-pack/paged ] || unpack s22
gpu_name
OUT=$R timeout 330 bash tests/gpu/run_gpu_tests.sh --skip-kernels > $R/run_gpu_tests.log 2>&1
echo "run_gpu_tests.sh --skip-kernels rc=$? at $(el)s: $(tail -1 $R/run_gpu_tests.log)"
grep -E "^FAIL|fp8 KV|flashinfer-prefill" $R/run_gpu_tests.log | cut -c1-200 | head -30
save
for bs in 16 32 64; do
    timeout 60 build/gpu-pack/bench_fi_prefill --no-check --quick --block-size $bs > $R/fi_bs$bs.log 2>&1
    echo "block size $bs rc=$?"; grep -E "^[0-9]+ x " $R/fi_bs$bs.log
done
save
P=$PWD/build/gpu-pack/paged
for pol in all reused; do
    [ $(el) -gt 330 ] && break
    serve_up $R/serve_w4_$pol.log --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json \
        --max-model-len 8192 --host-kv-offload $pol || continue
    w4 w4_$pol
    echo "W4 --host-kv-offload $pol rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$pol.txt)"
    grep -E "TTFT|TPOT" $R/w4_$pol.txt | head -2
    curl -s localhost:18400/metrics | grep -E "^paged:(kv_host_offloads|prefix_cache_host_hits)_total" | head -4
    serve_down
    save
done
echo "done at $(el)s"
