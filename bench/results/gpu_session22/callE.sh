#!/bin/bash
# Device call E (written in session 22 for a session with device time;
# issue 31 on the GPU): the Qwen3-30B-A3B shape (tests/gpu/
# qwen3-30b-a3b-shape.json: 128 experts of 768, top-8, 48 layers), one
# machine, one binary:
#   1. an FP8 checkpoint of the shape (tests/gpu/make_fp8_model.py: FP8
#      experts and linears with row scales, about 31 GB; its time printed);
#   2. W1 (1 x 128 in / 256 out) with dummy bf16 weights and with the FP8
#      checkpoint: TPOT against the active-weight read floor (3.3B active
#      parameters: 6.6 GB bf16, 3.3 GB + bf16 head and embeddings FP8);
#   3. W2 1,000 x 1,000/1,000 with each, and the llama3-8b-shape W2 of the
#      same call (the target: MoE W2 >= 2x the dense 8B's).
# Pack: .gpucarry/s24p.tar.xz (paged, lib).
set -u
. bench/gpu_call_lib.sh
call_init cE
[ -x build/gpu-pack/paged ] || unpack s24p
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
