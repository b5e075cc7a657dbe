#!/usr/bin/env bash
# gpu_stop45.sh — stop 45's second device call, most needed first (each part packed into $OUT/res.tar.xz as it ends):
#   1. the GPU test suite's correctness half (tools/gpu_check.sh TESTS=1, no perf, benches or ncu) on a build whose
#      CUDA `auto` KV cache is f16 (runtime/kv.c; the tests that compare with fp32 references pin f32 since this
#      stop, test_cuda checks graph replay = eager on the f16 default, test_logits / test_kv the type auto takes);
#   2. tg32 of the 30b shape at depths 0 and 4096 with the default cache and with MOET_KV_AUTO_CUDA=f32;
#   3. the split attention's KS 3 (the next step's K loads over this step's products) against KS 2 on f16 pools:
#      the op alone, then tg32 at depths 4096 and 16384;
#   4. stop 40's wgmma grouped products (MOET_MOE_WG=1, 2) against the default: the MoE op table, pp512 of the 30b;
#   5. moe-mini-a's headline bench.
# Pack: moe-mini-b's weights aside (the tree and all eight binaries must fit the call), then
#   bash tools/gpu_carry.sh BUILD   (a -DMOET_SHARED_LIB=ON build; SHARED=1 does not fit beside them)
. tools/gpu_setup.sh suite
TESTS=1 PERF=0 BENCH=0 NCU=0 OUT=$R/suite bash tools/gpu_check.sh > $R/suite.txt 2>&1; echo "suite rc $?" >> $R/suite.txt
grep -E "^== |rc=|FAIL|SKIP|suite rc" $R/suite.txt | grep -v "rc=0" | head -40; grep -c "rc=0" $R/suite.txt
pk
. tools/gpu_setup.sh kvauto
for d in 0 4096; do for e in "" "MOET_KV_AUTO_CUDA=f32"; do
  echo "tg32 d$d ${e:-auto}: $(env $e timeout 100 .carry/bin/moet bench --synthetic qwen3-30b-a3b --device cuda -p 0 -n 32 -d $d \
    --reps 2 --json $R/tg-d$d-${e:+f32}.json 2>>$R/tg.err | tail -1)"
done; done
pk
. tools/gpu_setup.sh ks3
for ks in 3 2; do
  MOET_ATTN_SPLITK=1 MOET_ATTN_SPLITK_KS=$ks MOET_PERF_KV=f16 MOET_PERF_ONLY=attn timeout 100 .carry/bin/test_ops cuda --perf > $R/perf-f16-ks$ks.txt 2>&1
  echo "== f16 KS $ks"; grep -A11 "decode attention" $R/perf-f16-ks$ks.txt | tail -10
done
pk
for d in 4096 16384; do for ks in 3 2 3 2; do
  echo "d $d KS $ks: $(MOET_ATTN_SPLITK_KS=$ks timeout 100 .carry/bin/moet bench --synthetic qwen3-30b-a3b --device cuda --kv-type f16 -p 0 -n 32 -d $d --reps 1 --json $R/tg-d$d-ks$ks-$RANDOM.json 2>>$R/tg.err | tail -1)"
done; done
pk
. tools/gpu_setup.sh wg
MOET_PERF_ONLY=moe timeout 150 .carry/bin/test_ops cuda --perf > $R/moe-perf.txt 2>&1
grep -E "^moe " $R/moe-perf.txt | grep -v " 1 " | head -30; pk
for s in "" "MOET_MOE_WG=1" "MOET_MOE_WG=2" "MOET_MOE_WG=2" "MOET_MOE_WG=1" ""; do
  echo "pp512 ${s:-default}: $(env $s timeout 100 .carry/bin/moet bench --synthetic qwen3-30b-a3b --device cuda -p 512 -n 0 --reps 3 --json $R/pp-${s:-default}-$RANDOM.json 2>>$R/pp.err | tail -1)"
done; pk
. tools/gpu_setup.sh headline
echo "moe-mini-a: $(timeout 60 .carry/bin/moet bench -m models/moe-mini-a --device cuda -p 512 -n 128 --reps 3 --json $R/bench-moe-mini-a.json 2>$R/mini-a.err | tail -2 | tr '\n' ' ')"; pk
