#!/bin/bash
# Device call A (session 29, issue 30, gpu_checklist 0f): the host tier's
# copies ahead of eviction on a stream of their own beside the step
# (kv_swap_ahead / kv_swap_join: copy_ahead_gpu.patch beside this script,
# compiled in session 29 and never run), about 420 s:
#   1. test_cuda_runner against the CPU with both swap paths
#      (PAGED_CUDA_SWAP=memcpy|kernel): step 14 copies B's first block
#      ahead, step 15 loads it back into a fresh block and reads it;
#   2. served W4 (llama3-8b-shape, dummy bf16 weights, 200 clients, 60 s),
#      one binary: the tier as today (flag off: the main path), with
#      PAGED_KV_OFFLOAD_AHEAD=1, and --no-host-kv-cache (the copy's whole
#      cost), in that order; the metrics say how many copies went ahead.
# Pack: .gpucarry/s42.tar.xz (paged, test_cuda_runner, lib) built with the
# patch applied (git apply bench/results/gpu_session29/copy_ahead_gpu.patch):
# XZ_OPT="-0 -T1" sh tools/pack_gpu.sh, then from build/:
#   tar -cf - gpu-pack/{paged,test_cuda_runner,lib} | xz -T2 -6 > ../.gpucarry/s42.tar.xz
set -u
. bench/gpu_call_lib.sh
call_begin cA "${PACK:-s42}"
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
for mode in memcpy kernel; do
    PAGED_CUDA_SWAP=$mode timeout 90 $K/test_cuda_runner $m64 > $R/runner_swap_$mode.log 2>&1
    echo "runner swap $mode rc=$? at $(el)s: $(grep -E '^step 1[45]' $R/runner_swap_$mode.log | cut -c1-60 | tr '\n' ' ')"
    tail -2 $R/runner_swap_$mode.log
done
save
P=$K/paged
for run in tier ahead none; do
    [ $(el) -gt 440 ] && break
    args=(--load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 8192)
    [ $run = none ] && args+=(--no-host-kv-cache)
    if [ $run = ahead ]; then export PAGED_KV_OFFLOAD_AHEAD=1; else unset PAGED_KV_OFFLOAD_AHEAD; fi
    serve_up $R/serve_w4_$run.log "${args[@]}" || continue
    w4 w4_$run
    echo "W4 $run rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$run.txt)"
    grep -E "TTFT|TPOT" $R/w4_$run.txt | head -2
    curl -s localhost:18400/metrics | grep -E "^paged:(kv_host_offloads|kv_host_offloads_ahead|prefix_cache_host_hits)_total" | head -4
    serve_down
    save
done
unset PAGED_KV_OFFLOAD_AHEAD
echo "done at $(el)s"
