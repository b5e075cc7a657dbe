#!/usr/bin/env bash
# test_gate.sh — the confidence gate in `moet run` (experts quantized in memory to W2 + NVFP4 delta): tau 0 corrects
# nothing and equals --delta off, tau 1 corrects every step and equals --delta on, both bit for bit (same greedy ids).
# usage: test_gate.sh MOET_BIN MODEL_DIR
set -u
MOET=$1; MODEL=$2
fail=0
run() { "$MOET" run -m "$MODEL" --experts w2+nvfp4 --prompt-ids "5 6 7 8 9" -n 12 --temp 0 --print-ids --ignore-eos -t 2 "$@" 2>/dev/null; }
off=$(run --delta off); g0=$(run --delta gate --tau 0); on=$(run --delta on); g1=$(run --delta gate --tau 1)
echo "off:      $off"; echo "gate τ=0: $g0"; echo "on:       $on"; echo "gate τ=1: $g1"
[ -n "$off" ] && [ "$off" = "$g0" ] && echo "ok   tau 0 = off" || { echo "FAIL tau 0 differs from off"; fail=1; }
[ -n "$on" ] && [ "$on" = "$g1" ] && echo "ok   tau 1 = on" || { echo "FAIL tau 1 differs from on"; fail=1; }
[ "$off" != "$on" ] && echo "ok   the delta changes the output (so the equalities can fail)" || { echo "FAIL off and on agree: this prompt cannot tell the modes apart"; fail=1; }
"$MOET" run -m "$MODEL" --delta gate --prompt-ids "5 6" -n 1 >/dev/null 2>&1 && { echo "FAIL --delta without a delta format accepted"; fail=1; } || echo "ok   --delta gate without --experts w2+nvfp4 is refused"
exit $fail
