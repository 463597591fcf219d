#!/bin/bash
# Device call E (session 20, issue 29): FlashInfer's prefill with sliding
# windows and soft-capped scores (Mistral, Gemma 2/3), one binary:
#   1. bench_fi_prefill --check (the new window / soft-cap cases with the
#      earlier ones);
#   2. tests/gpu/run_gpu_tests.sh --skip-kernels (check 10: the runner with
#      FlashInfer's prefill on check 2's and check 9's Gemma models, and
#      Gemma 3's layer groups against one table with it);
#   3. time to first token of one 32,768-token prompt on the Gemma 3 27B
#      shape (dummy bf16 weights; 5 of 6 layers windowed at 1,024; KV layer
#      groups), ours then FlashInfer's.
# Pack: .gpucarry/s20.tar.xz (rebuilt with the window / soft-cap kernels).
set -u
. bench/gpu_call_lib.sh
call_init cE
[ -x build/gpu-pack/paged ] || unpack s20
G=build/gpu-pack P=$PWD/build/gpu-pack/paged
gpu_name
timeout 120 $G/bench_fi_prefill --check > $R/fi_check.log 2>&1
echo "bench_fi_prefill --check rc=$? at $(el)s"; grep "^check" $R/fi_check.log | cut -c1-140
save
OUT=$R timeout 300 bash tests/gpu/run_gpu_tests.sh --skip-kernels > $R/run_gpu_tests.log 2>&1
echo "run_gpu_tests.sh --skip-kernels rc=$? at $(el)s"
grep -E "^(FAIL|skipped)" $R/run_gpu_tests.log | cut -c1-200 | head -20
grep -E "^PASS: (runner with FlashInfer|.*FlashInfer)" $R/run_gpu_tests.log | cut -c1-200
tail -1 $R/run_gpu_tests.log
save
python3 - <<'PY'
import json, random
r = random.Random(7)
with open('/tmp/g27_32768.jsonl', 'w') as f:
    print(json.dumps({"prompt_ids": [r.randrange(0, 262000) for _ in range(32768)], "max_tokens": 1,
                      "temperature": 0, "ignore_eos": True}), file=f)
PY
GD="--device cuda --load-format dummy --hf-config tests/gpu/gemma3-27b-shape.json --max-model-len 40960"
for pf in ours flashinfer; do
    [ $(el) -gt 480 ] && break
    PAGED_CUDA_PREFILL=$pf timeout 120 $P generate $GD --prompts-file /tmp/g27_32768.jsonl > $R/g27_$pf.out 2> $R/g27_$pf.log
    echo "27B TTFT 32768, $pf: rc=$? at $(el)s: $(python3 -c "import json;r=json.loads(open('$R/g27_$pf.out').readline());print(round(r.get('ttft_ms',-1),1), r.get('output_ids'), r.get('error',''))") fi_ran=$(grep -c 'FlashInfer prefill ran' $R/g27_$pf.log)"
    sed -i 's/"prompt_ids":\[[^]]*\],//' $R/g27_$pf.out # (as run, with a space after the colon: it missed)
    save
done
echo "done at $(el)s"
