#!/usr/bin/env bash
# test_cli.sh — the moet binary end to end: run (greedy ids equal transformers'), tokenize, perplexity (PPL equal
# transformers' on the same windows), KLD of a run to itself, and error exits on bad input.
# usage: test_cli.sh MOET_BIN MODEL_DIR SHARED_DIR FIXTURES_DIR [quick]
set -u
MOET=$1; MODEL=$2; SHARED=$3; FIX=$4; QUICK=${5:-}
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

# tokenize: equal to HF tokenizers' ids for a fixture case
got=$("$MOET" tokenize -m "$MODEL" "Hello, world!" 2>/dev/null)
[ "$got" = "42 967 323 14 2375 3" ] && ok "tokenize" || bad "tokenize: '$got'"

# run: greedy continuation of window 0's 16-token prompt equals transformers' greedy_ids (see tests/test_logits.c)
prompt="16 201 464 276 388 14 269 1702 276 388 14 1644 306 390 329 29"
want="269 276 1642 2137 306 269 276 1642"
got=$("$MOET" run -m "$MODEL" --prompt-ids "$prompt" -n 8 --temp 0 --print-ids 2>"$tmp/run.err")
[ "$got" = "$want" ] && ok "run --print-ids greedy" || bad "run greedy: '$got' want '$want' ($(tail -1 "$tmp/run.err"))"
# the expert cache's protocol (CPU): 200 of 256 experts resident, every miss fetched and its step run again: the same ids
got=$("$MOET" run -m "$MODEL" --prompt-ids "$prompt" -n 8 --temp 0 --print-ids --expert-slots 200 2>"$tmp/run.err")
[ "$got" = "$want" ] && ok "run --expert-slots 200: greedy ids equal transformers'" || bad "run --expert-slots 200: '$got' ($(tail -1 "$tmp/run.err"))"
# 120 slots cannot hold what the 16-token prompt routes to in one step: the session runs it in smaller steps
got=$("$MOET" run -m "$MODEL" --prompt-ids "$prompt" -n 8 --temp 0 --print-ids --expert-slots 120 2>"$tmp/run.err")
[ "$got" = "$want" ] && grep -q "steps of" "$tmp/run.err" && ok "run --expert-slots 120: the prompt in smaller steps, same ids" \
  || bad "run --expert-slots 120: '$got' ($(grep 'expert cache' "$tmp/run.err" | tail -1))"
# a budget instead of a count (0.0008 GiB: 8 of moe-mini-a's 0.09 MiB experts, fewer than one token's 32) with pinned
# homes: the direct mode reads the others where they wait, so every step completes with the same ids
got=$("$MOET" run -m "$MODEL" --prompt-ids "$prompt" -n 8 --temp 0 --print-ids --expert-slots 0.0008G --expert-home pinned 2>"$tmp/run.err")
[ "$got" = "$want" ] && grep -q "holds 8 slots" "$tmp/run.err" && grep -q "0 steps run again" "$tmp/run.err" \
  && ok "run --expert-slots 0.0008G --expert-home pinned: 8 slots, no replays, same ids" \
  || bad "run --expert-slots 0.0008G: '$got' ($(grep 'expert cache' "$tmp/run.err" | tr '\n' ' '))"
# auto: the model fits (on the CPU every expert is resident): the same ids; a bad reserve is refused
got=$("$MOET" run -m "$MODEL" --prompt-ids "$prompt" -n 8 --temp 0 --print-ids --expert-slots auto --expert-reserve 1 2>"$tmp/run.err")
[ "$got" = "$want" ] && ok "run --expert-slots auto: same ids" || bad "run --expert-slots auto: '$got' ($(tail -1 "$tmp/run.err"))"
"$MOET" run -m "$MODEL" --prompt-ids "$prompt" -n 1 --expert-slots auto --expert-reserve -3 >/dev/null 2>"$tmp/run.err" \
  && bad "--expert-reserve -3 accepted" || ok "--expert-reserve -3: $(tail -1 "$tmp/run.err")"
# 16 slots cannot hold one token's 8 x 4 experts: an error that says so
"$MOET" run -m "$MODEL" --prompt-ids "$prompt" -n 1 --expert-slots 16 >/dev/null 2>"$tmp/run.err" \
  && bad "16 slots for one token's 32 experts accepted" \
  || { grep -q "expert cache" "$tmp/run.err" && ok "16 slots for one token: $(tail -1 "$tmp/run.err")" || bad "slots error: $(tail -1 "$tmp/run.err")"; }
# run streams text to stdout, logs to stderr
out=$("$MOET" run -m "$MODEL" -p "=head1 NAME" -n 12 --temp 0.7 --seed 1 2>"$tmp/log")
[ -n "$out" ] && grep -q "generated" "$tmp/log" && ! grep -q "generated" <<<"$out" && ok "run text/log split" || bad "run output split"
o1=$("$MOET" run -m "$MODEL" -p "=head1 NAME" -n 12 --temp 0.9 --seed 5 2>/dev/null)
o2=$("$MOET" run -m "$MODEL" -p "=head1 NAME" -n 12 --temp 0.9 --seed 5 2>/dev/null)
[ "$o1" = "$o2" ] && ok "run deterministic for a seed" || bad "run not deterministic"

# errors: bad model dir, bad ids, unknown option -> non-zero exit and a message
"$MOET" run -m "$tmp/nope" -p x >/dev/null 2>"$tmp/e1"; rc=$?
[ $rc -ne 0 ] && grep -q "error" "$tmp/e1" && ok "missing model dir" || bad "missing model dir rc=$rc"
"$MOET" run -m "$MODEL" --prompt-ids "1 x 3" >/dev/null 2>&1 && bad "bad ids accepted" || ok "bad --prompt-ids"
"$MOET" run -m "$MODEL" --prompt-ids "999999" -n 1 >/dev/null 2>&1 && bad "out-of-vocab id accepted" || ok "out-of-vocab id"
"$MOET" frobnicate >/dev/null 2>&1 && bad "unknown command accepted" || ok "unknown command"

# perplexity: equal to transformers' fp32 PPL over the same 16 windows (tests/fixtures/ppl_ref.json)
if [ -z "$QUICK" ] && [ -f "$SHARED/data/dev.txt" ]; then
  j=$("$MOET" perplexity -m "$MODEL" -f "$SHARED/data/dev.txt" --ctx 512 --chunks 16 --json 2>/dev/null)
  ppl=$(sed -n 's/.*"ppl": \([0-9.]*\).*/\1/p' <<<"$j")
  ref=$(sed -n 's/.*"ppl": \([0-9.]*\).*/\1/p' "$FIX/ppl_ref.json")
  awk -v a="$ppl" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d / b < 1e-4) }' \
    && ok "perplexity $ppl vs transformers $ref" || bad "perplexity $ppl vs transformers $ref"
fi
# KLD of a run to itself is 0 up to float rounding of the stored log-probs (max ~5e-9 seen) and top-1 agreement 1;
# a mismatched or truncated base is refused
if [ -f "$SHARED/data/dev.txt" ]; then
  "$MOET" perplexity -m "$MODEL" -f "$SHARED/data/dev.txt" --ctx 64 --chunks 2 --save-logits "$tmp/base.kld" >/dev/null 2>&1
  [ -f "$tmp/base.kld" ] && [ ! -f "$tmp/base.kld.tmp" ] && ok "save-logits written atomically" || bad "save-logits"
  j=$("$MOET" perplexity -m "$MODEL" -f "$SHARED/data/dev.txt" --ctx 64 --chunks 2 --kld-base "$tmp/base.kld" --json 2>/dev/null)
  kl=$(sed -n 's/.*"kld_max": \([-0-9.e]*\).*/\1/p' <<<"$j")
  awk -v k="$kl" 'BEGIN { exit !(k != "" && k + 0 < 1e-7 && k + 0 > -1e-7) }' && grep -q '"top1_agree": 1.000000' <<<"$j" && ok "kld to itself: $j" || bad "kld to itself: $j"
  "$MOET" perplexity -m "$MODEL" -f "$SHARED/data/dev.txt" --ctx 64 --chunks 3 --kld-base "$tmp/base.kld" >/dev/null 2>&1 \
    && bad "mismatched base accepted" || ok "mismatched kld base refused"
  head -c 100 "$tmp/base.kld" > "$tmp/short.kld"
  "$MOET" perplexity -m "$MODEL" -f "$SHARED/data/dev.txt" --ctx 64 --chunks 2 --kld-base "$tmp/short.kld" >/dev/null 2>&1 \
    && bad "truncated base accepted" || ok "truncated kld base refused"
fi
# bench's JSON records the MOET_* settings it ran under, escaped (and not MOET_COMMIT, which is its "commit")
MOET_BENCH_TAG='a"b\c' MOET_COMMIT=abc123 "$MOET" bench --synthetic mini -p 4 -n 2 --reps 1 -t 1 --json "$tmp/b.json" \
  >/dev/null 2>&1 || bad "bench --json"
grep -qF '"env": {' "$tmp/b.json" && grep -qF '"MOET_BENCH_TAG": "a\"b\\c"' "$tmp/b.json" && ! grep -q '"MOET_COMMIT"' "$tmp/b.json" \
  && grep -qF '"commit": "abc123"' "$tmp/b.json" && ok "bench --json: env recorded, escaped" || bad "bench --json env: $(grep env "$tmp/b.json")"
# one untimed warm-up run before the timed ones (graphs recorded, kernels loaded), unless --no-warmup
err=$("$MOET" bench --synthetic mini -p 4 -n 2 --reps 1 -t 1 --json "$tmp/bw.json" 2>&1 >/dev/null)
grep -q "warm-up: .*(not counted)" <<<"$err" && grep -qF '"warmup": 1,' "$tmp/bw.json" && ok "bench: a warm-up run first" \
  || bad "bench warm-up: $err"
err=$("$MOET" bench --synthetic mini -p 4 -n 2 --reps 1 -t 1 --no-warmup --json "$tmp/bw.json" 2>&1 >/dev/null)
! grep -q "warm-up" <<<"$err" && grep -qF '"warmup": 0,' "$tmp/bw.json" && ok "bench --no-warmup: none" \
  || bad "bench --no-warmup: $err"
# -d: the tests at a depth (that many tokens in the cache first), in the table's test column and the JSON
out=$("$MOET" bench --synthetic mini -p 4 -n 2 -d 24 --reps 1 -t 1 --json "$tmp/bd.json" 2>/dev/null)
grep -q "| pp4 @ d24 |" <<<"$out" && grep -q "| tg2 @ d24 |" <<<"$out" && grep -qF '"depth": 24,' "$tmp/bd.json" \
  && ok "bench -d: depth in the table and JSON" || bad "bench -d: $out $(cat "$tmp/bd.json")"
grep -qF '"kv_type": "f32",' "$tmp/bd.json" && ok "bench JSON: kv_type f32 by default" || bad "bench kv_type: $(cat "$tmp/bd.json")"
# --kv-type f16: the cache in f16, said in the table's test column and the JSON
out=$("$MOET" bench --synthetic mini -p 4 -n 2 -d 8 --kv-type f16 --reps 1 -t 1 --json "$tmp/bk.json" 2>/dev/null)
grep -q "| tg2 @ d8 kv f16 |" <<<"$out" && grep -qF '"kv_type": "f16",' "$tmp/bk.json" \
  && ok "bench --kv-type f16: in the table and JSON" || bad "bench --kv-type f16: $out $(cat "$tmp/bk.json")"
"$MOET" bench --synthetic mini --kv-type q4 >/dev/null 2>&1 && bad "--kv-type q4 accepted" || ok "--kv-type q4 refused"
"$MOET" bench --synthetic mini -d -1 >/dev/null 2>&1 && bad "bench -d -1 accepted" || ok "bench -d -1 refused"
# Delta gate: tau = 0 is the base alone and tau = 1 is base + delta everywhere, bit for bit (saved logits equal).
if [ -f "$SHARED/data/dev.txt" ]; then
  for cfg in "off 0" "gate 0" "on 0" "gate 1"; do
    set -- $cfg
    "$MOET" perplexity -m "$MODEL" -f "$SHARED/data/dev.txt" --ctx 32 --chunks 1 --experts w2+nvfp4 --delta $1 --tau $2 \
      --save-logits "$tmp/g-$1-$2.kld" >/dev/null 2>&1 || bad "gate run $1 $2"
  done
  cmp -s "$tmp/g-off-0.kld" "$tmp/g-gate-0.kld" && ok "gate tau=0 equals off bit for bit" || bad "gate tau=0 != off"
  cmp -s "$tmp/g-on-0.kld" "$tmp/g-gate-1.kld" && ok "gate tau=1 equals on bit for bit" || bad "gate tau=1 != on"
  cmp -s "$tmp/g-off-0.kld" "$tmp/g-on-0.kld" && bad "delta changed nothing" || ok "delta changes the logits"
fi
exit $fail
