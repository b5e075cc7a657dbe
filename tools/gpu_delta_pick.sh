#!/usr/bin/env bash
# gpu_delta_pick.sh — stop 44's delta on the heavy picks on one device call: the checks (test_ops cuda: every delta
# path with a pick ratio against the float64 per-pick reference; test_delta-like bit-identities on the GPU: greedy
# ids of a moe-mini-c W2 + NVFP4 pack with --delta pick R 0 = on and R 1000 = off), then tg128 of the 30b shape with
# the delta on every pick, on the picks of R 0.8 and 1.0, and the base alone (the bytes a step saves when the decode
# kernels skip a slot's residual), and pp512 with R 0.8 against on (prefill reads every used expert's residual
# anyway). Everything in $OUT/res.tar.xz. Pack first: tests/models/*/model.safetensors aside, QPACK=/tmp/c.gguf
# (moet quantize -m ../shared/models/moe-mini-c -o /tmp/c.gguf --experts w2+nvfp4 --calib CALIB: gpu_carry.sh takes
# /tmp/c.delta.gguf beside it too; mini-c: the CUDA delta needs widths of 128s) BINS="moet test_ops" bash
# tools/gpu_carry.sh BUILD (~45 MB).
. tools/gpu_setup.sh pick
(timeout 300 .carry/bin/test_ops cuda > $R/test_ops.txt 2>&1; echo "rc $?" >> $R/test_ops.txt)
grep -E "delta pick|FAIL|FATAL|^rc" $R/test_ops.txt | grep -v " cpu " | tail -30
pk
P=
if [ -f .carry/q/pack.gguf.xz ] && [ -f .carry/q/pack.delta.gguf.xz ]; then
  P=/tmp/p.gguf; xz -dc .carry/q/pack.gguf.xz > $P; xz -dc .carry/q/pack.delta.gguf.xz > /tmp/p.delta.gguf
fi
if [ -n "$P" ]; then
  for a in "on" "pick --delta-pick 0" "off" "pick --delta-pick 1000" "pick"; do
    echo "$a: $(timeout 60 .carry/bin/moet run -m $P --device cuda --prompt-ids "5 6 7 8 9" -n 24 --temp 0 --print-ids \
      --ignore-eos --delta $a 2>$R/run.err | tr '\n' ' ')" | tee -a $R/run-ids.txt
  done
fi
pk
for c in "on 0" "on 0.8" "on 1.0" "off 0"; do set -- $c
  d=$1; [ $d = off ] && ex=w2 || ex=w2+nvfp4
  echo "tg128 $ex pick $2: $(timeout 120 .carry/bin/moet bench --synthetic qwen3-30b-a3b --experts $ex --device cuda \
    -p 0 -n 128 --reps 3 --delta-pick $2 --json $R/tg-$ex-$2.json 2>$R/tg-$ex-$2.err | tail -1)"
done
for p in 0 0.8; do
  echo "pp512 pick $p: $(timeout 120 .carry/bin/moet bench --synthetic qwen3-30b-a3b --experts w2+nvfp4 --device cuda \
    -p 512 -n 0 --reps 3 --delta-pick $p --json $R/pp-$p.json 2>$R/pp-$p.err | tail -1)"
done
pk
