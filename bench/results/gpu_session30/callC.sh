#!/bin/bash
# Device call C (session 30): session 29's callA (issue 30, copy ahead) and
# session 28's callB (issue 33, LoRA tiles + split) cut to fit one call,
# after four failed starts left 1,003 s of the 1,800 (about 520 s):
#   1. test_cuda_runner against the CPU with both swap paths
#      (PAGED_CUDA_SWAP=memcpy|kernel; step 14 copies B's block ahead on
#      its own stream, step 15 loads it back and reads it);
#   2. test_cuda_lora whole; the runner's LoRA check with tiles in the
#      graphs (PAGED_CUDA_LORA_TILES=1) and with the split eager steps;
#      bench_cuda_lora at 16, 92, 256 rows;
#   3. served W4 (llama3-8b-shape, dummy bf16 weights, 200 clients, 40 s
#      window): the host tier as today, then PAGED_KV_OFFLOAD_AHEAD=1;
#   4. served W1/W4 with 8 rank-16 adapters: tiles (16 rows), then the
#      default (a CTA a row).
# Pack: .gpucarry/s43.tar.xz (HEAD e958c1d with copy_ahead_gpu.patch
# applied: paged, test_cuda_runner, test_cuda_lora, bench_cuda_lora, lib).
set -u
. bench/gpu_call_lib.sh
call_begin cC "${PACK:-s43}"
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
for mode in memcpy kernel; do
    PAGED_CUDA_SWAP=$mode timeout 60 $K/test_cuda_runner $m64 > $R/runner_swap_$mode.log 2>&1
    echo "runner swap $mode rc=$? at $(el)s: $(tail -1 $R/runner_swap_$mode.log | cut -c1-200)"
done
timeout 90 "$K/test_cuda_lora" > "$R/lora_kernels.txt" 2>&1
echo "test_cuda_lora rc=$? at $(el)s: $(tail -1 "$R/lora_kernels.txt")"
grep -E "^FAIL" "$R/lora_kernels.txt" | head -8
dirs=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
for env in "PAGED_CUDA_LORA_TILES=1" "PAGED_CUDA_LORA_TILES=1 PAGED_LORA_SPLIT=1"; do
    tag=$(echo "$env" | tr -d ' =' | sed 's/PAGED_//g')
    env $env timeout 60 "$K/test_cuda_runner" $m64 --lora "$dirs" > "$R/runner_$tag.txt" 2>&1
    echo "runner LoRA $env rc=$? at $(el)s: $(tail -1 "$R/runner_$tag.txt" | cut -c1-200)"
done
save
timeout 40 "$K/bench_cuda_lora" --m 16,92,256 > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
grep -E "^(group|layer)" "$R/bench_lora.txt"
save
P=$K/paged
for run in tier ahead; do
    [ "$(el)" -gt "${W4_STOP:-300}" ] && { echo "stopped before W4 $run at $(el)s"; break; }
    if [ $run = ahead ]; then export PAGED_KV_OFFLOAD_AHEAD=1; else unset PAGED_KV_OFFLOAD_AHEAD; fi
    serve_up $R/serve_w4_$run.log --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json \
        --max-model-len 8192 || continue
    w4 w4_$run --max-seconds 40 --drain-seconds 20
    echo "W4 $run rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$run.txt)"
    grep -E "^ *(TTFT|TPOT)" $R/w4_$run.txt | head -2
    curl -s localhost:18400/metrics | grep -E "^paged:(kv_host_offloads|kv_host_offloads_ahead)_total" | head -2
    serve_down
    rm -f $R/*.json.requests
    save
done
unset PAGED_KV_OFFLOAD_AHEAD
LORA_STOP=${LORA_STOP:-440} lora_serve_runs "$K" 8 tiles new
echo "done at $(el)s"
