#!/usr/bin/env bash
# gpu_stop29.sh — stop 29's second device call: the new defaults (gpt-oss's tiled experts) through the op harness,
# GLM against transformers at its prompt length (routing in gate/up both ways), gpt-oss-20b tiled vs per-slot, and
# the 30b shape's pp512/tg128 as a record. Run after tools/gpu_carry.sh; logs and JSONs under $OUT.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
B=.carry/bin
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 $B/test_ops cuda > "$out/ops.log" 2>&1; echo "test_ops cuda rc=$?"
grep "gpt-oss\|FAIL\|FATAL\|^ok" "$out/ops.log"
timeout 60 $B/test_cuda models/moe-mini-a 2>&1 | tail -2
for g in 0 1; do
  MOET_ROUTE_GU=$g $B/test_logits tests/models/glm4moe-mini tests/models/glm4moe-mini/reference_fp32.safetensors 40 0 \
    2>&1 | tail -3 | sed "s/^/glm MOET_ROUTE_GU=$g: /"
done
for o in 1 0; do
  MOET_OSS_TC=$o timeout 80 $B/moet bench --synthetic gpt-oss-20b --device cuda -p 128 -n 64 --reps 2 -b 4 \
    --json "$out/bench-gpt-oss-20b-tc$o.json" 2>&1 | grep "^| gpt" | sed "s/^/MOET_OSS_TC=$o /"
done
timeout 120 $B/moet bench --synthetic qwen3-30b-a3b --device cuda -p 512 -n 128 --reps 3 \
  --json "$out/bench-qwen3-30b-a3b.json" 2>&1 | grep "^| qwen"
