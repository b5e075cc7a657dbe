#!/usr/bin/env bash
# test_pack.sh — packs through the CLI: quantize writes a pack that run/perplexity load; truncated, corrupted and
# mistyped packs are rejected with an error; a quantize killed mid-way leaves no file under the output name.
# usage: test_pack.sh MOET_BIN HF_MODEL_DIR
set -u
MOET=$1; MODEL=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0; ok() { echo "ok   $1"; }; bad() { echo "FAIL $1"; fail=1; }
"$MOET" quantize -m "$MODEL" -o "$tmp/p.gguf" --experts w2 --no-calib >/dev/null 2>"$tmp/q.log" && [ -f "$tmp/p.gguf" ] \
  && ok "quantize wrote a pack" || { bad "quantize: $(tail -2 "$tmp/q.log")"; exit 1; }
[ ! -e "$tmp/p.gguf.tmp" ] && ok "no temporary left" || bad "temporary left"
head -c 4 "$tmp/p.gguf" | grep -q GGUF && ok "GGUF magic" || bad "magic"
out=$("$MOET" run -m "$tmp/p.gguf" --prompt-ids "5 6 7 8" -n 4 --temp 0 --print-ids 2>/dev/null)
[ -n "$out" ] && ok "run from a pack: $out" || bad "run from a pack"
size=$(stat -c %s "$tmp/p.gguf")
head -c $((size / 2)) "$tmp/p.gguf" > "$tmp/trunc.gguf"
"$MOET" inspect -m "$tmp/trunc.gguf" >/dev/null 2>"$tmp/e" && bad "truncated pack accepted" || { grep -q "past the end\|truncated" "$tmp/e" && ok "truncated pack: $(cat "$tmp/e")" || bad "truncated: $(cat "$tmp/e")"; }
cp "$tmp/p.gguf" "$tmp/magic.gguf"; printf 'XXXX' | dd of="$tmp/magic.gguf" conv=notrunc 2>/dev/null
"$MOET" inspect -m "$tmp/magic.gguf" >/dev/null 2>"$tmp/e" && bad "bad magic accepted" || ok "bad magic: $(cat "$tmp/e")"
cp "$tmp/p.gguf" "$tmp/ver.gguf"; printf '\x07' | dd of="$tmp/ver.gguf" bs=1 seek=4 conv=notrunc 2>/dev/null
"$MOET" inspect -m "$tmp/ver.gguf" >/dev/null 2>"$tmp/e" && bad "bad version accepted" || ok "bad version: $(cat "$tmp/e")"
head -c 40 "$tmp/p.gguf" > "$tmp/hdr.gguf"
"$MOET" inspect -m "$tmp/hdr.gguf" >/dev/null 2>"$tmp/e" && bad "header-only pack accepted" || ok "header-only pack: $(cat "$tmp/e")"
# --dense q8_0: the projections and lm_head as Q8_0: a smaller pack computing nearly the same function
"$MOET" quantize -m "$MODEL" -o "$tmp/q8.gguf" --experts w2 --no-calib --dense q8_0 >/dev/null 2>"$tmp/q.log" \
  || bad "quantize --dense q8_0: $(tail -2 "$tmp/q.log")"
txt=$(mktemp); printf 'The history of the language and of its speakers, told plainly. ' > "$txt"
for i in 1 2 3 4 5 6; do cat "$txt" "$txt" > "$txt.2" && mv "$txt.2" "$txt"; done
p16=$("$MOET" perplexity -m "$tmp/p.gguf" -f "$txt" --ctx 64 --chunks 2 --json 2>/dev/null | grep -o '"ppl": [0-9.]*' | cut -d' ' -f2)
p8=$("$MOET" perplexity -m "$tmp/q8.gguf" -f "$txt" --ctx 64 --chunks 2 --json 2>/dev/null | grep -o '"ppl": [0-9.]*' | cut -d' ' -f2)
rm -f "$txt"
[ "$(stat -c %s "$tmp/q8.gguf")" -lt "$size" ] && ok "--dense q8_0 pack is smaller ($(stat -c %s "$tmp/q8.gguf") < $size bytes)" || bad "--dense q8_0 pack not smaller"
awk -v a="$p16" -v b="$p8" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(a > 0 && d < 0.02) }' \
  && ok "--dense q8_0 PPL $p8 vs $p16 with dense as stored (< 2% apart)" || bad "--dense q8_0 PPL $p8 vs $p16"
# A killed quantize leaves nothing under the final name.
( "$MOET" quantize -m "$MODEL" -o "$tmp/killed.gguf" --experts w2 --no-calib >/dev/null 2>&1 & pid=$!; sleep 0.3; kill -9 $pid; wait $pid ) 2>/dev/null
[ ! -e "$tmp/killed.gguf" ] && ok "killed quantize left no pack" || bad "killed quantize left $tmp/killed.gguf"
exit $fail
