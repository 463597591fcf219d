#!/bin/bash
# Device call D (session 19, issue 32): speculative decoding at a controlled
# acceptance on llama3-8b-shape (dummy weights): the replay draft
# (docs/speculative_decoding.md, "The replay draft") over a small random
# llama of the same vocabulary (4 layers, hidden 1,024), W1-shaped (1 x 128
# in / 256 out), k = 1, 2, 4, 8 at error rates 0 and 0.5, against plain
# decoding (bench/spec_replay.sh prints the table). Pack: .gpucarry/s19.
set -u
. bench/gpu_call_lib.sh
call_init cD
unpack ${PACK:-s19}
gpu_name
timeout 120 python3 tests/gpu/make_random_model.py /tmp/draft-128k --vocab 128256 --hidden 1024 --layers 4 \
    --heads 16 --kv-heads 4 --ffn 2816 > $R/make_draft.log 2>&1
echo "draft model rc=$? at $(el)s"
OUT=$R/spec timeout 420 bash bench/spec_replay.sh /tmp/draft-128k --device cuda --load-format dummy \
    --hf-config tests/gpu/llama3-8b-shape.json --max-model-len 2048 > $R/spec_replay.txt 2>&1
echo "spec_replay rc=$? at $(el)s"; tail -14 $R/spec_replay.txt
save
echo "done at $(el)s"
