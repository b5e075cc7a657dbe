#!/usr/bin/env bash
# test_serve_gate.sh — the confidence gate in `moet serve` on a W2 pack with its NVFP4 delta pack: greedy completions
# of a one-token prompt with --delta gate --tau 0 equal --delta off, with --tau 1 equal --delta on (the gate also
# decides the prompt's last step, the only one here; also two requests batched together),
# off differs from on, and /metrics counts the checked and corrected steps; the expert cache serves the same
# completions, also where two batched rows route to more experts than its slots hold. --delta pick (the default):
# R 0 = on, a large R = off, batched rows as each alone.
# usage: test_serve_gate.sh MOET_BIN HF_MODEL_DIR
set -u
MOET=$1; MODEL=$2
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
tmp=$(mktemp -d); pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0; ok() { echo "ok   $1"; }; bad() { echo "FAIL $1"; fail=1; }
"$MOET" quantize -m "$MODEL" -o "$tmp/p.gguf" --experts w2+nvfp4 --no-calib -t 2 >/dev/null 2>"$tmp/q.log" \
  || { bad "quantize: $(tail -2 "$tmp/q.log")"; exit 1; }
port=$((20000 + RANDOM % 20000))
serve() {  # serve ARGS...: starts the server, waits for /health
  "$MOET" serve -m "$tmp/p.gguf" --port $port --max-seqs 2 -t 2 "$@" > "$tmp/serve.log" 2>&1 & pid=$!
  for i in $(seq 100); do curl -sf localhost:$port/health >/dev/null 2>&1 && return 0; sleep 0.1; done
  bad "server did not come up: $(tail -2 "$tmp/serve.log")"; return 1
}
stop() { kill -TERM $pid; wait $pid 2>/dev/null; pid=; port=$((port + 1)); }
req='{"prompt": [5], "max_tokens": 10, "temperature": 0, "ignore_eos": true}'
text() { curl -s localhost:$port/v1/completions -d "${1:-$req}" | grep -o '"text":"[^"]*"'; }
# two long requests of different routings (they overlap, so the server batches their steps)
reqA='{"prompt": [5], "max_tokens": 48, "temperature": 0, "ignore_eos": true}'
reqB='{"prompt": [7, 300], "max_tokens": 48, "temperature": 0, "ignore_eos": true}'
metric() { curl -s localhost:$port/metrics | grep "^$1 " | cut -d' ' -f2; }
serve --delta off && { off=$(text); offA=$(text "$reqA"); offB=$(text "$reqB"); stop; }
serve --delta on && { on=$(text); stop; }
serve --delta gate --tau 0 && { g0=$(text); c0=$(metric moet_gate_corrected_total); s0=$(metric moet_gate_steps_total); stop; }
serve --delta gate --tau 1 && {
  g1=$(text); c1=$(metric moet_gate_corrected_total); s1=$(metric moet_gate_steps_total)
  text > "$tmp/b1" & tp=$!; text > "$tmp/b2"; wait $tp
  b1=$(cat "$tmp/b1"); b2=$(cat "$tmp/b2"); stop; }
echo "off: $off"; echo "on:  $on"
[ -n "$off" ] && [ "$off" = "$g0" ] && ok "gate tau 0 = off" || bad "gate tau 0: $g0 vs off $off"
[ -n "$on" ] && [ "$on" = "$g1" ] && ok "gate tau 1 = on" || bad "gate tau 1: $g1 vs on $on"
[ "$off" != "$on" ] && ok "the delta changes the completion" || bad "off and on agree: the test cannot tell them apart"
[ "$b1" = "$on" ] && [ "$b2" = "$on" ] && ok "gate tau 1, two requests batched = on" || bad "batched gate: $b1 / $b2 vs $on"
# --delta pick (the default mode with a delta pack): R 0 = on, an R no pick reaches = off; the default R 0.8
# serves (two requests batched: the batch carries the rows' R)
serve --delta pick --delta-pick 0 && { p0=$(text); stop; }
serve --delta pick --delta-pick 1000 && { pbig=$(text); stop; }
serve && { pd=$(text); grep -q "delta pick" "$tmp/serve.log" && dm=pick || dm=$(grep -o "delta [a-z]*" "$tmp/serve.log")
  text "$reqA" > "$tmp/b1" & tp=$!; text "$reqB" > "$tmp/b2"; wait $tp; pa=$(cat "$tmp/b1"); pb=$(cat "$tmp/b2"); stop; }
serve --delta pick && { pa1=$(text "$reqA"); pb1=$(text "$reqB"); stop; }
[ -n "$on" ] && [ "$p0" = "$on" ] && ok "pick R 0 = on" || bad "pick R 0: $p0 vs on $on"
[ -n "$off" ] && [ "$pbig" = "$off" ] && ok "pick R 1000 = off" || bad "pick R 1000: $pbig vs off $off"
[ "$dm" = pick ] && [ -n "$pd" ] && ok "the default mode with a delta pack is pick: $pd" || bad "default mode: '$dm' ($pd)"
[ -n "$pa" ] && [ "$pa" = "$pa1" ] && [ "$pb" = "$pb1" ] && ok "pick, two requests batched = each alone" \
  || bad "pick batched: $pa / $pb vs alone $pa1 / $pb1"
[ "${c0:-x}" = 0 ] && [ "${s0:-0}" -gt 0 ] && ok "tau 0: $s0 steps checked, 0 corrected" || bad "tau 0 metrics: $s0 / $c0"
[ -n "${c1:-}" ] && [ "$c1" = "$s1" ] && [ "$c1" -gt 0 ] && ok "tau 1: $s1 steps checked, all corrected" || bad "tau 1 metrics: $s1 / $c1"
# the expert cache in the server: 48 of the 192 routed experts resident (a step of one token routes to 3 x 8)
serve --delta off --expert-slots 48 && { ec=$(text); fe=$(metric moet_expert_cache_fetched_total); re=$(metric moet_expert_cache_replayed_steps_total)
  eu=$(metric moet_expert_cache_uses_total); em=$(metric moet_expert_cache_misses_total); stop; }
[ -n "$off" ] && [ "$ec" = "$off" ] && [ "${fe:-0}" -gt 0 ] && [ "${re:-0}" -gt 0 ] && [ "${eu:-0}" -gt "${em:-0}" ] && [ "${em:-0}" -gt 0 ] \
  && ok "--expert-slots 48: the same completion, $fe experts fetched, $re steps run again, $em of $eu uses missed" \
  || bad "--expert-slots 48: '$ec' vs '$off', fetched ${fe:-?}, replays ${re:-?}, uses ${eu:-?}, misses ${em:-?}"
# 30 slots hold one token's 24 experts but not what two batched rows route to: the server decodes that step a
# sequence at a time instead of failing the requests
serve --delta off --expert-slots 30 && {
  text "$reqA" > "$tmp/c1" & tp=$!; text "$reqB" > "$tmp/c2"; wait $tp; stop; }
c1=$(cat "$tmp/c1"); c2=$(cat "$tmp/c2")
[ -n "$offA" ] && [ "$c1" = "$offA" ] && [ "$c2" = "$offB" ] && grep -q "one at a time" "$tmp/serve.log" \
  && ok "--expert-slots 30, two requests: batched steps that do not fit run a sequence at a time, same completions" \
  || bad "--expert-slots 30, two requests: '$c1' / '$c2' vs '$offA' / '$offB' ($(grep -c 'one at a time' "$tmp/serve.log") fallbacks)"
"$MOET" serve -m "$tmp/p.gguf" --port $port --delta-file "" --delta on > "$tmp/e" 2>&1 && bad "--delta on without a delta accepted" \
  || { grep -q "needs a delta" "$tmp/e" && ok "--delta on without a delta refused" || bad "no-delta error: $(tail -1 "$tmp/e")"; }
exit $fail
