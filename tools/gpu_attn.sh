#!/usr/bin/env bash
# gpu_attn.sh — one device call for decode attention over long contexts (stop 41): test_ops cuda (the long-context
# attention checks run with MOET_ATTN_SPLITK=1), the decode attention op alone at 128..32768 keys (test_ops --perf,
# MOET_PERF_ONLY=attn) with attention.cu's kernel, attn_split.cu's, and attn_split.cu's with 128 keys a split at least,
# then `moet bench -p 0 -n 32 -d D` of the 30b shape both ways (D = 0 4096 16384, or DEPTHS). Everything lands in
# $OUT/res.tar.xz (a call returns only a few files). Pack first: BINS="moet test_ops" bash tools/gpu_carry.sh BUILD
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
R=/tmp/res/attn; mkdir -p $R
pk() { tar -C /tmp -cJf "$out/res.tar.xz" res; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
(timeout 240 .carry/bin/test_ops cuda > $R/test_ops.txt 2>&1; echo "rc $?" >> $R/test_ops.txt)
grep -E "attn long|FAIL|FATAL|^rc" $R/test_ops.txt | grep -v " cpu " | tail -30
pk
for m in 0 1 128; do  # 0: attention.cu; 1: attn_split.cu; 128: attn_split.cu, 128 keys a split at least
  MOET_ATTN_SPLITK=${m/128/1} MOET_ATTN_SPLITK_KMIN=$m MOET_PERF_ONLY=attn timeout 120 .carry/bin/test_ops cuda --perf \
    > $R/attn-perf-splitk$m.txt 2>&1
  echo "== splitk $m"; grep -A11 "decode attention" $R/attn-perf-splitk$m.txt | tail -10
done
pk
for d in ${DEPTHS:-0 4096 16384}; do for m in 0 1; do
  echo "== d $d splitk $m: $(MOET_ATTN_SPLITK=$m timeout 100 .carry/bin/moet bench --synthetic qwen3-30b-a3b --device cuda \
    -p 0 -n 32 -d $d --reps 2 --json $R/tg-30b-d$d-s$m.json 2>$R/tg-30b-d$d-s$m.err | tail -1)"
done; done
pk
