#!/bin/bash
# Device call C (session 27; issue 33): the least that says whether the
# tiled LoRA op is right and faster, for a machine found with under five
# device minutes left: test_cuda_lora's graph cases in both shapes and one
# layer's LoRA at 16, 92 and 256 rows (call A is the full run).
set -u
. bench/gpu_call_lib.sh
call_init cC
[ -x build/gpu-pack/paged ] || unpack s39
K=$PWD/build/gpu-pack
gpu_name
timeout 80 "$K/test_cuda_lora" -k "lora graph" > "$R/lora_graph.txt" 2>&1
echo "test_cuda_lora -k 'lora graph' rc=$? at $(el)s: $(tail -1 "$R/lora_graph.txt")"
grep -E "^FAIL" "$R/lora_graph.txt" | cut -c1-220 | head -8
save
timeout 40 "$K/bench_cuda_lora" --m 16,92,256 > "$R/bench_lora.txt" 2>&1
echo "bench_cuda_lora rc=$? at $(el)s"
grep -E "^(group|layer)" "$R/bench_lora.txt"
save
echo "done at $(el)s"
