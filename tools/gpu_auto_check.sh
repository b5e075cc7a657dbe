#!/usr/bin/env bash
# gpu_auto_check.sh — the decode attention kernel the defaults pick (MOET_ATTN_SPLITK unset: by n_ctx and the cache
# type, attn_split.cu): moet bench tg32 of the 30b shape at depths 0, 4096, 16384 with f32 and f16 caches, JSONs
# in $OUT. Pack first: BINS=moet bash tools/gpu_carry.sh BUILD.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
for c in "0 f32" "4096 f32" "4096 f16" "16384 f32" "16384 f16"; do set -- $c
  echo "d $1 $2 (MOET_ATTN_SPLITK unset): $(timeout 60 .carry/bin/moet bench --synthetic qwen3-30b-a3b --device cuda --kv-type $2 -p 0 -n 32 -d $1 --reps 2 --json $out/auto-d$1-$2.json 2>/dev/null | tail -1)"
done
