#!/usr/bin/env bash
# gpu_pending.sh — the short device call for code that was compiled but has not run on a GPU yet (stop 28: mla.cu,
# the bf16 mul_mat of any 16-byte width, MOET_OSS_TC, the gpt-oss synthetic shapes), in about five
# minutes; tools/gpu_check.sh is the whole GPU suite. Run after tools/gpu_carry.sh, on the device machine:
#     bash tools/gpu_pending.sh        (logs and bench JSONs under $OUT, or ./gpu-out)
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
B=.carry/bin
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
# the op harness: mla_attn (CUDA has the op with MOET_MLA_LATENT=1), bf16 48-column mul_mat, gpt-oss's W2 block on
# the tiled kernels (MOET_OSS_TC=1 inside)
MOET_MLA_LATENT=1 timeout 150 $B/test_ops cuda > "$out/ops.log" 2>&1; echo "test_ops cuda rc=$?"
grep "x48\|mla\|gpt-oss\|bias\|FAIL\|FATAL\|^ok" "$out/ops.log"
# DeepSeek-V3 (full keys and values, CUDA's default; then the latent cache) and gpt-oss against transformers, on CUDA
for fx in deepseek-mini gpt-oss-mini glm4moe-mini; do # the prompt lengths tests/CMakeLists.txt gives them
  p=24; [ $fx = glm4moe-mini ] && p=40
  $B/test_logits tests/models/$fx tests/models/$fx/reference_fp32.safetensors $p 0 2>&1 | tail -3
done
MOET_MLA_LATENT=1 $B/test_logits tests/models/deepseek-mini tests/models/deepseek-mini/reference_fp32.safetensors 24 0 2>&1 | tail -2
# stop 29: the sigmoid router by rank in gate/up (MOET_ROUTE_GU=1; test_ops checks it bit for bit against its own
# launch at E = 8): DeepSeek and GLM against transformers and against the CPU with it, then GLM-4.5-Air's A/B
for fx in deepseek-mini glm4moe-mini; do
  p=24; [ $fx = glm4moe-mini ] && p=40
  MOET_ROUTE_GU=1 $B/test_logits tests/models/$fx tests/models/$fx/reference_fp32.safetensors $p 0 2>&1 | tail -1
done
MOET_ROUTE_GU=1 MOET_DEVICE=cuda timeout 120 $B/test_arch models/moe-mini-a > "$out/arch-gu1.log" 2>&1
echo "test_arch cuda MOET_ROUTE_GU=1 rc=$?"; grep -i "FAIL" "$out/arch-gu1.log" | head -5
# CUDA vs CPU on random DeepSeek / gpt-oss / GLM / Mixtral checkpoints, the latent cache (vs full keys, batched)
MOET_MLA_LATENT=1 MOET_DEVICE=cuda timeout 120 $B/test_arch models/moe-mini-a > "$out/arch.log" 2>&1
echo "test_arch cuda (latent MLA) rc=$?"
grep -i "deepseek\|oss\|FAIL\|^ok" "$out/arch.log" | tail -8
# graph replay bit-identical, CUDA vs CPU
timeout 60 $B/test_cuda models/moe-mini-a 2>&1 | tail -2
[ "${QUICK:-0}" = 1 ] && exit 0 # QUICK=1: the correctness checks only (a short device window)
# DeepSeek-V3's first 8 layers, latent cache vs full keys and values; gpt-oss-20b per-slot vs tiled
MOET_MLA_LATENT=1 timeout 100 $B/moet bench --synthetic deepseek-v3:8 --device cuda -p 128 -n 32 --reps 1 -b 4 \
  --json "$out/bench-deepseek-v3-8.json" 2>&1 | grep "^|" | tail -3
timeout 100 $B/moet bench --synthetic deepseek-v3:8 --device cuda -p 128 -n 32 --reps 1 -b 4 \
  --json "$out/bench-deepseek-v3-8-naive.json" 2>&1 | grep "^|" | tail -3
for o in 0 1; do
  MOET_OSS_TC=$o timeout 80 $B/moet bench --synthetic gpt-oss-20b --device cuda -p 128 -n 64 --reps 1 -b 4 \
    --json "$out/bench-gpt-oss-20b-tc$o.json" 2>&1 | grep "^|" | tail -3
done
# stop 29: the biases in the products' store and the MLP onto the residual (GLM-4.5-Air: q/k/v biases, a shared
# expert, a dense first layer; compare its fraction of copy bandwidth with stop 26's 51% on an H100)
timeout 120 $B/moet bench --synthetic glm-4.5-air --device cuda -p 0 -n 128 --reps 2 \
  --json "$out/bench-glm-4.5-air.json" 2>&1 | grep "^|" | tail -2
# GLM-4.5-Air: the sigmoid router's routing in gate/up (MOET_ROUTE_GU=1) against its own launch
for i in 1 2; do for g in 0 1; do
  MOET_ROUTE_GU=$g timeout 100 $B/moet bench --synthetic glm-4.5-air --device cuda -p 0 -n 128 --reps 2 2>&1 |
    grep "tg128" | sed "s/^/MOET_ROUTE_GU=$g /"
done; done
