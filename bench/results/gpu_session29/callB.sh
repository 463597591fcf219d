#!/bin/bash
# Device call B (session 29, issue 30's soak; written, not run): served W4
# traffic (1,000 random token ids in, 256 out, ignore_eos) from 200
# closed-loop clients for 540 s (a call may run 600 s, so 9 minutes of the
# issue's 10), a third of them leaving early (streams after a few events,
# others right after sending), llama3-8b-shape dummy bf16 weights, the host
# KV tier on (the GPU default). bench/bench_soak.py samples the server's RSS,
# fds, KV and host KV blocks and /metrics' device memory (free, other) every
# 10 s; it exits 1 on a wrong or missing answer, a lost request, a dead
# server, or blocks still held (device or host) once the traffic stops.
# Pack: any pack with paged (e.g. .gpucarry/s41.tar.xz or s42).
set -u
. bench/gpu_call_lib.sh
call_begin cB "${PACK:-s41}"
S=${SOAK_S:-540} # SOAK_S: a shorter soak where less device time is left
timeout $((S + 50)) python3 bench/bench_soak.py --binary $K/paged --no-cpu-defaults --duration $S --clients 200 --disconnect 0.33 \
    --input-len 1000 --output-len 256 --vocab-size 128000 --interval 10 --out $R/soak_w4.json -- \
    --load-format dummy --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 8192 > $R/soak_w4.log 2>&1
echo "soak rc=$? at $(el)s"
tail -9 $R/soak_w4.log
cp /tmp/bench_soak_server.log $R/ 2>/dev/null
save
