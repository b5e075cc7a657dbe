#!/usr/bin/env bash
# gate_study.sh — which signal should the delta gate use? Runs `moet perplexity --gate-study` on MODEL (W2 + NVFP4
# delta, calibrated, in memory) over dev.txt, every step on the base and from the same cache on base + delta, and
# writes bench/results/gate/NAME.study.json through tools/gate_study.py (rendered into docs/quality.md).
# usage: bench/gate_study.sh [MODEL_DIR] [CTX] [CHUNKS]     (defaults: ../shared/models/moe-mini-c 512 16)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-../shared/models/moe-mini-c}; CTX=${2:-512}; CHUNKS=${3:-16}
MOET=${MOET:-build/moet}; DATA=${DATA:-../shared/data/dev.txt}; CALIB_TOKENS=${CALIB_TOKENS:-16384} # as bench/quality.sh
name=$(basename "$MODEL")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(set +o pipefail; xz -dc ../shared/data/train.txt.xz | head -c 300000 > "$work/calib.txt")
echo "gate_study: the reference distributions ($name, bf16 experts)" >&2
"$MOET" perplexity -m "$MODEL" -f "$DATA" --ctx "$CTX" --chunks "$CHUNKS" --save-logits "$work/base.kld" >/dev/null
echo "gate_study: every step on the base and on base + delta" >&2
"$MOET" perplexity -m "$MODEL" -f "$DATA" --ctx "$CTX" --chunks "$CHUNKS" --experts w2+nvfp4 --calib "$work/calib.txt" \
  --calib-tokens "$CALIB_TOKENS" \
  --delta gate --kld-base "$work/base.kld" --gate-study "$work/study.csv" >/dev/null
mkdir -p bench/results/gate
out=bench/results/gate/$name.study.json
python3 tools/gate_study.py "$work/study.csv" --json "$out"
# what made it: tool, commit, date, machine, arguments
python3 - "$out" "$(git describe --always --dirty --abbrev=12)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores" \
  "--ctx $CTX --chunks $CHUNKS --experts w2+nvfp4 --calib-tokens $CALIB_TOKENS --delta gate" <<'PY'
import json, sys
p, commit, date, machine, args = sys.argv[1:]
d = json.load(open(p))
d = {"tool": "bench/gate_study.sh", "commit": commit, "date": date, "machine": machine, "args": args, **d}
json.dump(d, open(p, "w"), indent=1)
PY
