#!/bin/bash
# Device call A (session 20, issue 29): FlashInfer's sm90 prefill as the
# runner's prefill kernel (PAGED_CUDA_PREFILL=flashinfer), one binary:
#   1. bench_fi_prefill --check under compute-sanitizer (the kernel on our
#      cache against an fp32 reference), then its timing (--quick);
#   2. test_cuda_runner against the CPU runner on the hd64 and hd128 models
#      of run_gpu_tests.sh, with our prefill and with FlashInfer's (the log
#      must say FlashInfer ran), and the FlashInfer run under memcheck;
#   3. time to first token of one long prompt (32,768 and 131,000 random
#      ids, max_tokens 1) on llama3-8b-shape, dummy bf16 weights, bf16 KV,
#      the default 2,048-token chunks: ours, then FlashInfer's.
# Pack: .gpucarry/s20.tar.xz (paged, test_cuda_runner, bench_fi_prefill, lib).
set -u
. bench/gpu_call_lib.sh
call_init cA
unpack ${PACK:-s20}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
gpu_name
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 120 $CS --tool memcheck $G/bench_fi_prefill --check > $R/fi_check_memcheck.log 2>&1
echo "bench_fi_prefill --check under memcheck rc=$? at $(el)s: $(grep -m1 '^check' $R/fi_check_memcheck.log | cut -c1-150) | $(grep -m1 'ERROR SUMMARY' $R/fi_check_memcheck.log)"
timeout 90 $G/bench_fi_prefill --quick > $R/fi_bench.log 2>&1
echo "bench_fi_prefill --quick rc=$? at $(el)s"; tail -6 $R/fi_bench.log
save
m64=/tmp/paged-m64 m128=/tmp/paged-m128
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
python3 tests/gpu/make_random_model.py $m128 --hidden 512 --heads 4 --kv-heads 1 --layers 3 --ffn 1024 \
    --vocab 1003 --dtype f32 --tie --seed 2 > /dev/null
for pf in ours flashinfer; do
    PAGED_CUDA_PREFILL=$pf timeout 60 $G/test_cuda_runner $m64 > $R/runner64_$pf.log 2>&1
    echo "runner hd64 $pf rc=$? fi_ran=$(grep -c 'FlashInfer prefill ran' $R/runner64_$pf.log) at $(el)s: $(tail -1 $R/runner64_$pf.log | cut -c1-220)"
    PAGED_CUDA_PREFILL=$pf timeout 60 $G/test_cuda_runner $m128 --tol 3e-2 > $R/runner128_$pf.log 2>&1
    echo "runner hd128 $pf rc=$? fi_ran=$(grep -c 'FlashInfer prefill ran' $R/runner128_$pf.log) at $(el)s: $(tail -1 $R/runner128_$pf.log | cut -c1-220)"
done
grep -m3 "FAIL\|error" $R/runner*_flashinfer.log | cut -c1-200
save
PAGED_CUDA_PREFILL=flashinfer timeout 150 $CS --tool memcheck $G/test_cuda_runner $m64 > $R/runner64_fi_memcheck.log 2>&1
echo "runner hd64 flashinfer under memcheck rc=$? at $(el)s: $(grep -m1 'ERROR SUMMARY' $R/runner64_fi_memcheck.log)"
save
python3 - <<'PY'
import json, random
r = random.Random(7)
for n in (32768, 131000):
    with open(f'/tmp/long_{n}.jsonl', 'w') as f:
        print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(n)], "max_tokens": 1,
                          "temperature": 0, "ignore_eos": True}), file=f)
PY
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 131072"
ttft() { python3 -c "
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l); print('ttft_ms', round(r.get('ttft_ms',-1),1), 'error' if 'error' in r else '')" "$1" 2>&1; }
for n in 32768 131000; do
    for pf in ours flashinfer; do
        [ $(el) -gt 500 ] && break
        PAGED_CUDA_PREFILL=$pf timeout 100 $P generate $LD --prompts-file /tmp/long_$n.jsonl > $R/long_${n}_$pf.out 2> $R/long_${n}_$pf.log
        echo "TTFT $n tokens, $pf: rc=$? at $(el)s: $(ttft $R/long_${n}_$pf.out) fi_ran=$(grep -c 'FlashInfer prefill ran' $R/long_${n}_$pf.log)"
        save
    done
done
echo "done at $(el)s"
