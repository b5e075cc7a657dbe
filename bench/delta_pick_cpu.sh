#!/usr/bin/env bash
# delta_pick_cpu.sh — decode with the FP4 delta on every pick, on the picks of R (--delta-pick) and the base alone,
# on this machine's CPU: the moe-mini-c W2 + NVFP4 pack (quantized here with the quality table's calibration). The
# configurations alternate over ROUNDS rounds (this machine's speed drifts between minutes; the table takes each
# one's median). Not the 30b shape here: on 2 cores its step is mostly lm_head and attention (the residuals ~10% of
# the bytes of 4 layers), and the runs' spread (6.4-8.8 t/s for one setting) was larger than the effect;
# tools/gpu_delta_pick.sh times it on the GPU. JSON per run in
# bench/results/cpu-delta/; rendered into docs/quality.md (tools/render_tables.py: cpu-delta-pick).
#   usage: bench/delta_pick_cpu.sh      env: MOET (build/moet), T (threads, 2), N (tg tokens, 32), ROUNDS (3)
set -euo pipefail
cd "$(dirname "$0")/.."
MOET=${MOET:-build/moet}; T=${T:-2}; N=${N:-32}; ROUNDS=${ROUNDS:-3}
out=bench/results/cpu-delta; mkdir -p "$out"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(set +o pipefail; xz -dc ../shared/data/train.txt.xz | head -c 300000 > "$work/calib.txt")
"$MOET" quantize -m ../shared/models/moe-mini-c -o "$work/moe-mini-c.gguf" --experts w2+nvfp4 --calib "$work/calib.txt" \
  --calib-tokens 16384 -t "$T" >/dev/null 2>"$work/q.log" || { cat "$work/q.log" >&2; exit 1; }
b() { "$MOET" bench --device cpu -T "$T" -p 0 -n "$N" --reps 2 "$@" 2>/dev/null | grep '^| ' | tail -1; }
for i in $(seq "$ROUNDS"); do
  for r in 0 0.8 1.0; do b -m "$work/moe-mini-c.gguf" --delta-pick $r --json "$out/moe-mini-c.pick$r.r$i.json"; done
  b -m "$work/moe-mini-c.gguf" --delta-file "" --json "$out/moe-mini-c.w2.r$i.json"
done
