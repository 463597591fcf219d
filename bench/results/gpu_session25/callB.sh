#!/bin/bash
# Device call B (session 25; issue 31): session 22's call E
# (bench/results/gpu_session22/callE.sh) on the current build: the
# Qwen3-30B-A3B shape (128 experts of 768, top-8, 48 layers), W1 with dummy
# bf16 weights and an FP8 checkpoint written in the call
# (tests/gpu/make_fp8_model.py), W2 1,000 x 1,000/1,000 with each and the
# llama3-8b shape W2 of the same call (the target: MoE W2 >= 2x dense 8B).
# Pack: .gpucarry/s31.tar.xz (paged, lib; left unpacked by call A).
set -u
. bench/gpu_call_lib.sh
call_init cB
[ -x build/gpu-pack/paged ] || unpack s31
P=$PWD/build/gpu-pack/paged
gpu_name
write_prompts 128000 # ids valid in both vocabularies (Qwen3 151,936; Llama 3 128,256)
df -h /tmp | tail -1
t=$(date +%s)
python3 tests/gpu/make_fp8_model.py tests/gpu/qwen3-30b-a3b-shape.json /tmp/fp8-30b > $R/make_fp8.txt 2>&1
echo "FP8 checkpoint rc=$? in $(( $(date +%s) - t )) s: $(du -sh /tmp/fp8-30b | cut -f1)"
save
BF="--device cuda --load-format dummy --hf-config tests/gpu/qwen3-30b-a3b-shape.json"
F8="--device cuda --model /tmp/fp8-30b"
for w in bf16 fp8; do
    a=$BF; [ $w = fp8 ] && a=$F8
    # shellcheck disable=SC2086
    timeout 120 $P generate $a --prompts-file /tmp/w1.jsonl > $R/w1_$w.out 2> $R/w1_$w.log
    echo "MoE W1 $w rc=$? at $(el)s: $(summ $R/w1_$w.out)"
    grep -iE "experts|mixture|weights" $R/w1_$w.log | head -3
    save
done
for w in bf16 fp8 dense8b; do
    [ $(el) -gt 380 ] && { echo "stopped before W2 $w at $(el)s"; break; }
    case $w in
    bf16) a=$BF ;;
    fp8) a=$F8 ;;
    dense8b) a="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json" ;;
    esac
    # shellcheck disable=SC2086
    timeout 200 $P generate $a --max-num-seqs 512 --prompts-file /tmp/w2.jsonl > $R/w2_$w.out 2> $R/w2_$w.log
    echo "W2 $w rc=$? at $(el)s: $(summ $R/w2_$w.out)"
    rm -f $R/w2_$w.out
    save
done
echo "done at $(el)s"
