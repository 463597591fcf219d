#!/bin/bash
# Device call C (session 22): the old build (session 21's at 9e5e386, pack s22's paged)
# against this one on llama3-8b-shape (head_dim 128: the kernels there did
# not change, only the head_dim dispatch around them), one machine:
#   1. W1 (1 x 128 in / 256 out), old new old new;
#   2. time to first token of one 32,768-token prompt (generate), old new
#      old new;
#   3. the Gemma 3 12B shape with the old build: its refusal of head_dim 256
#      (and the new one's without PAGED_CUDA_HD256=1).
# Packs: .gpucarry/s24p.tar.xz (paged, lib), .gpucarry/s22p.tar.xz (build/old).
set -u
. bench/gpu_call_lib.sh
call_init cC
[ -x build/gpu-pack/paged ] || unpack s24p
[ -x build/old/gpu-pack/paged ] || { mkdir -p build/old && unpack s22p build/old; }
[ -e build/old/gpu-pack/lib ] || ln -s $PWD/build/gpu-pack/lib build/old/gpu-pack/lib
NEW=$PWD/build/gpu-pack/paged OLD=$PWD/build/old/gpu-pack/paged
gpu_name
write_prompts 128000
long_prompt 32768 128000
D="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
for b in old new old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    timeout 60 $bin generate $D --prompts-file /tmp/w1.jsonl > $R/w1_$b.out 2> $R/w1_$b.log
    echo "W1 $b rc=$? at $(el)s: $(summ $R/w1_$b.out)"
done
save
for b in old new old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    timeout 60 $bin generate $D --max-model-len 40000 --prompts-file /tmp/long_32768.jsonl > $R/ttft_$b.out 2> $R/ttft_$b.log
    echo "TTFT 32k $b rc=$? at $(el)s: $(ttft $R/ttft_$b.out)"
done
save
timeout 60 $OLD generate --device cuda --load-format dummy --hf-config tests/gpu/gemma3-12b-shape.json \
    --prompts-file /tmp/w1.jsonl > $R/old_12b.out 2> $R/old_12b.log
echo "old build on the 12B shape rc=$?: $(grep -iE 'error|head_dim' $R/old_12b.log | head -2)"
timeout 60 $NEW generate --device cuda --load-format dummy --hf-config tests/gpu/gemma3-12b-shape.json \
    --prompts-file /tmp/w1.jsonl > $R/new_12b.out 2> $R/new_12b.log
echo "new build on the 12B shape without PAGED_CUDA_HD256 rc=$?: $(grep -iE 'error|head_dim' $R/new_12b.log | head -2)"
save
echo "done at $(el)s"
