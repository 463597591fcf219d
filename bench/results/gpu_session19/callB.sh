#!/bin/bash
# Device call B (session 19, issue 27): the figures the issue asks for, with
# the shape pick (PAGED_CUDA_FP8_CUTLASS=2: cuBLASLt + rescale below 256
# rows, CUTLASS c7/c8 with fast accumulation above) against cuBLASLt +
# rescale everywhere (=0), one binary, both set explicitly:
#   1. W2 1,000 x 1,000/1,000, FP8 checkpoint of llama3-8b-shape
#      (tests/gpu/make_fp8_model.py), fp8 KV: =0, then =2;
#   2. served W4 (1,000 in / 256 out, 200 clients, 60 s window, HTTP,
#      bench/bench_serve.py) with the same FP8 weights: =2, then =0 if time.
# Pack: .gpucarry/s19.tar.xz (tools/pack_gpu.sh at session 19's build).
set -u
. bench/gpu_call_lib.sh
call_init cB
unpack ${PACK:-s19}
P=$PWD/build/gpu-pack/paged
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
[ -f /tmp/fp8-8b/config.json ] || timeout 200 python3 tests/gpu/make_fp8_model.py tests/gpu/llama3-8b-shape.json \
    /tmp/fp8-8b > $R/make_fp8.log 2>&1
echo "fp8 checkpoint rc=$? at $(el)s"
write_prompts 128000
LD="--device cuda --model /tmp/fp8-8b"
for v in 0 2; do
    PAGED_CUDA_FP8_CUTLASS=$v timeout 150 $P generate $LD --kv-cache-dtype fp8 --max-num-seqs 512 \
        --prompts-file /tmp/w2.jsonl > $R/w2_$v.out 2> $R/w2_$v.log
    echo "W2 1000 FP8 weights fp8 KV, PAGED_CUDA_FP8_CUTLASS=$v rc=$? at $(el)s: $(summ $R/w2_$v.out)"
    rm -f $R/w2_$v.out
    save
done
w4() { # PAGED_CUDA_FP8_CUTLASS value
    PAGED_CUDA_FP8_CUTLASS=$1 $P serve --model /tmp/fp8-8b --port 18400 > $R/serve_w4_$1.log 2>&1 &
    local pid=$!
    for i in $(seq 1 900); do curl -sf localhost:18400/health > /dev/null && break; sleep 0.2; done
    echo "serve (=$1) up at $(el)s"
    timeout 110 python3 bench/bench_serve.py --port 18400 --input-len 1000 --output-len 256 --concurrency 200 \
        --num-prompts 1616 --warmup 0 --max-seconds 60 --drain-seconds 30 --seed 4 --out $R/w4_$1.json \
        --progress-seconds 0 > $R/w4_$1.txt 2>&1
    echo "W4 FP8 weights PAGED_CUDA_FP8_CUTLASS=$1 rc=$? at $(el)s"; head -8 $R/w4_$1.txt
    kill $pid; wait $pid
    rm -f $R/w4_$1.json.requests
    save
}
[ $(el) -lt 420 ] && w4 2
[ $(el) -lt 440 ] && w4 0
echo "done at $(el)s"
