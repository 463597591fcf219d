#!/bin/bash
# Device call A (session 28; issue 33): session 27's call A (never run: no
# machine) plus the split eager steps. .gpucarry/s41.tar.xz holds HEAD's
# programs and 3a51bb2's paged as paged_old. Checks: test_cuda_lora (its
# graph cases a CTA a row and in tiles), the runner's LoRA check with tiles
# in the graphs, in the eager steps, and in the eager steps' decode rows
# (PAGED_LORA_SPLIT=1); one layer's LoRA by batch size (bench_cuda_lora:
# dev = a CTA a row, tiles); then the served llama3-8b shape with 8 rank-16
# adapters: tiles from 16 rows, tiles + split, the default (a CTA a row),
# the base (no adapter named), as time allows.
set -u
. bench/gpu_call_lib.sh
call_begin cA "${PACK:-s41}"
lora_checks "$K"
save
timeout 100 "$K/bench_cuda_lora" --m 16,64,92,256,1024 > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
grep -E "^(group|layer)" "$R/bench_lora.txt"
save
LORA_STOP=${LORA_STOP:-420} lora_serve_runs "$K" 8 ${LORA_RUNS:-tiles split new base}
echo "done at $(el)s"
