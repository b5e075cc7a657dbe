#!/usr/bin/env bash
# gpu_pending.sh — the short device call for code that was compiled but has not run on a GPU yet, in a minute or two;
# tools/gpu_check.sh is the whole GPU suite. Run after tools/gpu_carry.sh, on the device machine:
#     bash tools/gpu_pending.sh        (logs and bench JSONs under $OUT, or ./gpu-out)
# Pending at stop 30: k_attn_decode's cos/sin before its PDL wait (bit-identical by construction: test_ops's fused
# attention checks, graph vs eager, GLM's partial rotary against transformers), and the 30b decode figure beside the
# previous call's (bench/results/cuda-h100/stop30/final/).
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
B=.carry/bin
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 $B/test_ops cuda > "$out/ops.log" 2>&1; echo "test_ops cuda rc=$?"
grep "attn\|FAIL\|FATAL\|^ok" "$out/ops.log" | grep -v "nmse [0-9.e-]* (tol" | tail -8
timeout 60 $B/test_cuda models/moe-mini-a 2>&1 | tail -2
for fx in glm4moe-mini mixtral-mini moe-mini-b; do
  $B/test_logits tests/models/$fx tests/models/$fx/reference_fp32.safetensors 40 0 2>&1 | tail -2 | sed "s/^/$fx: /"
done
[ "${QUICK:-0}" = 1 ] && exit 0 # QUICK=1: the correctness checks only (a short device window)
for r in 1 2; do
  timeout 100 $B/moet bench --synthetic qwen3-30b-a3b --device cuda -p 0 -n 128 --reps 3 \
    --json "$out/bench-30b-r$r.json" 2>&1 | grep "^| qwen"
done
