#!/usr/bin/env bash
# test_ecache_pack.sh — the expert cache on a W2 pack with its NVFP4 delta pack (the format the cache is for: on
# CUDA, W2 experts in the tiled layout, rewritten in their slots on arrival, and residuals in the same slot index).
# Quantizes the model, then runs test_ecache on the pack (which turns the delta on after a prompt).
# usage: test_ecache_pack.sh MOET_BIN TEST_ECACHE_BIN HF_MODEL_DIR [DEVICE [pinned|mapped]]   (77: skipped, no GPU)
set -u
MOET=$1; TEST=$2; MODEL=$3; DEV=${4:-cpu}; HOME_=${5:-mapped}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# EXPERTS=w2: no delta pack (CUDA runs the delta only on experts in the tiled layout: widths multiples of 128)
EXPERTS=${EXPERTS:-w2+nvfp4}
"$MOET" quantize -m "$MODEL" -o "$tmp/p.gguf" --experts $EXPERTS --no-calib -t 2 >/dev/null 2>"$tmp/q.log" \
  && { [ "$EXPERTS" = w2 ] || [ -f "$tmp/p.delta.gguf" ]; } || { echo "FAIL quantize: $(tail -2 "$tmp/q.log")"; exit 1; }
"$TEST" "$tmp/p.gguf" "$DEV" "$HOME_"
