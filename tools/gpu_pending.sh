#!/usr/bin/env bash
# gpu_pending.sh — the short device call for code that was compiled but has not run on a GPU yet, in a minute or two;
# tools/gpu_check.sh is the whole GPU suite. Run after tools/gpu_carry.sh, on the device machine:
#     bash tools/gpu_pending.sh        (logs and bench JSONs under $OUT, or ./gpu-out)
# Pending at stop 30: down's inputs prestaged only where a down warp has several items (MOET_MOE_PRESTAGE_DN auto),
# test_ops's bit-for-bit checks of both prestages against each kernel staging its own, and the integer form without
# conversion instructions (bit-identical by construction; no switch: its effect is this call's figures against the
# previous call's, bench/results/cuda-h100/stop30/prestage/). (Earlier calls this stop:
# bench/results/cuda-h100/stop30/{i8,prestage,prestage-dn,checks}/.)
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
B=.carry/bin
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 $B/test_ops cuda > "$out/ops.log" 2>&1; echo "test_ops cuda rc=$?"
grep "FAIL\|FATAL\|^ok" "$out/ops.log" | tail -12
[ "${QUICK:-0}" = 1 ] && exit 0 # QUICK=1: the correctness checks only (a short device window)
MOET_PERF_ONLY=moe timeout 150 $B/test_ops cuda --perf > "$out/perf-moe.txt" 2>&1; echo "perf rc=$?"
grep "copy\|moe w2" "$out/perf-moe.txt" | head -9
for r in 1 2; do
  for p in 0 1; do
    MOET_MOE_PRESTAGE=$p timeout 100 $B/moet bench --synthetic qwen3-30b-a3b --device cuda -p 0 -n 128 --reps 3 \
      --json "$out/bench-30b-prestage$p-r$r.json" 2>&1 | grep "^| qwen" | sed "s/^/MOET_MOE_PRESTAGE=$p /"
  done
done
for d in 1 0; do
  MOET_MOE_PRESTAGE_DN=$d timeout 100 $B/moet bench --synthetic qwen3-235b-a22b --device cuda -p 0 -n 64 --reps 2 \
    --json "$out/bench-235b-dn$d.json" 2>&1 | grep "^| qwen" | sed "s/^/MOET_MOE_PRESTAGE_DN=$d /"
done
