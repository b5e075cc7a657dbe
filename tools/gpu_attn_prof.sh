#!/usr/bin/env bash
# gpu_attn_prof.sh — why attn_split.cu's decode kernel costs ~20 us at a few keys (stop 42, H100: 24 us at 128 keys
# where attention.cu's took 7.6; tg32 at depth 0 lost ~21 us a layer the same way): the op alone with and without
# programmatic dependent launch (MOET_PDL=0), then Nsight Compute's speed-of-light, occupancy, warp-state, scheduler,
# memory and source-counter sections for one launch at 128 keys and one at 32768 (test_ops --perf, 30b 32/4x128),
# and attention.cu's kernel at 128 keys beside them. Logs in $OUT (res.tar.xz). Pack first, e.g.
# BINS="moet test_ops" bash tools/gpu_carry.sh BUILD.
. tools/gpu_setup.sh prof
for m in "1 1" "1 0" "0 1"; do set -- $m  # splitk, pdl
  MOET_ATTN_SPLITK=$1 MOET_PDL=$2 MOET_PERF_ONLY=attn timeout 100 .carry/bin/test_ops cuda --perf > $R/perf-s$1-pdl$2.txt 2>&1
  echo "== splitk $1 pdl $2"; grep -A6 "decode attention" $R/perf-s$1-pdl$2.txt | tail -5
done
for m in "f32" "f16"; do  # K rows staged by cp.async (MOET_ATTN_SPLITK_KS=1) vs a lane's row in registers
  for ks in 1 0; do
    MOET_ATTN_SPLITK=1 MOET_ATTN_SPLITK_KS=$ks MOET_PERF_KV=$m MOET_PERF_ONLY=attn timeout 100 .carry/bin/test_ops cuda --perf > $R/perf-ks$ks-$m.txt 2>&1
    echo "== splitk 1 ks $ks $m"; grep -A11 "decode attention" $R/perf-ks$ks-$m.txt | tail -10
  done
done
pk
for k in 64; do  # more splits at short spans: is the cost a CTA's (fixed) or a chunk's (serial)?
  MOET_ATTN_SPLITK=1 MOET_ATTN_SPLITK_KMIN=$k MOET_PERF_ONLY=attn timeout 100 .carry/bin/test_ops cuda --perf > $R/perf-kmin$k.txt 2>&1
  echo "== splitk 1 kmin $k"; grep -A6 "decode attention" $R/perf-kmin$k.txt | tail -5
done
pk
# the checks, both ways of reading K (check_attn_long runs MOET_ATTN_SPLITK_KS=0 and 1 on CUDA)
if [ "${TESTS:-1}" = 1 ]; then
  (timeout 240 .carry/bin/test_ops cuda > $R/test_ops.txt 2>&1; echo "rc $?" >> $R/test_ops.txt)
  grep -E "attn long.* ks|FAIL|FATAL|^rc" $R/test_ops.txt | grep -v " cpu " | tail -30
  pk
fi
command -v ncu > /dev/null || { echo "gpu_attn_prof: no ncu"; exit 0; }
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
# the perf loop launches each (shape, keys) 6 x 16 times: skip 2 (warm), or 4 x 96 + 2 for 32768 keys
for c in "1 k_attn_split 2 128 0" "1 k_attn_split 2 128 1" "1 k_attn_split 386 32768 0" "1 k_attn_split 386 32768 1" "0 k_attn_decode 2 128 0"; do set -- $c
  MOET_ATTN_SPLITK=$1 MOET_ATTN_SPLITK_KS=$5 MOET_PERF_ONLY=attn timeout 150 ncu -k "regex:$2" -s $3 -c 1 $SEC --print-details all \
    .carry/bin/test_ops cuda --perf > $R/ncu-$2-$4-ks$5.txt 2>&1
  echo "== ncu $2 at $4 keys ks $5"
  grep -E "Duration|Elapsed Cycles|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|stalled|L1/TEX Hit|Mem Busy|Memory Throughput|Compute \(SM\)" $R/ncu-$2-$4-ks$5.txt | head -30
  pk
done
