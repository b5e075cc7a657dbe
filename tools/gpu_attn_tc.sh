#!/usr/bin/env bash
# gpu_attn_tc.sh — stop 43's decode attention kernels on one device call (QUICK=1: the f16 rows only): the checks (test_ops cuda: the split
# kernel's four ways of reading K, MOET_ATTN_SPLITK_KS=0..3; the session tests with the split kernel forced and
# K on tensor cores, so f16 sessions take it end to end), the op alone (test_ops --perf, f16 KS 0..3, f32 KS 0/1),
# Nsight Compute on the tensor-core kernel at 128 and 32768 keys, and tg32 of the 30b shape at depths 0, 4096 and
# 16384 (attention.cu's kernels, KS 1, KS 2; f32 and f16). Everything in $OUT/res.tar.xz. Pack first:
# tests/models/*/model.safetensors aside, SHARED=1 BINS="moet test_ops test_logits test_batch test_kv test_cuda"
# bash tools/gpu_carry.sh BUILD.
. tools/gpu_setup.sh tc
PERF=${QUICK:+"f16 3;f16 2;f16 1"}; IFS=';' read -r -a PC <<< "${PERF:-f16 3;f16 2;f16 1;f32 1;f16 0;f32 0}"
for c in "${PC[@]}"; do set -- $c
  MOET_ATTN_SPLITK=1 MOET_ATTN_SPLITK_KS=$2 MOET_PERF_KV=$1 MOET_PERF_ONLY=attn timeout 100 .carry/bin/test_ops cuda --perf \
    > $R/perf-$1-ks$2.txt 2>&1
  echo "== $1 KS $2"; grep -A11 "decode attention" $R/perf-$1-ks$2.txt | tail -10
done
pk
(timeout 240 .carry/bin/test_ops cuda > $R/test_ops.txt 2>&1; echo "rc $?" >> $R/test_ops.txt)
grep -E "attn long.* tc|FAIL|FATAL|^rc" $R/test_ops.txt | grep -v " cpu " | tail -24
pk
for t in test_logits test_batch test_kv test_cuda; do
  [ -x .carry/bin/$t ] && [ -f models/moe-mini-a/model.safetensors ] || continue
  if [ $t = test_logits ]; then a="models/moe-mini-a .carry/shared/reference_fp32.safetensors 16 1"; else a=models/moe-mini-a; fi
  MOET_ATTN_SPLITK=1 MOET_ATTN_SPLITK_KS=2 timeout 120 .carry/bin/$t $a > $R/$t-tc.txt 2>&1
  echo "$t (split, KS 2): rc $? $(grep -c FAIL $R/$t-tc.txt) FAIL; $(grep -E 'f16 KV|caches|prefix cache:' $R/$t-tc.txt | head -2 | cut -c1-140 | tr '\n' ' ')"
done
pk
for d in 0 4096 16384; do
  TGC=${QUICK:+"1 f16 3;1 f16 2"}; IFS=';' read -r -a TC <<< "${TGC:-1 f16 3;1 f16 2;1 f16 1;0 f16 0;0 f32 0;1 f32 1}"
  for c in "${TC[@]}"; do set -- $c
    echo "d $d splitk $1 $2 KS $3: $(MOET_ATTN_SPLITK=$1 MOET_ATTN_SPLITK_KS=$3 timeout 100 .carry/bin/moet bench \
      --synthetic qwen3-30b-a3b --device cuda --kv-type $2 -p 0 -n 32 -d $d --reps 2 --json $R/tg-d$d-s$1-$2-ks$3.json \
      2>$R/tg-d$d-s$1-$2-ks$3.err | tail -1)"
  done
done
pk
if [ -z "${QUICK:-}" ] && command -v ncu > /dev/null; then
  SEC="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
  for c in "2 128" "386 32768"; do set -- $c
    MOET_ATTN_SPLITK=1 MOET_ATTN_SPLITK_KS=2 MOET_PERF_KV=f16 MOET_PERF_ONLY=attn timeout 120 ncu -k "regex:k_attn_split" \
      -s $1 -c 1 $SEC --print-details all .carry/bin/test_ops cuda --perf > $R/ncu-tc-$2.txt 2>&1
    echo "== ncu KS 2 at $2 keys"
    grep -E "Duration|SM Active Cycles|Instructions Executed|Warp Cycles Per Issued|Registers Per|Compute \(SM\) Th|Memory Throughput  " $R/ncu-tc-$2.txt | head -12
  done
  pk
fi
