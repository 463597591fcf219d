#!/bin/bash
# Device call E (session 25; issue 33): the build to land (tiles behind
# PAGED_CUDA_LORA_DEV_TILES=1, a CTA a row otherwise as in call A's
# build), then call D's profile, which found no machine:
#   1. test_cuda_lora (its graph cases again with tiles) and the LoRA
#      runner check;
#   2. W1 with and without an adapter, this build (new) and call A's
#      (old): call C's tiled build cost 0.13 ms a token at W1;
#   3. where served W4's time goes (PAGED_PROFILE_OPS=1, graphs on; each
#      run its own server, the table at exit): 8 rank-16 adapters named,
#      BGMV in eager steps (bgmv); naming no adapter (base); the tiled
#      graph-safe op in eager steps (dev: PAGED_LORA_DEV_EAGER=1
#      PAGED_CUDA_LORA_DEV_TILES=1).
# Packs: .gpucarry/s33.tar.xz (this build: paged, test_cuda_runner,
# test_cuda_lora, lib), .gpucarry/s31old.tar.xz (6eceb4a's paged).
set -u
. bench/gpu_call_lib.sh
call_init cE
[ -x build/gpu-pack/paged ] || unpack s33
[ -x build/gpu-pack/paged_old ] || unpack s31old
K=$PWD/build/gpu-pack
gpu_name
lora_checks "$K" 0
save
LORA_W4=0 lora_serve_runs "$K" 8 new old
P=$K/paged
mods=$(python3 tests/gpu/make_lora_adapters.py tests/gpu/llama3-8b-shape.json /tmp/lora8b --many 8 2> "$R/lora_make.txt")
names=$(echo "$mods" | tr ' ' '\n' | cut -d= -f1 | paste -sd,)
export PAGED_PROFILE_OPS=1
for run in bgmv base dev; do
    [ "$(el)" -gt 300 ] && { echo "stopped before $run at $(el)s"; break; }
    wm=(--model "$names")
    [ $run = base ] && wm=()
    if [ $run = dev ]; then
        export PAGED_LORA_DEV_EAGER=1 PAGED_CUDA_LORA_DEV_TILES=1
    else
        unset PAGED_LORA_DEV_EAGER PAGED_CUDA_LORA_DEV_TILES
    fi
    # shellcheck disable=SC2086
    serve_up "$R/prof_$run.log" --device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json \
        --enable-lora --max-loras 8 --max-lora-rank 16 --lora-modules $mods || continue
    w4 "w4prof_$run" --concurrency 100 "${wm[@]}" --max-seconds 30 --drain-seconds 15
    echo "W4 profiled $run rc=$? at $(el)s: $(grep -m1 'output' "$R/w4prof_$run.txt")"
    serve_down
    grep -A24 "op profile" "$R/prof_$run.log" | cut -c1-140
    rm -f "$R"/*.json.requests
    save
done
echo "done at $(el)s"
