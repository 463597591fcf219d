#!/bin/bash
# Session 11, device call 3 (issue 28's item 00, second half): W1 and W2 on
# llama3-8b-shape (bf16 dummy weights), the build of 7d36f37 (before the
# engine moved into rooms) against this session's build, alternating, in
# one call; then `paged serve` with no --device must put the KV cache on cuda.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c3; mkdir -p $R build
tar -C build -xJf .gpucarry/p2.tar.xz && tar -C build -xJf .gpucarry/old.tar.xz || { echo "unpack failed"; exit 1; }
cp -r build/gpu-pack/lib build/old/lib
NEW=$PWD/build/gpu-pack/paged OLD=$PWD/build/old/paged
# The runner with FP8 weights and the W8A8 product against the CPU (the
# logprob bound now follows --tol), then the same at bf16's bound with it off.
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 --vocab 1000 --dtype bf16 > /dev/null
timeout 60 build/gpu-pack/test_cuda_runner $m64 --quantization fp8 --tol 0.1 > $R/runner_w8a8.log 2>&1
echo "runner fp8 W8A8 --tol 0.1 rc=$?: $(tail -1 $R/runner_w8a8.log | cut -c1-250)"
PAGED_CUDA_FP8_GEMM=0 timeout 60 build/gpu-pack/test_cuda_runner $m64 --quantization fp8 > $R/runner_fp8_off.log 2>&1
echo "runner fp8 weight-only rc=$?: $(tail -1 $R/runner_fp8_off.log | cut -c1-250)"
OUT=$R/w1 OLD=$OLD NEW=$NEW REPEAT=2 timeout 240 bash bench/run_gpu_compare_builds.sh w1 > $R/w1.log 2>&1
echo "w1 compare rc=$? at $(el)s"; tail -3 $R/w1.log
OUT=$R/w2 OLD=$OLD NEW=$NEW REPEAT=1 timeout 260 bash bench/run_gpu_compare_builds.sh w2 > $R/w2.log 2>&1
echo "w2 compare rc=$? at $(el)s"; tail -3 $R/w2.log
$NEW serve --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --port 18300 > $R/serve_auto.log 2>&1 &
pid=$!
for i in $(seq 1 300); do curl -sf localhost:18300/health >/dev/null && break; sleep 0.2; done
curl -s localhost:18300/v1/completions -H 'content-type: application/json' -d '{"prompt":"hi","max_tokens":4}' | cut -c1-200; echo
kill $pid; wait $pid
echo "serve without --device at $(el)s: $(grep -h 'KV cache on' $R/serve_auto.log | head -1 | cut -c1-200)"
tar -C $OUT -czf $OUT/call3.tgz c3 && rm -rf $R
echo "done at $(el)s"
