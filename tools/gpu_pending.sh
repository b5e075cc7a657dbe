#!/usr/bin/env bash
# gpu_pending.sh — the short device call for code that was compiled but has not run on a GPU yet, in a minute or two;
# tools/gpu_check.sh is the whole GPU suite. Run after tools/gpu_carry.sh, on the device machine:
#     bash tools/gpu_pending.sh        (logs and bench JSONs under $OUT, or ./gpu-out)
# Stop 30's last call: the integer form and the prestaged inputs (on by default) against the f16 form on two other
# shapes than the ones they were measured on (GLM-4.5-Air: sigmoid router, shared expert, FFN 1408 in 128-column
# chunks; gpt-oss-20b: width 2880 in 64-column chunks, biases), and the final 30b figures. QUICK=1: the checks.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
B=.carry/bin
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${QUICK:-0}" = 1 ]; then
  timeout 150 $B/test_ops cuda > "$out/ops.log" 2>&1; echo "test_ops cuda rc=$?"; grep "FAIL\|FATAL\|^ok" "$out/ops.log" | tail -8
  exit 0
fi
for m in glm-4.5-air gpt-oss-20b; do
  for i8 in 1 0; do
    MOET_MOE_I8=$i8 timeout 90 $B/moet bench --synthetic $m --device cuda -p 0 -n 64 --reps 2 \
      --json "$out/bench-$m-i8$i8.json" 2>&1 | grep "^| [gq]" | sed "s/^/MOET_MOE_I8=$i8 /"
  done
done
timeout 120 $B/moet bench --synthetic qwen3-30b-a3b --device cuda -p 512 -n 128 --reps 3 \
  --json "$out/bench-qwen3-30b-a3b.json" 2>&1 | grep "^| qwen"
