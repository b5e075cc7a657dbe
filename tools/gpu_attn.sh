#!/usr/bin/env bash
# gpu_attn.sh — one device call for decode attention over long contexts (stops 41-42): test_ops cuda (the attention
# checks with f32 and f16 pools, the long-context ones with MOET_ATTN_SPLITK=1), test_logits on the small fixtures
# in the tree (each with an f16-cache session beside the f32 one; DeepSeek's on the latent cache), the decode
# attention op alone at 128..32768 keys (test_ops --perf, MOET_PERF_ONLY=attn) for attention.cu's kernel and
# attn_split.cu's, f32 and f16 pools, then `moet bench -p 0 -n 32 -d D` of the 30b shape the same four ways
# (D = 0 4096 16384, or DEPTHS). Everything lands in $OUT/res.tar.xz (a call returns only a few files).
# Pack first, either BINS="moet test_ops test_logits" bash tools/gpu_carry.sh BUILD (models/moe-mini-a's weights
# aside: the small fixtures run) or SHARED=1 BINS="moet test_ops test_logits test_batch test_kv test_cuda" with
# tests/models/*/model.safetensors aside (moe-mini-a and the session tests run): the call takes ~66.6 MB.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
R=/tmp/res/attn; mkdir -p $R
pk() { tar -C /tmp -cJf "$out/res.tar.xz" res; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
(MOET_MLA_LATENT=1 timeout 240 .carry/bin/test_ops cuda > $R/test_ops.txt 2>&1; echo "rc $?" >> $R/test_ops.txt)
grep -E "attn long|FAIL|FATAL|^rc" $R/test_ops.txt | grep -v " cpu " | tail -24
grep -cE "f16" $R/test_ops.txt
if [ -x .carry/bin/test_logits ]; then
  for fx in moe-mini-b:40 mixtral-mini:40 glm4moe-mini:40 gpt-oss-mini:24 deepseek-mini:24; do
    m=${fx%%:*}; p=${fx##*:}
    [ -f tests/models/$m/model.safetensors ] || { echo "logits $m: SKIP (weights not in the tree)"; continue; }
    MOET_MLA_LATENT=1 timeout 60 .carry/bin/test_logits tests/models/$m tests/models/$m/reference_fp32.safetensors $p 0 \
      > $R/logits-$m.txt 2>&1
    echo "logits $m: rc $? $(grep -c FAIL $R/logits-$m.txt) FAIL; $(grep 'f16 KV' $R/logits-$m.txt | head -1 | cut -c1-150)"
  done
  if [ -f models/moe-mini-a/model.safetensors ] && [ -f .carry/shared/reference_fp32.safetensors ]; then
    timeout 120 .carry/bin/test_logits models/moe-mini-a .carry/shared/reference_fp32.safetensors 16 1 > $R/logits-a.txt 2>&1
    echo "logits moe-mini-a: rc $? $(grep -c FAIL $R/logits-a.txt) FAIL; $(grep 'f16 KV' $R/logits-a.txt | head -1 | cut -c1-150)"
  fi
fi
# the session paths on f16 caches (moe-mini-a in the tree): batched decode (attn_rows) vs single sessions, the
# prefix cache's copy on write, CUDA vs the CPU reference end to end
if [ -f models/moe-mini-a/model.safetensors ]; then
  for t in test_batch test_kv test_cuda; do
    [ -x .carry/bin/$t ] || continue
    timeout 120 .carry/bin/$t models/moe-mini-a > $R/$t.txt 2>&1
    echo "$t: rc $? $(grep -c FAIL $R/$t.txt) FAIL; $(grep -E 'caches|prefix cache:' $R/$t.txt | cut -c1-120 | tr '\n' ' ')"
  done
fi
pk
for m in "0 f32" "1 f32" "0 f16" "1 f16"; do  # splitk (0: attention.cu, 1: attn_split.cu), pool type
  set -- $m
  MOET_ATTN_SPLITK=$1 MOET_PERF_KV=$2 MOET_PERF_ONLY=attn timeout 120 .carry/bin/test_ops cuda --perf \
    > $R/attn-perf-splitk$1-$2.txt 2>&1
  echo "== splitk $1 $2"; grep -A11 "decode attention" $R/attn-perf-splitk$1-$2.txt | tail -10
done
pk
for d in ${DEPTHS:-0 4096 16384}; do for m in "0 f32" "1 f32" "0 f16" "1 f16"; do
  set -- $m
  echo "== d $d splitk $1 $2: $(MOET_ATTN_SPLITK=$1 timeout 100 .carry/bin/moet bench --synthetic qwen3-30b-a3b \
    --device cuda --kv-type $2 -p 0 -n 32 -d $d --reps 2 --json $R/tg-30b-d$d-s$1-$2.json 2>$R/tg-30b-d$d-s$1-$2.err | tail -1)"
done; done
pk
