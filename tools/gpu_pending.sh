#!/usr/bin/env bash
# gpu_pending.sh — the short device call for code that was compiled but has not run on a GPU yet, in a minute or two;
# tools/gpu_check.sh is the whole GPU suite. Run after tools/gpu_carry.sh, on the device machine:
#     bash tools/gpu_pending.sh        (logs and bench JSONs under $OUT, or ./gpu-out)
# Pending at the end of stop 29: gpt-oss's W2 experts tiled by default (the kernels passed under MOET_OSS_TC=1 on an
# H100), MOET_PDL_EARLY's removal (an off-by-default path), GLM against transformers at its prompt length with the
# store folds, and gpt-oss-20b tiled vs per-slot once more. (Stop 28's pending list ran at stop 29:
# bench/results/cuda-h100/stop29/.)
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
B=.carry/bin
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
# the op harness (gpt-oss's W2 block tiled and per-slot, the bias stores, mla_attn with MOET_MLA_LATENT=1)
MOET_MLA_LATENT=1 timeout 150 $B/test_ops cuda > "$out/ops.log" 2>&1; echo "test_ops cuda rc=$?"
grep "gpt-oss\|bias\|mla\|FAIL\|FATAL\|^ok" "$out/ops.log"
# graph replay bit-identical, CUDA vs CPU
timeout 60 $B/test_cuda models/moe-mini-a 2>&1 | tail -2
# the architectures against transformers on CUDA, at the prompt lengths tests/CMakeLists.txt gives them; GLM and
# DeepSeek with the sigmoid router routing in gate/up too (MOET_ROUTE_GU=1)
for fx in deepseek-mini gpt-oss-mini glm4moe-mini; do
  p=24; [ $fx = glm4moe-mini ] && p=40
  $B/test_logits tests/models/$fx tests/models/$fx/reference_fp32.safetensors $p 0 2>&1 | tail -3 | sed "s/^/$fx: /"
  [ $fx = gpt-oss-mini ] && continue
  MOET_ROUTE_GU=1 $B/test_logits tests/models/$fx tests/models/$fx/reference_fp32.safetensors $p 0 2>&1 | tail -1 |
    sed "s/^/$fx MOET_ROUTE_GU=1: /"
done
[ "${QUICK:-0}" = 1 ] && exit 0 # QUICK=1: the correctness checks only (a short device window)
for o in 1 0; do
  MOET_OSS_TC=$o timeout 80 $B/moet bench --synthetic gpt-oss-20b --device cuda -p 128 -n 64 --reps 2 -b 4 \
    --json "$out/bench-gpt-oss-20b-tc$o.json" 2>&1 | grep "^| gpt" | sed "s/^/MOET_OSS_TC=$o /"
done
timeout 120 $B/moet bench --synthetic qwen3-30b-a3b --device cuda -p 512 -n 128 --reps 3 \
  --json "$out/bench-qwen3-30b-a3b.json" 2>&1 | grep "^| qwen"
