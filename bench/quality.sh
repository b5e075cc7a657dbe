#!/usr/bin/env bash
# quality.sh — the quality table's runs: for one model, the BF16 base distributions, then every expert format and
# delta mode measured as KL divergence to the base on the same windows. Each result is written to
# bench/results/quality/<model>.<run>.json with commit, machine and date; tools/render_tables.py renders
# docs/quality.md from them.
#   usage: bench/quality.sh MODEL_DIR [RUN ...]     (runs: see RUNS below; default all)
#   env:   DATA (default ../shared/data/dev.txt), CALIB (default: first 300 kB of ../shared/data/train.txt.xz),
#          CALIB_TOKENS (16384), CTX (512), CHUNKS (16), MOET (build/moet)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=$1; shift
NAME=$(basename "$MODEL")
MOET=${MOET:-build/moet}
DATA=${DATA:-../shared/data/dev.txt}
CTX=${CTX:-512}; CHUNKS=${CHUNKS:-16}; CALIB_TOKENS=${CALIB_TOKENS:-16384}
OUTDIR=bench/results/quality; mkdir -p "$OUTDIR"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if [ -z "${CALIB:-}" ]; then CALIB=$work/calib.txt; (set +o pipefail; xz -dc ../shared/data/train.txt.xz | head -c 300000 > "$CALIB"); fi
declare -A RUNS=(
  [bf16]="--experts bf16"            [q8_0]="--experts q8_0"        [mxfp4]="--experts mxfp4"
  [nvfp4]="--experts nvfp4"          [int2]="--experts int2"        [asym2]="--experts asym2"
  [sym2]="--experts sym2"            [w2-nocalib]="--experts w2"    [w2]="--experts w2 --calib CAL"
  [w2-nogptq]="--experts w2 --calib CAL --no-gptq"
  [w2+nvfp4.on]="--experts w2+nvfp4 --calib CAL --delta on"
  [w2+nvfp4.gate]="--experts w2+nvfp4 --calib CAL --delta gate --tau 0.6"
  [w2+w2.on]="--experts w2+w2 --calib CAL --delta on"
  [kv-f16]="--kv-type f16"           [w2.kv-f16]="--experts w2 --calib CAL --kv-type f16"
  # the delta on the heavy picks only (--delta-pick R): it needs the residuals beside the base, so these runs read a
  # W2 + NVFP4 pack quantized once with the same calibration (PACK)
  [w2+nvfp4.pick04]="PACK --delta on --delta-pick 0.4"  [w2+nvfp4.pick06]="PACK --delta on --delta-pick 0.6"
  [w2+nvfp4.pick08]="PACK --delta on --delta-pick 0.8"  [w2+nvfp4.pick10]="PACK --delta on --delta-pick 1.0"
  [w2+nvfp4.pick12]="PACK --delta on --delta-pick 1.2"  [w2+nvfp4.pick15]="PACK --delta on --delta-pick 1.5"
)
sel=("$@"); [ ${#sel[@]} -gt 0 ] || sel=(bf16 q8_0 mxfp4 nvfp4 int2 asym2 sym2 w2-nocalib w2 w2-nogptq w2+nvfp4.on w2+nvfp4.gate w2+w2.on kv-f16 w2.kv-f16
  w2+nvfp4.pick04 w2+nvfp4.pick06 w2+nvfp4.pick08 w2+nvfp4.pick10 w2+nvfp4.pick12 w2+nvfp4.pick15)
commit=$(git describe --always --dirty --abbrev=12)
machine="$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores"
"$MOET" perplexity -m "$MODEL" -f "$DATA" --ctx "$CTX" --chunks "$CHUNKS" --save-logits "$work/base.kld" >/dev/null
for r in "${sel[@]}"; do
  args=${RUNS[$r]//CAL/$CALIB}
  m=$MODEL
  if [[ $args == PACK* ]]; then
    if [ ! -f "$work/pack.gguf" ]; then
      echo "quality: $NAME: quantizing the W2 + NVFP4 pack" >&2
      "$MOET" quantize -m "$MODEL" -o "$work/pack.gguf" --experts w2+nvfp4 --calib "$CALIB" --calib-tokens "$CALIB_TOKENS" \
        2>"$work/log" >/dev/null || { cat "$work/log" >&2; exit 1; }
    fi
    m=$work/pack.gguf; args=${args#PACK}
  fi
  echo "quality: $NAME $r ($args)" >&2
  res=$("$MOET" perplexity -m "$m" -f "$DATA" --ctx "$CTX" --chunks "$CHUNKS" --kld-base "$work/base.kld" --json \
        --calib-tokens "$CALIB_TOKENS" $args 2>"$work/log") || { cat "$work/log" >&2; exit 1; }
  size=$(grep -a "experts as" "$work/log" | head -1 || true)
  printf '{"tool": "bench/quality.sh", "commit": "%s", "date": "%s", "machine": "%s", "model": "%s", "data": "%s", "run": "%s", "args": "%s", "calib_tokens": %s, "result": %s}\n' \
    "$commit" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$machine" "$NAME" "$(basename "$DATA")" "$r" "${RUNS[$r]}" "$CALIB_TOKENS" "$res" \
    > "$OUTDIR/$NAME.$r.json"
done
