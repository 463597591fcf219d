#!/bin/bash
# For the next session (written in session 20, not run): issue 29's step 2 on
# an H200, FlashInfer's prefill (PAGED_CUDA_PREFILL=flashinfer) against ours,
# one binary, in one call of about 8 minutes:
#   1. bench_fi_prefill (--check cases, then the kernel table) and torch's
#      SDPA on the same shapes (bench/cuda/sdpa_peer.py);
#   2. tests/gpu/run_gpu_tests.sh --skip-kernels (check 10: the runner with
#      FlashInfer's prefill on check 2's and check 9's models);
#   3. TTFT through HTTP, one client: 4,096 and 32,768 tokens (3 requests
#      each), 131,000 (1); targets 0.12 / 1.2 / 12 s;
#   4. served W4 (1,000 in / 256 out, 200 clients, 60 s), bf16 KV.
# If every check passes and FlashInfer wins every row, the next step makes
# it the default (backend_cuda.cu reads PAGED_CUDA_PREFILL).
# Pack: tools/pack_gpu.sh's paged, test_cuda_runner, bench_fi_prefill, lib
# as .gpucarry/s21.tar.xz (docs/gpu_checklist.md).
set -u
. bench/gpu_call_lib.sh
call_init cN
[ -x build/gpu-pack/paged ] || unpack ${PACK:-s21}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
gpu_name
timeout 200 $G/bench_fi_prefill > $R/fi_bench.log 2>&1
echo "bench_fi_prefill rc=$? at $(el)s"; grep -v "^$" $R/fi_bench.log | grep -v "^check .*ok$" | tail -8
timeout 120 python3 bench/cuda/sdpa_peer.py > $R/sdpa.log 2>&1
echo "sdpa_peer rc=$? at $(el)s"; cat $R/sdpa.log
save
OUT=$R timeout 300 bash tests/gpu/run_gpu_tests.sh --skip-kernels > $R/run_gpu_tests.log 2>&1
echo "run_gpu_tests.sh --skip-kernels rc=$? at $(el)s: $(tail -1 $R/run_gpu_tests.log)"
grep -E "^FAIL" $R/run_gpu_tests.log | cut -c1-200 | head
save
LD="--load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 131072"
for pf in ours flashinfer; do
    export PAGED_CUDA_PREFILL=$pf
    serve_up $R/serve_ttft_$pf.log $LD || continue
    for n in 4096:3 32768:3 131000:1; do
        len=${n%:*} cnt=${n#*:}
        timeout 100 python3 bench/bench_serve.py --port 18400 --warmup 0 --seed 5 --concurrency 1 \
            --num-prompts $cnt --input-len $len --output-len 1 --out $R/ttft_${len}_$pf.json \
            --progress-seconds 0 > $R/ttft_${len}_$pf.txt 2>&1
        echo "TTFT HTTP $len x $cnt, $pf at $(el)s: $(grep -E '^ TTFT ' $R/ttft_${len}_$pf.txt)"
        rm -f $R/ttft_${len}_$pf.json.requests
    done
    serve_down
    save
done
for pf in ours flashinfer; do
    [ $(el) -gt 420 ] && break
    export PAGED_CUDA_PREFILL=$pf
    serve_up $R/serve_w4_$pf.log --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 8192 ||
        continue
    w4 w4_$pf
    echo "W4 $pf rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$pf.txt)"
    serve_down
    save
done
echo "done at $(el)s"
