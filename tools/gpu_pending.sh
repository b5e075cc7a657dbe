#!/usr/bin/env bash
# gpu_pending.sh — the short device call for code that was compiled but has not run on a GPU yet, in a minute or two;
# tools/gpu_check.sh is the whole GPU suite. Run after tools/gpu_carry.sh, on the device machine:
#     bash tools/gpu_pending.sh        (logs and bench JSONs under $OUT, or ./gpu-out)
# Pending at the end of stop 30: the softmax routing's rank with one comparison a j outside the warp's own stretch
# (same ranks: test_ops's routing checks), gate/up's first prestaged chunk requested before the routing, and the 30b
# decode figure against the previous call's (bench/results/cuda-h100/stop30/shapes/: 349.0 t/s).
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
B=.carry/bin
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 $B/test_ops cuda > "$out/ops.log" 2>&1; echo "test_ops cuda rc=$?"; grep "FAIL\|FATAL\|^ok" "$out/ops.log" | tail -8
[ "${QUICK:-0}" = 1 ] && exit 0
MOET_PERF_ONLY=moe timeout 150 $B/test_ops cuda --perf 2>&1 | grep "copy\|moe w2" | head -3
for r in 1 2; do
  timeout 100 $B/moet bench --synthetic qwen3-30b-a3b --device cuda -p 0 -n 128 --reps 3 \
    --json "$out/bench-30b-r$r.json" 2>&1 | grep "^| qwen"
done
