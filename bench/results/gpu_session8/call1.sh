#!/bin/bash
# Session 8, device call 1: every GPU check (kernels incl. qgemv/qgemm and
# move_blocks, runner incl. offload, both swap paths, FP8/int4 weights),
# then W1 bf16 against W1 with --cpu-offload-gb under a budget too small
# for the weights, and the offload's small W2.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=$OUT/c1; mkdir -p $R build
tar -C build -xJf .gpucarry/new.tar.xz || { echo "unpack failed"; exit 1; }
echo "unpacked at $(el)s"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv > $R/smi.txt
OUT=$R/gt timeout 300 bash tests/gpu/run_gpu_tests.sh > $R/gpu_tests.log 2>&1
echo "gpu_tests rc=$? at $(el)s"
sed -n '/^== summary/,$p' $R/gpu_tests.log | cut -c1-400
grep -E "^FAIL" $R/gpu_tests.log | head -20
grep -E "^(FAIL|fail) " $R/gpu_tests.log | head -30 | cut -c1-200
grep -E "qgemv|qgemm|move_blocks" $R/gpu_tests.log | head -60 | cut -c1-160
# FP8 weights go on to call 3's 8B run only when their kernels and the runner passed.
if grep -q "^ok   qgemv" $R/gpu_tests.log && ! grep -qE "^FAIL +q(gemv|gemm)" $R/gpu_tests.log &&
    grep -q "PASS: runner-hd64-fp8" $R/gpu_tests.log; then touch /tmp/qgemv_ok; echo "qgemv ok"; fi
P=build/gpu-pack/paged
CFG=tests/gpu/llama3-8b-shape.json
# W1 bf16 (reference) and W1 offloaded at a budget the weights do not fit.
if [ $(el) -lt 400 ]; then
  OUT=$R/w1 timeout 60 bash bench/run_gpu_bench.sh w1 > $R/w1.log 2>&1; echo "w1 rc=$? at $(el)s"; tail -4 $R/w1.log
fi
printf '#!/bin/sh\nexec %s "$@" --gpu-memory-utilization 0.10 --cpu-offload-gb 6 --max-model-len 8192\n' "$PWD/$P" > /tmp/paged-off
chmod +x /tmp/paged-off
if [ $(el) -lt 440 ]; then
  PAGED=/tmp/paged-off OUT=$R/w1off timeout 90 bash bench/run_gpu_bench.sh w1 > $R/w1off.log 2>&1; echo "w1off rc=$? at $(el)s"
  grep -E "offload|W1|KV cache on" $R/w1off.log | head; tail -4 $R/w1off.log
fi
if [ $(el) -lt 500 ]; then
  PAGED=/tmp/paged-off OUT=$R/w2off KV_DTYPE=fp8 W2_N=128 W2_LEN=128 W2_ARGS="--max-num-seqs 128" timeout 80 \
      bash bench/run_gpu_bench.sh w2 > $R/w2off.log 2>&1; echo "w2off rc=$? at $(el)s"; grep -E "offload" $R/w2off.log | head -3; tail -4 $R/w2off.log
fi
tar -C $OUT -czf $OUT/call1.tgz c1 && rm -rf $R
echo "done at $(el)s"
