#!/bin/bash
# Device call A (written in session 17, whose device loans were paused; for
# the next session): session 16's unmeasured call E (the WC template
# flag's plain kernels against session 15's, same machine: kernel test cases,
# bench_cuda_attention --quick new/old, llama3-8b-shape W2 400 x 1000/1000 fp8 KV
# new/old), then the W1 baseline with FP8 weights (--quantization fp8 at load,
# dummy weights) under GEMV kinds 2 (the default) and 1, alternating.
set -u
. bench/gpu_call_lib.sh
call_init cA
unpack ${PACK:-n5}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged O=$PWD/build/gpu-pack/paged_old
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
for k in cap=2 "decode fp8 edges"; do
    timeout 60 $G/test_cuda_kernels -k "$k" > "$R/kernels_$k.log" 2>&1; echo "test_cuda_kernels -k '$k' rc=$? at $(el)s: $(tail -1 "$R/kernels_$k.log")"
    grep -m3 FAIL "$R/kernels_$k.log"
done
save
for i in 1 2; do
    [ $(el) -gt 200 ] && break
    for b in new old; do
        bin=$G/bench_cuda_attention; [ $b = old ] && bin=$G/bench_cuda_attention_old
        timeout 80 $bin --quick --json $R/attn_${b}_$i.json > $R/attn_${b}_$i.log 2>&1
        echo "bench_cuda_attention --quick $b run $i rc=$? at $(el)s"
    done
    save
done
for b in new old; do grep -E "^\|" $R/attn_${b}_1.log | head -40 > $R/attn_${b}_1.table; done
paste -d'#' $R/attn_new_1.table $R/attn_old_1.table | head -30
write_prompts 128000
head -400 /tmp/w2.jsonl > /tmp/w2_400.jsonl
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
for b in new old; do
    bin=$P; [ $b = old ] && bin=$O
    [ $(el) -gt 330 ] && break
    timeout 90 $bin generate $LD --kv-cache-dtype fp8 --max-num-seqs 512 --prompts-file /tmp/w2_400.jsonl > $R/w2_$b.out 2> $R/w2_$b.log
    echo "llama3-8b W2 400 $b at $(el)s: $(summ $R/w2_$b.out)"
    save
done
for i in 1 2; do
    for kind in 2 1; do
        [ $(el) -gt 520 ] && break
        PAGED_CUDA_GEMV_KERNEL=$kind timeout 60 $P generate $LD --quantization fp8 --prompts-file /tmp/w1.jsonl > $R/w1_fp8_k${kind}_$i.out 2> $R/w1_fp8_k${kind}_$i.log
        echo "W1 fp8 weights gemv kind $kind run $i rc=$? at $(el)s: $(summ $R/w1_fp8_k${kind}_$i.out)"
        save
    done
done
echo "done at $(el)s"
