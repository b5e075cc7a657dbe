#!/usr/bin/env bash
# test_delta.sh — delta packs: `quantize --experts w2+nvfp4` writes the W2 pack and its NVFP4 delta pack; loaded
# beside the pack, --delta off / on give the same perplexity as the same format requantized in memory (the
# reference path), the gate at tau 0 / 1 equals off / on bit for bit; a delta pack that is truncated, corrupted or
# written for another pack is refused with an error, and --delta-file "" runs without one. --delta-pick R (the
# delta on the heavy picks only): R 0 = on and a large R = off bit for bit, R 1 between; refused on in-memory deltas.
# A pack's products do not depend on the tokens a step holds: a window at once = token by token, bit for bit.
# usage: test_delta.sh MOET_BIN HF_MODEL_DIR
set -u
MOET=$1; MODEL=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0; ok() { echo "ok   $1"; }; bad() { echo "FAIL $1"; fail=1; }
"$MOET" quantize -m "$MODEL" -o "$tmp/p.gguf" --experts w2+nvfp4 --no-calib -t 2 >/dev/null 2>"$tmp/q.log" \
  && [ -f "$tmp/p.gguf" ] && [ -f "$tmp/p.delta.gguf" ] && ok "quantize wrote p.gguf and p.delta.gguf" \
  || { bad "quantize: $(tail -2 "$tmp/q.log")"; exit 1; }
txt=$(mktemp); printf 'The history of the language and of its speakers, told plainly. ' > "$txt"
for i in 1 2 3 4 5 6; do cat "$txt" "$txt" > "$txt.2" && mv "$txt.2" "$txt"; done
ppl() { "$MOET" perplexity -f "$txt" --ctx 64 --chunks 2 --json -t 2 "$@" 2>/dev/null | grep -o '"ppl": [0-9.]*' | cut -d' ' -f2; }
for d in off on; do
  a=$(ppl -m "$tmp/p.gguf" --delta $d); b=$(ppl -m "$MODEL" --experts w2+nvfp4 --delta $d)
  awk -v a="$a" -v b="$b" 'BEGIN { d = (b - a) / b; if (d < 0) d = -d; exit !(a > 0 && d < 1e-4) }' \
    && ok "--delta $d: pack + delta pack PPL $a, in memory $b" || bad "--delta $d: pack $a vs in memory $b"
done
off=$(ppl -m "$tmp/p.gguf" --delta off); on=$(ppl -m "$tmp/p.gguf" --delta on)
[ "$off" != "$on" ] && ok "the delta changes the PPL ($off -> $on)" || bad "off and on agree ($off)"
run() { "$MOET" run -m "$tmp/p.gguf" --prompt-ids "5 6 7 8 9" -n 10 --temp 0 --print-ids --ignore-eos -t 2 "$@" 2>/dev/null; }
r_off=$(run --delta off); r_on=$(run --delta on); g0=$(run --delta gate --tau 0); g1=$(run --delta gate --tau 1)
[ -n "$r_off" ] && [ "$r_off" = "$g0" ] && ok "run: gate tau 0 = off" || bad "run: gate tau 0 ($g0) vs off ($r_off)"
[ -n "$r_on" ] && [ "$r_on" = "$g1" ] && ok "run: gate tau 1 = on" || bad "run: gate tau 1 ($g1) vs on ($r_on)"
expect() { grep -q "$1" "$tmp/e" && ok "$2: $(grep -v '^moet: info' "$tmp/e" | tail -1)" || bad "$2: $(tail -1 "$tmp/e")"; }
# --delta-pick R: the delta only on the picks of at least R x the token's mean routing weight. R 0 is `on` and an R
# no pick reaches is `off`, bit for bit (the saved distributions); R 1 runs the delta on some picks, not all.
sv() { "$MOET" perplexity -m "$tmp/p.gguf" -f "$txt" --ctx 64 --chunks 2 -t 2 --save-logits "$tmp/$1.kld" "${@:2}" >/dev/null 2>&1; }
sv on --delta on; sv off --delta off; sv p0 --delta on --delta-pick 0; sv pbig --delta on --delta-pick 1000
sv p1 --delta on --delta-pick 1; sv g1p --delta gate --tau 1 --delta-pick 1
sv p1s --delta on --delta-pick 1 --step 1 # the gate's steps are one token each: the pack's products, a row at a time
sv offs --delta off --step 1
sv dflt; sv p08 --delta on --delta-pick 0.8 # the default mode with a delta pack: pick, R 0.8
cmp -s "$tmp/dflt.kld" "$tmp/p08.kld" && ok "the default with a delta pack is --delta pick, R 0.8" || bad "default != on + pick 0.8"
cmp -s "$tmp/on.kld" "$tmp/p0.kld" && ok "--delta-pick 0 equals on bit for bit" || bad "--delta-pick 0 != on"
cmp -s "$tmp/off.kld" "$tmp/pbig.kld" && ok "--delta-pick 1000 equals off bit for bit" || bad "--delta-pick 1000 != off"
cmp -s "$tmp/p1.kld" "$tmp/on.kld" || cmp -s "$tmp/p1.kld" "$tmp/off.kld" && bad "--delta-pick 1 equals on or off" \
  || ok "--delta-pick 1 differs from on and from off"
cmp -s "$tmp/p1s.kld" "$tmp/g1p.kld" && ok "gate tau 1 with --delta-pick 1 equals on with it" || bad "gate tau 1 + pick != on + pick"
# batch invariance (q2dot.c / fp4dot.c's token-batched products, since stop 45): a pack's window evaluated at once
# and token by token give the same distributions bit for bit, with and without the delta's residuals
cmp -s "$tmp/p1.kld" "$tmp/p1s.kld" && ok "pack + delta pack: a window at once = token by token, bit for bit" \
  || bad "pack + delta pack: window vs token by token differ"
cmp -s "$tmp/off.kld" "$tmp/offs.kld" && ok "W2 pack: a window at once = token by token, bit for bit" \
  || bad "W2 pack: window vs token by token differ"
frac=$("$MOET" perplexity -m "$tmp/p.gguf" -f "$txt" --ctx 64 --chunks 2 -t 2 --kld-base "$tmp/on.kld" --json --delta on \
       --delta-pick 1 2>/dev/null | grep -o '"delta_picks": [0-9.]*' | cut -d' ' -f2)
awk -v f="$frac" 'BEGIN { exit !(f > 0.05 && f < 0.95) }' && ok "--delta-pick 1: the delta on $frac of the picks" \
  || bad "--delta-pick 1: delta_picks '$frac'"
rune() { "$MOET" run -m "$tmp/p.gguf" --prompt-ids "5 6" -n 1 -t 2 "$@" >/dev/null 2>"$tmp/e"; }
rune --delta on --delta-pick -1 && bad "--delta-pick -1 accepted" || expect "needs a number" "--delta-pick -1"
"$MOET" run -m "$MODEL" --experts w2+nvfp4 --prompt-ids "5 6" -n 1 -t 2 --delta on --delta-pick 1 >/dev/null 2>"$tmp/e" \
  && bad "--delta-pick on experts requantized in memory accepted" || expect "residuals" "--delta-pick, in-memory delta"
"$MOET" run -m "$MODEL" --experts w2+nvfp4 --prompt-ids "5 6" -n 1 -t 2 --delta pick >/dev/null 2>"$tmp/e" \
  && bad "--delta pick on experts requantized in memory accepted" || expect "residuals" "--delta pick, in-memory delta"
r_p1=$(run --delta on --delta-pick 1); g1p=$(run --delta gate --tau 1 --delta-pick 1)
[ -n "$r_p1" ] && [ "$r_p1" = "$g1p" ] && ok "run: --delta-pick 1, gate tau 1 = on" || bad "run: pick 1 gate ($g1p) vs on ($r_p1)"
rune --delta-file "" --delta on && bad "--delta on without a delta accepted" || expect "needs a delta" "--delta-file \"\": no delta"
size=$(stat -c %s "$tmp/p.delta.gguf")
head -c $((size / 2)) "$tmp/p.delta.gguf" > "$tmp/trunc.gguf"
rune --delta-file "$tmp/trunc.gguf" && bad "truncated delta accepted" || expect "past the end\|truncated" "truncated delta"
cp "$tmp/p.delta.gguf" "$tmp/magic.gguf"; printf 'XXXX' | dd of="$tmp/magic.gguf" conv=notrunc 2>/dev/null
rune --delta-file "$tmp/magic.gguf" && bad "corrupt delta accepted" || expect "magic" "corrupt delta"
rune --delta-file "$tmp/missing.gguf" && bad "missing delta accepted" || expect "missing.gguf" "missing delta"
# the same checkpoint quantized again draws a new id: its delta does not apply to the first pack
"$MOET" quantize -m "$MODEL" -o "$tmp/q.gguf" --experts w2+nvfp4 --no-calib -t 2 >/dev/null 2>&1
rune --delta-file "$tmp/q.delta.gguf" && bad "another pack's delta accepted" || expect "another pack" "another pack's delta"
rune --delta-file "$tmp/q.gguf" && bad "a base pack as delta accepted" || expect "not a moet delta" "a base pack given as the delta"
rm -f "$txt"
exit $fail
