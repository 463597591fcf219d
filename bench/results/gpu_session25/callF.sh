#!/bin/bash
# Device call F (session 25; issue 33's W4), cut to the budget's last 260 s:
# the register-tiled graph-safe LoRA kernels behind
# PAGED_CUDA_LORA_DEV_TILES=1 (the shrink 64 / max rank rows of one slot at
# once, the expand's t for 16 rows in one pass), then served W4 (llama3-8b
# shape, 8 rank-16 adapters, 100 clients, 30 s) with the eager steps
# through them (PAGED_LORA_DEV_EAGER=1 + tiles: dev) and as default (BGMV
# in eager steps: new), no W1 (the default kernels are call E's).
# Pack: .gpucarry/s34.tar.xz (paged, test_cuda_runner, test_cuda_lora, lib).
set -u
. bench/gpu_call_lib.sh
call_init cF
[ -x build/gpu-pack/paged ] || unpack s34
K=$PWD/build/gpu-pack
P=$K/paged
gpu_name
lora_checks "$K" 0
PAGED_LORA_DEV_EAGER=1 PAGED_CUDA_LORA_DEV_TILES=1 timeout 60 "$K/test_cuda_runner" /tmp/paged-m64 \
    --lora "$(ls -d /tmp/paged-m64-lora/* | paste -sd,)" > "$R/runner_lora_tiles.txt" 2>&1
echo "runner LoRA DEV_EAGER=1 DEV_TILES=1 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_tiles.txt" | cut -c1-200)"
save
mods=$(python3 tests/gpu/make_lora_adapters.py tests/gpu/llama3-8b-shape.json /tmp/lora8b --many 8 2> "$R/lora_make.txt")
names=$(echo "$mods" | tr ' ' '\n' | cut -d= -f1 | paste -sd,)
for run in dev new; do
    [ "$(el)" -gt 110 ] && { echo "stopped before $run at $(el)s"; break; }
    if [ $run = dev ]; then
        export PAGED_LORA_DEV_EAGER=1 PAGED_CUDA_LORA_DEV_TILES=1
    else
        unset PAGED_LORA_DEV_EAGER PAGED_CUDA_LORA_DEV_TILES
    fi
    # shellcheck disable=SC2086
    serve_up "$R/serve_$run.log" --device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json \
        --enable-lora --max-loras 8 --max-lora-rank 16 --lora-modules $mods || continue
    w4 "w4_$run" --concurrency 100 --model "$names" --max-seconds 30 --drain-seconds 10
    echo "W4 100 clients 30 s $run rc=$? at $(el)s: $(grep -m1 'output' "$R/w4_$run.txt")"
    grep -E '^ *(TTFT|TPOT)' "$R/w4_$run.txt" | head -2
    serve_down
    rm -f "$R"/*.json.requests
    save
done
echo "done at $(el)s"
