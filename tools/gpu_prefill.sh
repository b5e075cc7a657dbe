#!/usr/bin/env bash
# gpu_prefill.sh — one device call for the grouped (prefill) expert kernels and their options, most needed first
# (a call that runs out of time keeps what is already under $OUT; everything lands in $OUT/res.tar.xz and a short
# $OUT/summary.txt, since a call returns only a few files):
#   1. test_ops cuda (every option against the reference; the exact path at 1e-10, the one-f16 forms at 1e-6);
#   2. the MoE op table (test_ops --perf, MOET_PERF_ONLY=moe) of this build, and of the base build's libmoet.so
#      under the same test_ops when BASE_BUILD was packed;
#   3. pp512 A/B over OPTS (tools/gpu_ab.sh with PP=512: ';'-separated settings, `default`, `base`), two rounds;
#   4. with a W2 pack shipped (QPACK=FILE to tools/gpu_carry.sh: .carry/q/), perplexity and KLD of each OPTS
#      setting against the fp32-exact grouped products (MOET_MOE_X1=0) on the GPU, 40 windows of 512 tokens.
# Pack first, e.g. (stop 40: moe-mini-c quantized by `moet quantize --experts w2 --calib ../shared/data/train.txt.xz`):
#   QPACK=/tmp/mini-c-w2.gguf BINS="moet test_ops" BASE_BUILD=/tmp/base/build bash tools/gpu_carry.sh build-sm90so
# then on the device machine: OPTS="default;MOET_MOE_WG=1;MOET_MOE_WG=2" bash tools/gpu_prefill.sh
set -u
out=${OUT:-gpu-out}; R=/tmp/res; mkdir -p "$out" $R
tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
opts=${OPTS:-default}
pack() { tar -C /tmp -cJf "$out/res.tar.xz" res; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $R/gpu.txt > "$out/summary.txt"
(timeout 180 .carry/bin/test_ops cuda > $R/test_ops.txt 2>&1; echo "rc $?" >> $R/test_ops.txt)
grep -E "FAIL|FATAL|^rc " $R/test_ops.txt | tail -8 >> "$out/summary.txt"
MOET_PERF_ONLY=moe timeout 180 .carry/bin/test_ops cuda --perf > $R/moe-perf.txt 2>&1
grep -E "^moe " $R/moe-perf.txt | grep -v " 1 " | sed 's/^/new  /' >> "$out/summary.txt"
if [ -f .carry/base.tar.xz ]; then
  mkdir -p /tmp/base && tar -C /tmp/base -xJf .carry/base.tar.xz
  LD_LIBRARY_PATH=/tmp/base/lib:$PWD/.carry/lib MOET_PERF_ONLY=moe timeout 180 .carry/bin/test_ops cuda --perf \
    > $R/moe-perf-base.txt 2>&1
  grep -E "^moe w2 \(" $R/moe-perf-base.txt | grep -v " 1 " | sed 's/^/base /' >> "$out/summary.txt"
fi
pack
ENVS="$opts" PP=512 TG=4 ROUNDS=1 SHAPES="${SHAPES:-qwen3-30b-a3b qwen3-235b-a22b}" OUT=$R/pp bash tools/gpu_ab.sh > /dev/null 2>&1
rev=$(echo "$opts" | tr ';' '\n' | tac | paste -sd';')
ENVS="$rev" PP=512 TG=4 ROUNDS=1 SHAPES="${SHAPES:-qwen3-30b-a3b qwen3-235b-a22b}" OUT=$R/pp2 bash tools/gpu_ab.sh > /dev/null 2>&1
cat $R/pp/ab.txt $R/pp2/ab.txt 2>/dev/null | awk -F'\t' '{print "pp", $1, $2, $4}' >> "$out/summary.txt"
pack
if [ -f .carry/q/pack.gguf.xz ]; then
  xz -dc .carry/q/pack.gguf.xz > /tmp/q.gguf
  P=".carry/bin/moet perplexity -m /tmp/q.gguf -f .carry/q/text.txt --ctx 512 --chunks 40 --device cuda --json"
  MOET_MOE_X1=0 $P --save-logits /tmp/exact.bin > $R/ppl-exact.json 2> $R/ppl-exact.err
  IFS=';' read -r -a sets <<< "$opts"
  for s in "${sets[@]}"; do
    [ "$s" = base ] && continue
    [ "$s" = default ] && s=
    tag=$(echo "${s:-default}" | sed 's/MOET_//g; s/ /,/g; s/=/_/g')
    env $s $P --kld-base /tmp/exact.bin > $R/ppl-$tag.json 2> $R/ppl-$tag.err
    echo "kld $tag $(cat $R/ppl-$tag.json)" >> "$out/summary.txt"
  done
  pack
fi
cat "$out/summary.txt"
