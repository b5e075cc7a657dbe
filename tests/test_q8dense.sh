#!/usr/bin/env bash
# test_q8dense.sh — a pack with Q8_0 dense projections (moet quantize --dense q8_0: attention, lm_head) end to end on
# a device against the CPU: on CUDA such matrices of widths multiple of 256 decode through the q8t copy
# (quant/blocks.h) and the persistent GEMV, prefill chunks through the generic kernel on the same copy. Perplexity
# on the device's logits must equal the CPU's (the same function; fp32 sums in another order), the mean KLD between
# them be at the noise of two fp32 runs, and every top-1 token agree.
# usage: test_q8dense.sh MOET_BIN HF_MODEL_DIR TEXT [DEVICE]
set -u
MOET=$1; MODEL=$2; TEXT=$3; DEV=${4:-cuda}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$MOET" quantize -m "$MODEL" -o "$tmp/q8.gguf" --experts w2 --dense q8_0 --no-calib >/dev/null 2>"$tmp/q.log" \
  || { echo "FAIL quantize: $(tail -1 "$tmp/q.log")"; exit 1; }
"$MOET" perplexity -m "$tmp/q8.gguf" -f "$TEXT" --device cpu --json --save-logits "$tmp/base.bin" > "$tmp/cpu.json" 2>"$tmp/cpu.log" \
  || { echo "FAIL cpu perplexity: $(tail -1 "$tmp/cpu.log")"; exit 1; }
"$MOET" perplexity -m "$tmp/q8.gguf" -f "$TEXT" --device "$DEV" --kv-type f32 --json --kld-base "$tmp/base.bin" > "$tmp/dev.json" 2>"$tmp/dev.log" \
  || { echo "FAIL $DEV perplexity: $(tail -1 "$tmp/dev.log")"; exit 1; }
cat "$tmp/cpu.json" "$tmp/dev.json"
python3 - "$tmp/cpu.json" "$tmp/dev.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); d = json.load(open(sys.argv[2]))
rel = abs(c["ppl"] - d["ppl"]) / c["ppl"]
ok = rel < 1e-5 and abs(d["kld_mean"]) < 1e-7 and d["kld_max"] < 1e-5 and d["top1_agree"] == 1.0
print(("ok  " if ok else "FAIL") + " q8_0 dense pack: ppl %.6f (cpu) vs %.6f, rel %.2g; kld mean %.2g max %.2g; top-1 %.4f"
      % (c["ppl"], d["ppl"], rel, d["kld_mean"], d["kld_max"], d["top1_agree"]))
sys.exit(0 if ok else 1)
PY
