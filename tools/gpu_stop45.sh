#!/usr/bin/env bash
# gpu_stop45.sh — stop 45's second device call: tools/gpu_kv_auto.sh (the session tests with f16 as CUDA's auto
# KV), the split attention's KS 3 (next step's K loads over this step's products) against KS 2 on f16 pools (the op
# alone, then tg32 of the 30b shape at depths 4096 and 16384, two rounds), moe-mini-a's headline bench, and stop
# 40's wgmma grouped products (MOET_MOE_WG=1, 2) against the default (the MoE op table, pp512 of the 30b shape, two
# rounds). Pack: tests/models/*/model.safetensors aside, SHARED=1 BINS="moet test_ops test_logits test_batch
# test_kv test_cuda" bash tools/gpu_carry.sh BUILD.
bash tools/gpu_kv_auto.sh
. tools/gpu_setup.sh ks3
for ks in 3 2; do
  MOET_ATTN_SPLITK=1 MOET_ATTN_SPLITK_KS=$ks MOET_PERF_KV=f16 MOET_PERF_ONLY=attn timeout 100 .carry/bin/test_ops cuda --perf > $R/perf-f16-ks$ks.txt 2>&1
  echo "== f16 KS $ks"; grep -A11 "decode attention" $R/perf-f16-ks$ks.txt | tail -10
done
pk
for r in 1 2; do for d in 4096 16384; do for ks in 3 2; do
  echo "r$r d $d KS $ks: $(MOET_ATTN_SPLITK_KS=$ks timeout 100 .carry/bin/moet bench --synthetic qwen3-30b-a3b --device cuda --kv-type f16 -p 0 -n 32 -d $d --reps 2 --json $R/tg-d$d-ks$ks-r$r.json 2>$R/tg.err | tail -1)"
done; done; done
pk
. tools/gpu_setup.sh headline
echo "moe-mini-a: $(timeout 60 .carry/bin/moet bench -m models/moe-mini-a --device cuda -p 512 -n 128 --reps 3 --json $R/bench-moe-mini-a.json 2>$R/mini-a.err | tail -2 | tr '\n' ' ')"; pk
. tools/gpu_setup.sh wg
MOET_PERF_ONLY=moe timeout 150 .carry/bin/test_ops cuda --perf > $R/moe-perf.txt 2>&1
grep -E "^moe " $R/moe-perf.txt | grep -v " 1 " | head -30; pk
for r in 1 2; do for s in "" "MOET_MOE_WG=1" "MOET_MOE_WG=2"; do
  echo "r$r pp512 ${s:-default}: $(env $s timeout 100 .carry/bin/moet bench --synthetic qwen3-30b-a3b --device cuda -p 512 -n 0 --reps 3 --json $R/pp-${s:-default}-r$r.json 2>>$R/pp.err | tail -1)"
done; done; pk
