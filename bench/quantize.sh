#!/usr/bin/env bash
# quantize.sh — wall time of `moet quantize` (calibration + quantization + writing) for one model, as JSON with
# commit, machine and date in bench/results/quantize-<model>.json.
#   usage: bench/quantize.sh HF_DIR [FORMAT]     env: MOET (build/moet), CALIB_TOKENS (16384)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=$1; FMT=${2:-w2}; MOET=${MOET:-build/moet}; CT=${CALIB_TOKENS:-16384}
NAME=$(basename "$MODEL")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(set +o pipefail; xz -dc ../shared/data/train.txt.xz | head -c 300000 > "$work/calib.txt")
commit=$(git describe --always --dirty --abbrev=12)
t0=$(date +%s.%N)
"$MOET" quantize -m "$MODEL" -o "$work/out.gguf" --experts "$FMT" --calib "$work/calib.txt" --calib-tokens "$CT" 2>"$work/log"
t1=$(date +%s.%N)
size=$(stat -c %s "$work/out.gguf")
printf '{"tool": "bench/quantize.sh", "commit": "%s", "date": "%s", "machine": "%s", "model": "%s", "format": "%s", "calib_tokens": %s, "seconds": %.2f, "pack_bytes": %s}\n' \
  "$commit" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores" \
  "$NAME" "$FMT" "$CT" "$(echo "$t1 - $t0" | bc)" "$size" | tee "bench/results/quantize-$NAME.json"
