# The two inline device calls of session 20 (the device tool's command line,
# run in the repository root with the s20 pack carried), for the record.

# cA2: FlashInfer's --check plainly (twice), under memcheck, racecheck and
# synccheck, and the hd128 runner test with it under memcheck.
set -u; . bench/gpu_call_lib.sh; call_init cA2; [ -x build/gpu-pack/paged ] || unpack s20; G=build/gpu-pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for i in 1 2; do $G/bench_fi_prefill --check 2>&1 | tail -1; done
timeout 100 $CS --tool memcheck $G/bench_fi_prefill --check 2>&1 | grep -m2 "^check\|ERROR SUMM"
timeout 100 $CS --tool racecheck $G/bench_fi_prefill --check > $R/race.log 2>&1
timeout 100 $CS --tool synccheck $G/bench_fi_prefill --check 2>&1 | grep -m3 "^check\|SUMM"
m128=/tmp/paged-m128
python3 tests/gpu/make_random_model.py $m128 --hidden 512 --heads 4 --kv-heads 1 --layers 3 --ffn 1024 --vocab 1003 \
    --dtype f32 --tie --seed 2 > /dev/null
PAGED_CUDA_PREFILL=flashinfer timeout 150 $CS --tool memcheck $G/test_cuda_runner $m128 --tol 3e-2 > $R/r128mc.log 2>&1
save
# (cA2 ran the bench as it was at commit 5736dab: one check case, its own
# copy of FlashInfer's parameters; the later bench goes through the library.)

# cD2: TTFT of one 32,768-token prompt at 2,048, 8,192 and 16,384 tokens a
# step, ours and FlashInfer's (--max-model-len 40960: callD.sh's 32768 left
# no room for the output token).
set -u; . bench/gpu_call_lib.sh; call_init cD2; [ -x build/gpu-pack/paged ] || unpack s20; P=$PWD/build/gpu-pack/paged
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 40960"
for bt in 2048 8192 16384; do for pf in ours flashinfer; do
    PAGED_CUDA_PREFILL=$pf timeout 40 $P generate $LD --max-num-batched-tokens $bt --prompts-file /tmp/long_32768.jsonl \
        > $R/long_${bt}_$pf.out 2> $R/long_${bt}_$pf.log
done; done
save
