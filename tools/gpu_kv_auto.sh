#!/usr/bin/env bash
# gpu_kv_auto.sh — the GPU session tests with f16 as CUDA's `auto` KV cache (MOET_KV_AUTO_CUDA=f16, runtime/kv.c),
# the run docs/design.md decision 17 waits for before `auto` becomes f16 on CUDA: test_logits (CUDA against
# transformers' fixture), test_batch, test_kv, test_cuda (CUDA against the CPU reference, whose `auto` stays f32),
# then tg32 of the 30b shape at depths 0 and 4096 with no --kv-type (its JSON names the cache the default took).
# Where a check fails, its log says by how much: the test's bound for f16 against f32 is what to settle. Everything
# in $OUT/res.tar.xz. Pack first: tests/models/*/model.safetensors aside, SHARED=1 BINS="moet test_logits test_batch
# test_kv test_cuda" bash tools/gpu_carry.sh BUILD.
. tools/gpu_setup.sh kvauto
export MOET_KV_AUTO_CUDA=f16
for t in test_logits test_batch test_kv test_cuda; do
  [ -x .carry/bin/$t ] && [ -f models/moe-mini-a/model.safetensors ] || { echo "$t: not carried"; continue; }
  if [ $t = test_logits ]; then a="models/moe-mini-a .carry/shared/reference_fp32.safetensors 16 1"; else a=models/moe-mini-a; fi
  timeout 150 .carry/bin/$t $a > $R/$t.txt 2>&1
  echo "$t (auto = f16 on CUDA): rc $? $(grep -c FAIL $R/$t.txt) FAIL $(grep FAIL $R/$t.txt | head -3 | cut -c1-160 | tr '\n' ' ')"
done
pk
for d in 0 4096; do
  echo "tg32 d$d auto: $(timeout 100 .carry/bin/moet bench --synthetic qwen3-30b-a3b --device cuda -p 0 -n 32 -d $d \
    --reps 2 --json $R/tg-d$d.json 2>$R/tg-d$d.err | tail -1)"
done
pk
