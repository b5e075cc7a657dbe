#!/usr/bin/env bash
# gpu_headline.sh — the README's CUDA headline rows from the current build on one device call: pp512 / tg128 and
# batched decode (4, 16, 64 sequences) of the synthetic qwen3-30b-a3b and qwen3-235b-a22b (W2 experts), and
# moe-mini-a's where its weights travelled. JSONs in $OUT/res.tar.xz (headline/), to copy into bench/results/cuda/
# when the card is the H200 (the README quotes GPU timings from the H200 only). Pack: tools/gpu_carry.sh BUILD (moet).
. tools/gpu_setup.sh headline
for s in qwen3-30b-a3b:150 qwen3-235b-a22b:240; do n=${s%%:*}
  echo "$n: $(timeout ${s##*:} .carry/bin/moet bench --synthetic $n --device cuda -p 512 -n 128 --reps 3 -b 4,16,64 \
    --json $R/bench-$n.json 2>$R/$n.err | tail -4 | tr '\n' ' ')"; pk
done
if [ -f models/moe-mini-a/model.safetensors ]; then
  echo "moe-mini-a: $(timeout 60 .carry/bin/moet bench -m models/moe-mini-a --device cuda -p 512 -n 128 --reps 3 \
    --json $R/bench-moe-mini-a.json 2>$R/mini-a.err | tail -2 | tr '\n' ' ')"; pk
fi
