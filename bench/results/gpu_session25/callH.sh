#!/bin/bash
# NOT RUN in session 25. Device call H (issue 31's W2 on any card): call
# B's W2 cut to fit an H100 and one call: 256 requests of 1,000 in / 1,000
# out (the first 256 of write_prompts' W2 set) for the Qwen3-30B-A3B shape
# with dummy bf16 weights, with the FP8 checkpoint written in the call, and
# the llama3-8b shape, each at 256 sequences; the issue's target: MoE W2
# >= 2x the dense 8B's of the same call. On an H100 the bf16 MoE shape
# leaves 5.7 GiB of KV (call B): its row measures what fits there.
# Pack: .gpucarry/s34.tar.xz (3a470c2's build: paged, lib, ...).
set -u
. bench/gpu_call_lib.sh
call_init cH
[ -x build/gpu-pack/paged ] || unpack s34
P=$PWD/build/gpu-pack/paged
gpu_name
write_prompts 128000 # ids valid in both vocabularies (Qwen3 151,936; Llama 3 128,256)
w2_prompts 256
t=$(date +%s)
python3 tests/gpu/make_fp8_model.py tests/gpu/qwen3-30b-a3b-shape.json /tmp/fp8-30b > "$R/make_fp8.txt" 2>&1
echo "FP8 checkpoint rc=$? in $(( $(date +%s) - t )) s"
save
for w in dense8b fp8 bf16; do
    [ "$(el)" -gt 400 ] && { echo "stopped before W2 $w at $(el)s"; break; }
    case $w in
    bf16) a="--device cuda --load-format dummy --hf-config tests/gpu/qwen3-30b-a3b-shape.json" ;;
    fp8) a="--device cuda --model /tmp/fp8-30b" ;;
    dense8b) a="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json" ;;
    esac
    # shellcheck disable=SC2086
    timeout 150 "$P" generate $a --max-num-seqs 256 --prompts-file /tmp/w2_256.jsonl > "$R/w2_$w.out" 2> "$R/w2_$w.log"
    echo "W2 256 x 1000/1000 $w rc=$? at $(el)s: $(summ "$R/w2_$w.out")"
    grep -E "KV cache on" "$R/w2_$w.log" | head -1 | cut -c1-160
    rm -f "$R/w2_$w.out"
    save
done
echo "done at $(el)s"
