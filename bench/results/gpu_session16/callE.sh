#!/bin/bash
# Session 16, device call E: call D again after the WC template flag (the plain
# instantiations of every attention kernel are the code before windows) against session
# 15's kernels, same machine: bench_cuda_attention --quick (decode v2/v4,
# prefill) alternating twice, then llama3-8b-shape W2 400 x 1000/1000 (fp8 KV,
# 512 sequences) with session 15's paged and this build, alternating.
set -u
. bench/gpu_call_lib.sh
call_init cE
unpack ${PACK:-n5}
G=build/gpu-pack P=$PWD/build/gpu-pack/paged O=$PWD/build/gpu-pack/paged_old
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
for k in cap=2 "decode fp8 edges"; do
    timeout 90 $G/test_cuda_kernels -k "$k" > "$R/kernels_$k.log" 2>&1; echo "test_cuda_kernels -k '$k' rc=$? at $(el)s: $(tail -1 "$R/kernels_$k.log")"
    grep -m3 FAIL "$R/kernels_$k.log"
done
save
for i in 1 2; do
    for b in new old; do
        bin=$G/bench_cuda_attention; [ $b = old ] && bin=$G/bench_cuda_attention_old
        timeout 100 $bin --quick --json $R/attn_${b}_$i.json > $R/attn_${b}_$i.log 2>&1
        echo "bench_cuda_attention --quick $b run $i rc=$? at $(el)s"
    done
    save
done
python3 - $R <<'PY'
import json, sys, glob, os
R = sys.argv[1]
def load(b, i):
    try: return json.load(open(f"{R}/attn_{b}_{i}.json"))
    except Exception as e: return None
for i in (1, 2):
    n, o = load('new', i), load('old', i)
    print('run', i, 'new keys', list(n.keys())[:6] if isinstance(n, dict) else type(n), 'old', 'ok' if o else 'missing')
PY
for b in new old; do grep -E "^\|" $R/attn_${b}_1.log | head -40 > $R/attn_${b}_1.table; done
paste -d'#' $R/attn_new_1.table $R/attn_old_1.table | head -40
write_prompts 128000
head -400 /tmp/w2.jsonl > /tmp/w2_400.jsonl
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
for b in new old; do
    bin=$P; [ $b = old ] && bin=$O
    [ $(el) -gt 120 ] && break
    timeout 90 $bin generate $LD --kv-cache-dtype fp8 --max-num-seqs 512 --prompts-file /tmp/w2_400.jsonl > $R/w2_$b.out 2> $R/w2_$b.log
    echo "llama3-8b W2 400 $b at $(el)s: $(summ $R/w2_$b.out)"
    save
done
echo "done at $(el)s"
