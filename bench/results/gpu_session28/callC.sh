#!/bin/bash
# Device call C (session 28; issue 33): what the last device minutes allow
# after nine failed starts (about 240 s): test_cuda_lora whole, the
# runner's LoRA check with tiles, tiles + split and tiles in whole eager
# steps, one layer's LoRA by batch size, then served W1/W4 with 8 adapters
# for tiles against the default while time is left (LORA_STOP).
set -u
. bench/gpu_call_lib.sh
call_begin cC "${PACK:-s41}"
timeout 75 "$K/test_cuda_lora" > "$R/lora_kernels.txt" 2>&1
echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 "$R/lora_kernels.txt")"
grep -E "^FAIL" "$R/lora_kernels.txt" | head -12
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
dirs=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
for env in "PAGED_CUDA_LORA_TILES=1" "PAGED_CUDA_LORA_TILES=1 PAGED_LORA_SPLIT=1" \
    "PAGED_CUDA_LORA_TILES=1 PAGED_LORA_DEV_EAGER=1"; do
    tag=$(echo "$env" | tr -d ' =' | sed 's/PAGED_//g')
    env $env timeout 40 "$K/test_cuda_runner" $m64 --lora "$dirs" > "$R/runner_$tag.txt" 2>&1
    echo "runner LoRA $env rc=$? at $(el)s: $(tail -1 "$R/runner_$tag.txt" | cut -c1-220)"
done
save
timeout 30 "$K/bench_cuda_lora" --m 16,92,256 > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
grep -E "^(group|layer)" "$R/bench_lora.txt"
save
LORA_STOP=${LORA_STOP:-130} lora_serve_runs "$K" 8 ${LORA_RUNS:-tiles new}
echo "done at $(el)s"
