#!/bin/bash
# Session 16, device call B (issue 34): the attention change's regression
# check on the models that had no window. The kernels gained a window and a
# soft-cap (AttnParams, load_kv_tile's kv_begin, the masks), so:
#  1. test_cuda_kernels whole (every decode/prefill case as before, plus
#     the window cases) and the runner on run_gpu_tests.sh's check-2 models;
#  2. llama3-8b-shape W1 (128 in / 256 out) with session 15's paged and
#     this build, alternating twice, and W2 400 x 1000/1000 (fp8 KV, 512
#     sequences) with each.
set -u
. bench/gpu_call_lib.sh
call_init cB
unpack ${PACK:-n2}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged O=$PWD/build/gpu-pack/paged_old
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
m64=/tmp/paged-m64 m128=/tmp/paged-m128
python3 tests/gpu/make_random_model.py $m64 --hidden 512 --heads 8 --kv-heads 2 --layers 4 --ffn 1536 --vocab 1000 --dtype bf16 > /dev/null
python3 tests/gpu/make_random_model.py $m128 --hidden 512 --heads 4 --kv-heads 1 --layers 3 --ffn 1024 --vocab 1003 --dtype f32 --tie --seed 2 > /dev/null
timeout 120 $G/test_cuda_runner $m64 > $R/runner_m64.log 2>&1; echo "runner hd64 rc=$?: $(tail -1 $R/runner_m64.log | cut -c1-200)"
timeout 120 $G/test_cuda_runner $m128 --tol 3e-2 > $R/runner_m128.log 2>&1; echo "runner hd128 rc=$?: $(tail -1 $R/runner_m128.log | cut -c1-200)"
save
# Call A's one hard token mismatch (tiny Gemma 3, head_dim 128, sequence C
# with a repetition penalty, CPU top-2 gap 3.0): other seeds and variants,
# and a Llama model of the same shape for the bf16 error level.
M="--hidden 512 --layers 6 --ffn 1536 --vocab 1000 --heads 4 --kv-heads 1 --head-dim 128"
Gm="--gemma3 --untie --window 32"
for v in "s3:$Gm --attn-scalar 96 --rope-linear 8 --seed 3" "s4:$Gm --attn-scalar 96 --rope-linear 8 --seed 4" \
         "s5:$Gm --attn-scalar 96 --rope-linear 8 --seed 5" "plainrope:$Gm --seed 3" "w4096:$Gm --attn-scalar 96 --rope-linear 8 --seed 3 --window 4096" \
         "llama:--seed 3"; do
    tag=${v%%:*} fl=${v#*:}
    python3 tests/gpu/make_random_model.py /tmp/d_$tag $M $fl > /dev/null
    timeout 120 $G/test_cuda_runner /tmp/d_$tag > $R/diag_$tag.log 2>&1; rc=$?
    echo "runner $tag rc=$rc: $(tail -1 $R/diag_$tag.log | cut -c1-200)"
    grep -o "\[C: [^]]*\]" $R/diag_$tag.log | tr '\n' ' '; echo
done
save
write_prompts 128000
head -400 /tmp/w2.jsonl > /tmp/w2_400.jsonl
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
for i in 1 2; do
    for b in old new; do
        bin=$P; [ $b = old ] && bin=$O
        timeout 60 $bin generate $LD --prompts-file /tmp/w1.jsonl > $R/w1_${b}_$i.out 2> $R/w1_${b}_$i.log
        echo "llama3-8b W1 $b run $i: $(summ $R/w1_${b}_$i.out)"
    done
done
save
for b in old new; do
    bin=$P; [ $b = old ] && bin=$O
    timeout 150 $bin generate $LD --kv-cache-dtype fp8 --max-num-seqs 512 --prompts-file /tmp/w2_400.jsonl > $R/w2_$b.out 2> $R/w2_$b.log
    echo "llama3-8b W2 400 $b at $(el)s: $(summ $R/w2_$b.out)"
    save
done
left=$(( 560 - $(el) )); [ $left -gt 30 ] || left=30
timeout $left $G/test_cuda_kernels > $R/kernels.log 2>&1; echo "test_cuda_kernels rc=$? at $(el)s: $(tail -1 $R/kernels.log)"
grep -m8 FAIL $R/kernels.log
grep -c PASS $R/kernels.log
save
echo "done at $(el)s"
