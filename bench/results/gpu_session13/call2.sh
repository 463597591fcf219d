#!/bin/bash
# Session 13, device call 2: every CUDA kernel case (test_cuda_kernels: the
# bf16 GEMV's code is now shared with the FP8 one, so its cases and the PDL
# chains must hold bit for bit); then end to end on an FP8 checkpoint of
# llama3-8b-shape, one binary: W1 (128 in / 256 out, TPOT) with qgemv.cu's
# GEMV (PAGED_CUDA_FP8_GEMV=0, what ran) against gemv.cu's FP8 GEMV (=1),
# alternating; then W1 with bf16 dummy weights, session 11's build (the
# last measured) against this one (bench/run_gpu_compare_builds.sh).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c2; mkdir -p $R build
for p in p2 p3 old; do tar -C build -xJf .gpucarry/$p.tar.xz || { echo "unpack $p failed"; exit 1; }; done
cp -r build/gpu-pack/lib build/old/lib
P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 220 build/gpu-pack/test_cuda_kernels > $R/kernels.log 2>&1
echo "test_cuda_kernels rc=$? at $(el)s: $(tail -1 $R/kernels.log)"
grep -E "^FAIL" $R/kernels.log | head -10 | cut -c1-200
timeout 150 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"
python3 - <<'PY' > /tmp/w1.jsonl
import json, random
r = random.Random(1)
print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(128)], "max_tokens": 256, "temperature": 0, "ignore_eos": True}))
PY
w1() { # NAME ENV...
    local name=$1; shift
    env "$@" timeout 60 $P generate --device cuda --model /tmp/fp8-8b --prompts-file /tmp/w1.jsonl > $R/w1_$name.out 2> $R/w1_$name.log
    echo "w1 fp8 $name rc=$? at $(el)s: $(python3 -c "
import json
r=json.loads(open('$R/w1_$name.out').readline())
print('tpot_ms', round(r.get('tpot_ms'),4), 'ttft_ms', round(r.get('ttft_ms'),2), 'tokens', r.get('completion_tokens'), 'text', r.get('text','')[:60])" 2>&1)"
}
for i in 1 2; do w1 qgemv$i PAGED_CUDA_FP8_GEMV=0; w1 gemv$i PAGED_CUDA_FP8_GEMV=1; done
OUT=$R/w1 OLD=$PWD/build/old/paged NEW=$P REPEAT=1 timeout 200 bash bench/run_gpu_compare_builds.sh w1 > $R/w1_bf16.log 2>&1
echo "w1 bf16 compare rc=$? at $(el)s"; tail -3 $R/w1_bf16.log
tar -C $OUT -czf $OUT/call2.tgz c2 && rm -rf $R
echo "done at $(el)s"
