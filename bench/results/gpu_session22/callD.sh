#!/bin/bash
# Device call D (written in session 22 for a session with device time;
# issue 33's served figures): llama3-8b-shape, dummy bf16 weights, through
# HTTP (bench/bench_serve.py), one machine, one binary:
#   1. no LoRA: W1 through the server (one client, 3 x 128 in / 256 out:
#      TPOT) and served W4 at 100 clients (1,000 in / 256 out, 60 s);
#   2. 8 random rank-16 adapters on all seven projections (--max-loras 8):
#      W1 naming a0, W4 with the requests spread over a0-a7;
#   3. 64 of them (--max-loras 64): W4 spread over a0-a63.
# Targets (issue 33): W4 with adapters >= 0.85x without; W1 with one <= 1.1x.
# The adapters: tests/gpu/make_lora_adapters.py --many (one set of weights,
# hard-linked 64 times). Pack: .gpucarry/s24p.tar.xz (paged, lib).
set -u
. bench/gpu_call_lib.sh
call_init cD
[ -x build/gpu-pack/paged ] || unpack s24p
P=$PWD/build/gpu-pack/paged
gpu_name
L=/tmp/lora8b
mods=$(python3 tests/gpu/make_lora_adapters.py tests/gpu/llama3-8b-shape.json $L --many 64 2> $R/lora_make.txt)
[ -n "$mods" ] || { echo "adapters not written: $(cat $R/lora_make.txt)"; exit 1; }
set -- $mods
m8="${*:1:8}"
names8=$(echo $m8 | tr ' ' '\n' | cut -d= -f1 | paste -sd,)
names64=$(echo $mods | tr ' ' '\n' | cut -d= -f1 | paste -sd,)
LD="--device cuda --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json"
w1_http() { # NAME [--model M]
    local name=$1
    shift
    timeout 60 python3 bench/bench_serve.py --port 18400 --warmup 1 --seed 3 --concurrency 1 --num-prompts 3 \
        --input-len 128 --output-len 256 --progress-seconds 0 --out $R/$name.json "$@" > $R/$name.txt 2>&1
    echo "W1 HTTP $name rc=$? at $(el)s: $(grep -E "^ *TPOT" $R/$name.txt | head -1)"
    rm -f $R/$name.json.requests
}
for run in none lora8 lora64; do
    [ $(el) -gt 420 ] && { echo "stopped before $run at $(el)s"; break; }
    case $run in
    none) extra="" ;;
    lora8) extra="--enable-lora --max-loras 8 --max-lora-rank 16 --lora-modules $m8" ;;
    lora64) extra="--enable-lora --max-loras 64 --max-lora-rank 16 --lora-modules $mods" ;;
    esac
    # shellcheck disable=SC2086
    serve_up $R/serve_$run.log $LD $extra || continue
    case $run in
    none) w1_http w1_none ;;
    lora8) w1_http w1_lora --model a0 ;;
    esac
    models=""
    [ $run = lora8 ] && models="--model $names8"
    [ $run = lora64 ] && models="--model $names64"
    # shellcheck disable=SC2086
    w4 w4_$run --concurrency 100 $models
    echo "W4 100 clients $run rc=$? at $(el)s: $(grep -m1 'output' $R/w4_$run.txt)"
    grep -E '^ *(TTFT|TPOT)' $R/w4_$run.txt | head -2
    serve_down
    save
done
echo "done at $(el)s"
