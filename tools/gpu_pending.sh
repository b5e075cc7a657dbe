#!/usr/bin/env bash
# gpu_pending.sh — the short device call for code that was compiled but has not run on a GPU yet, in a minute or two;
# tools/gpu_check.sh is the whole GPU suite. Run after tools/gpu_carry.sh, on the device machine:
#     bash tools/gpu_pending.sh        (logs and bench JSONs under $OUT, or ./gpu-out)
# Pending at stop 30: the decode kernels' integer form (quant/tile.h, MOET_MOE_I8=1): the op harness against float64
# with it on (the fused block's bit-for-bit A/B off: it keeps the f16 form), its op time beside the f16 form's, and
# 30b decode A/B in one binary, alternating. (Stop 29's pending list ran at stop 30: bench/results/cuda-h100/stop30/.)
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
B=.carry/bin
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
MOET_MOE_I8=1 MOET_MOE_FUSED=0 timeout 150 $B/test_ops cuda > "$out/ops-i8.log" 2>&1; echo "test_ops cuda (I8=1) rc=$?"
grep "cuda  moe .*w2 \(decode\|all\|n=\)\|FAIL\|FATAL\|^ok" "$out/ops-i8.log" | tail -30
[ "${QUICK:-0}" = 1 ] && exit 0 # QUICK=1: the correctness checks only (a short device window)
MOET_PERF_ONLY=moe timeout 150 $B/test_ops cuda --perf > "$out/perf-moe.txt" 2>&1; echo "perf rc=$?"
grep "copy\|moe w2" "$out/perf-moe.txt"
for r in 1 2; do
  for i8 in 0 1; do
    MOET_MOE_I8=$i8 timeout 100 $B/moet bench --synthetic qwen3-30b-a3b --device cuda -p 0 -n 128 --reps 3 \
      --json "$out/bench-30b-i8$i8-r$r.json" 2>&1 | grep "^| qwen" | sed "s/^/MOET_MOE_I8=$i8 /"
  done
done
