#!/bin/bash
# Device call B (session 28; issue 33): call A cut to fit what failed starts
# left (about 450 s). test_cuda_lora whole (the graph cases a CTA a row and
# in tiles); the runner's LoRA check against the CPU with tiles in the
# graphs, in the eager steps' decode rows (split) and in whole eager steps;
# one layer's LoRA by batch size; served W1/W4 with 8 rank-16 adapters:
# tiles, tiles + split, the default (a CTA a row), the base (none named).
# The shortest cut (about 240 s, what the last device minutes allow):
#   LORA_STOP=130 LORA_RUNS="tiles new" BENCH_M=16,92,256 bash callB.sh
# and LORA_STOP=0 for the checks and the bench alone.
set -u
. bench/gpu_call_lib.sh
call_begin cB "${PACK:-s41}"
timeout 120 "$K/test_cuda_lora" > "$R/lora_kernels.txt" 2>&1
echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 "$R/lora_kernels.txt")"
grep -E "^FAIL" "$R/lora_kernels.txt" | head -12
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
dirs=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
for env in "PAGED_CUDA_LORA_TILES=1" "PAGED_CUDA_LORA_TILES=1 PAGED_LORA_SPLIT=1" \
    "PAGED_CUDA_LORA_TILES=1 PAGED_LORA_DEV_EAGER=1"; do
    tag=$(echo "$env" | tr -d ' =' | sed 's/PAGED_//g')
    env $env timeout 60 "$K/test_cuda_runner" $m64 --lora "$dirs" > "$R/runner_$tag.txt" 2>&1
    echo "runner LoRA $env rc=$? at $(el)s: $(tail -1 "$R/runner_$tag.txt" | cut -c1-220)"
done
save
timeout 60 "$K/bench_cuda_lora" --m "${BENCH_M:-16,92,256,1024}" > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
grep -E "^(group|layer)" "$R/bench_lora.txt"
save
LORA_STOP=${LORA_STOP:-330} lora_serve_runs "$K" 8 ${LORA_RUNS:-tiles split new base}
echo "done at $(el)s"
