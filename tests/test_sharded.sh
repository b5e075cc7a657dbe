#!/usr/bin/env bash
# test_sharded.sh — a checkpoint split into 3 shards + index.json loads and gives the same logits as the single file
# (the reference check of test_logits), and an index naming a missing shard is an error.
# usage: test_sharded.sh TEST_LOGITS_BIN MOET_BIN MODEL_DIR SRC_DIR
set -u
BIN=$1; MOET=$2; MODEL=$3; SRC=$4
command -v python3 >/dev/null || { echo "skip: python3 not found (needed to write the shards)"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 "$SRC/tools/shard_safetensors.py" "$MODEL" "$tmp/sharded" 3 || exit 1
ls "$tmp/sharded"
"$BIN" "$tmp/sharded" "$MODEL/reference_fp32.safetensors" 40 0 || exit 1
cp -r "$tmp/sharded" "$tmp/broken"
rm "$tmp/broken/model-00002-of-00003.safetensors"
if "$MOET" inspect -m "$tmp/broken" >/dev/null 2>"$tmp/err"; then echo "FAIL: missing shard accepted"; exit 1; fi
grep -q "model-00002-of-00003" "$tmp/err" && echo "ok: missing shard rejected: $(cat "$tmp/err")"
