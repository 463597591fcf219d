#!/bin/bash
# Device call K (session 26; issue 33): the landed build's served figures
# with a base run beside them (call J had none). .gpucarry/s38.tar.xz is
# call J's build, where PAGED_CUDA_LORA_EXPAND_COLS=2 (the cols2 run) is
# what HEAD runs by default. Served llama3-8b shape, 8 rank-16 adapters:
# W1 with and without an adapter, W4 100 clients 30 s, with the adapters
# (cols2) and naming none (base).
set -u
. bench/gpu_call_lib.sh
call_init cK
[ -x build/gpu-pack/paged ] || unpack s38
K=$PWD/build/gpu-pack
gpu_name
lora_serve_runs "$K" 8 cols2 base
echo "done at $(el)s"
