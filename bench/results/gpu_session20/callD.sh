#!/bin/bash
# Device call D (session 20): tests/gpu/run_gpu_tests.sh --skip-kernels on
# this build (runner checks, generate cpu/cuda, async, fp8 KV, serve,
# watchdog, -tp 1 NCCL, Gemma, and check 10: the runner with FlashInfer's
# prefill), then TTFT of one 32,768-token prompt with FlashInfer's prefill
# at 2,048 (the default) and 8,192 tokens a step (paged generate).
# Pack: .gpucarry/s20.tar.xz.
set -u
. bench/gpu_call_lib.sh
call_init cD
[ -x build/gpu-pack/paged ] || unpack s20
P=$PWD/build/gpu-pack/paged
gpu_name
OUT=$R timeout 380 bash tests/gpu/run_gpu_tests.sh --skip-kernels > $R/run_gpu_tests.log 2>&1
echo "run_gpu_tests.sh --skip-kernels rc=$? at $(el)s"
grep -E "^(PASS|FAIL|skipped)" $R/run_gpu_tests.log | cut -c1-160 | head -70
sed -n '/== summary/,$p' $R/run_gpu_tests.log | cut -c1-200
save
python3 - <<'PY'
import json, random
r = random.Random(7)
with open('/tmp/long_32768.jsonl', 'w') as f:
    print(json.dumps({"prompt_ids": [r.randrange(0, 128000) for _ in range(32768)], "max_tokens": 1,
                      "temperature": 0, "ignore_eos": True}), file=f)
PY
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 32768"
for bt in 2048 8192; do
    for pf in ours flashinfer; do
        [ $(el) -gt 540 ] && break
        PAGED_CUDA_PREFILL=$pf timeout 40 $P generate $LD --max-num-batched-tokens $bt --prompts-file /tmp/long_32768.jsonl \
            > $R/long_${bt}_$pf.out 2> $R/long_${bt}_$pf.log
        echo "TTFT 32768, $bt a step, $pf: rc=$? $(python3 -c "import json;r=json.loads(open('$R/long_${bt}_$pf.out').readline());print(round(r.get('ttft_ms',-1),1), r.get('output_ids'))")"
    done
done
save
echo "done at $(el)s"
