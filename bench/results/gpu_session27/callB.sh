#!/bin/bash
# Device call B (session 27; issue 33): call A cut to what the session's
# last device minutes allow (ten machine starts failed). The pack
# and runs are call A's: test_cuda_lora's graph cases in both shapes, the
# runner's LoRA check with tiles in the graphs and the eager steps, one
# layer's LoRA by batch size, then served W1 and W4 (8 rank-16 adapters)
# with tiles from 16 rows against a CTA a row. With LORA_SERVE=0 it is the
# least that says whether the tiles are right and faster.
set -u
. bench/gpu_call_lib.sh
call_begin cB "${PACK:-s39}"
timeout 100 "$K/test_cuda_lora" -k "lora graph" > "$R/lora_graph.txt" 2>&1
echo "test_cuda_lora -k 'lora graph' rc=$? at $(el)s: $(tail -1 "$R/lora_graph.txt")"
grep -E "^FAIL" "$R/lora_graph.txt" | head -8
grep -E "tiles" "$R/lora_graph.txt" | cut -c1-200 | head -8
m64=/tmp/paged-m64
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 \
    --vocab 1000 --dtype bf16 > /dev/null
dirs=$(python3 tests/gpu/make_lora_adapters.py $m64 /tmp/paged-m64-lora)
PAGED_CUDA_LORA_TILES=1 PAGED_LORA_DEV_EAGER=1 timeout 90 "$K/test_cuda_runner" $m64 --lora "$dirs" \
    > "$R/runner_lora_tilesdev.txt" 2>&1
echo "runner LoRA TILES=1 DEV_EAGER=1 rc=$? at $(el)s: $(tail -1 "$R/runner_lora_tilesdev.txt" | cut -c1-220)"
save
timeout 60 "$K/bench_cuda_lora" --m 16,64,92,256 > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
grep -E "^(group|layer)" "$R/bench_lora.txt"
save
# LORA_SERVE=0: the checks and the bench alone (about 90 s).
[ "${LORA_SERVE:-1}" = 0 ] || LORA_STOP=${LORA_STOP:-200} lora_serve_runs "$K" 8 tiles new
echo "done at $(el)s"
