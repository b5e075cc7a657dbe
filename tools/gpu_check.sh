#!/usr/bin/env bash
# gpu_check.sh — the GPU half of the test suite, run on the device machine (tools/gpu_carry.sh prepares .carry/).
# Runs the CUDA op harness, CUDA vs CPU end to end (graphs vs eager), the transformers logits tests on the GPU,
# and the op harness's perf mode, the benches and (NCU=1, the default) the per-kernel decode table; logs under $OUT
# (or ./gpu-out). Exit status: non-zero if a test failed. Since stop 30 the tree and all eight binaries fit the call's
# 64 MiB only from a -DMOET_SHARED_LIB=ON build (libmoet.so once: ~5.4 MB shipped, the static build's ~5.8 MB did
# not fit) and without moe-mini-a's reference (tools/gpu_carry.sh leaves it out unless SHARED=1): logits_a_cuda is
# then skipped (moe-mini-b's, mixtral's and GLM's fixtures are in the tree and run).
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
bin=.carry/bin
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz  # gpu_carry.sh ships the binaries compressed
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
fail=0
# A binary or file that tools/gpu_carry.sh did not ship (BINS, SHARED) is skipped with a message, not failed.
run() {
  local name=$1; shift
  for a in "$@"; do case $a in "$bin"/*|.carry/*) [ -e "$a" ] || { echo "== $name: SKIP ($a not carried)"; return 0; } ;; esac; done
  echo "== $name: $*"; "$@" > "$out/$name.log" 2>&1; local rc=$?; tail -n "${TAIL:-6}" "$out/$name.log"; echo "   rc=$rc"; [ $rc -eq 0 ] || fail=1
}
# TESTS=0 skips the correctness half (a second call of a short device window: perf and benches only)
if [ "${TESTS:-1}" = 1 ]; then
TAIL=40 run ops_cuda env MOET_MLA_LATENT=1 $bin/test_ops cuda  # (CUDA's mla_attn is opt-in: MOET_MLA_LATENT)
TAIL=12 run cuda_vs_cpu $bin/test_cuda models/moe-mini-a
run logits_a_cuda $bin/test_logits models/moe-mini-a .carry/shared/reference_fp32.safetensors 16 1
TAIL=3 run batch_cuda $bin/test_batch models/moe-mini-a
TAIL=3 run kv_cuda $bin/test_kv models/moe-mini-a
run logits_b_cuda $bin/test_logits tests/models/moe-mini-b tests/models/moe-mini-b/reference_fp32.safetensors 40 0
# Mixtral (no q/k norm) and GLM-4.5 (sigmoid router, shared expert, partial RoPE, biases) against transformers
run logits_mixtral_cuda $bin/test_logits tests/models/mixtral-mini tests/models/mixtral-mini/reference_fp32.safetensors 40 0
run logits_glm_cuda $bin/test_logits tests/models/glm4moe-mini tests/models/glm4moe-mini/reference_fp32.safetensors 40 0
for fx in deepseek-mini gpt-oss-mini; do # DeepSeek-V3 (MLA, YaRN) and gpt-oss (sinks, windows, biases), once made
  [ -f tests/models/$fx/reference_fp32.safetensors ] &&
    run logits_${fx}_cuda $bin/test_logits tests/models/$fx tests/models/$fx/reference_fp32.safetensors 24 0
done
[ -f tests/models/deepseek-mini/reference_fp32.safetensors ] && run logits_deepseek-mini_latent_cuda \
  env MOET_MLA_LATENT=1 $bin/test_logits tests/models/deepseek-mini tests/models/deepseek-mini/reference_fp32.safetensors 24 0
# (the FP4 delta end to end: tests/test_delta.sh runs in CI on the CPU; on the GPU its model, moe-mini-b, is not in
# the tiled layout the delta kernels need (widths multiples of 128), so test_ops's tiled delta shapes check them)
# the expert cache on the GPU: 40 of moe-mini-a's 256 experts in device slots (fp32 kernels), then a W2 pack with
# its delta (tiled slots, residuals beside them), each bit-identical to the resident model
# Mixtral and GLM-4.5 on the GPU: their tensor layouts and W2 packs, GLM against the CPU
MOET_DEVICE=cuda TAIL=4 run arch_cuda $bin/test_arch models/moe-mini-a
MOET_DEVICE=cuda TAIL=4 run arch_cuda_mla_latent env MOET_MLA_LATENT=1 $bin/test_arch models/moe-mini-a
TAIL=6 run ecache_cuda $bin/test_ecache models/moe-mini-a cuda
# (moe-mini-a's W2 pack is not tiled either: no delta pack for it here)
EXPERTS=w2 TAIL=6 run ecache_pack_cuda bash tests/test_ecache_pack.sh $bin/moet $bin/test_ecache models/moe-mini-a cuda
EXPERTS=w2 TAIL=6 run ecache_pack_pinned bash tests/test_ecache_pack.sh $bin/moet $bin/test_ecache models/moe-mini-a cuda pinned
# Q8_0 dense projections (a pack's --dense q8_0): CUDA's q8t GEMV against the CPU, perplexity and KLD
TAIL=3 run q8dense_cuda bash tests/test_q8dense.sh $bin/moet models/moe-mini-a tests/fixtures/ppl_window.txt cuda
# the server on the GPU: the real-client tests when the image has Node.js (carry tests/server/node_modules), else curl
if command -v node >/dev/null 2>&1 && [ -d tests/server/node_modules ]; then
  TAIL=60 run server_clients node tests/server/test_server.mjs $bin/moet models/moe-mini-a tests/fixtures/ppl_window.txt
else
  echo "== server: no Node.js on this machine: curl smoke test only"
  ( $bin/moet serve --port 18123 > "$out/serve.log" 2>&1 & echo $! > "$out/serve.pid" )
  for i in $(seq 50); do curl -sf localhost:18123/health >/dev/null 2>&1 && break; sleep 0.2; done
  curl -s localhost:18123/v1/completions -d '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}' > "$out/serve-completion.json"
  curl -sN localhost:18123/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true}' > "$out/serve-stream.txt"
  kill -TERM "$(cat "$out/serve.pid")"; sleep 1
  cat "$out/serve-completion.json"; echo; tail -c 300 "$out/serve-stream.txt"; tail -3 "$out/serve.log"
  # throughput of 16 concurrent 128-token requests: one running sequence at a time, then all 16 batched
  for seqs in 1 16; do
    ( $bin/moet serve --port 18124 --max-seqs $seqs --queue 64 > "$out/serve-$seqs.log" 2>&1 & echo $! > "$out/serve.pid" )
    for i in $(seq 50); do curl -sf localhost:18124/health >/dev/null 2>&1 && break; sleep 0.2; done
    curl -s localhost:18124/v1/completions -d '{"prompt": "warm", "max_tokens": 8}' > /dev/null
    t0=$(date +%s.%N)
    seq 16 | xargs -P 16 -I{} curl -s localhost:18124/v1/completions \
      -d '{"prompt": "Chapter {}. The", "max_tokens": 128, "ignore_eos": true, "temperature": 0.8}' -o "$out/tp-{}.json"
    t1=$(date +%s.%N)
    cat "$out"/tp-*.json | grep -o '"completion_tokens":[0-9]*' | cut -d: -f2 |
      awk -v s=$seqs -v a=$t0 -v b=$t1 '{n += $1} END {printf "serve throughput, --max-seqs %d: %d tokens in %.2f s = %.0f tok/s\n", s, n, b - a, n / (b - a)}' |
      tee -a "$out/serve-throughput.txt"
    rm -f "$out"/tp-*.json
    kill -TERM "$(cat "$out/serve.pid")"; sleep 1
  done
fi
fi  # TESTS
[ "${PERF:-1}" = 1 ] && TAIL=12 run ops_perf $bin/test_ops cuda --perf
if [ "${BENCH:-1}" = 1 ]; then
  for shape in ${SHAPES:-qwen3-30b-a3b qwen3-235b-a22b}; do
    TAIL=4 run bench_$shape $bin/moet bench --synthetic $shape --device cuda -p 512 -n 128 --reps 3 -b ${BATCHES:-4,16,64} --json "$out/bench-$shape.json"
  done
  # GLM-4.5-Air's shape: the sigmoid router (its own routing launch), a shared expert, q/k/v biases, half-rotated
  # heads (the attention's composed path), a dense first layer
  TAIL=4 run bench_glm_air $bin/moet bench --synthetic glm-4.5-air --device cuda -p 512 -n 128 --reps 3 \
    --json "$out/bench-glm-4.5-air.json"
  # its sigmoid router in gate/up (one warp a CTA) against its own launch (the default): stop 26 measured 0.988x
  TAIL=3 run bench_glm_air_route_gu1 env MOET_ROUTE_GU=1 $bin/moet bench --synthetic glm-4.5-air --device cuda -p 0 \
    -n 128 --reps 2
  # gpt-oss's shapes (sinks, sliding windows, biases, the clamped SwiGLU; experts 2880 wide, tiled for the
  # tensor-core kernels; slow at hundreds of tokens, hence -p 128), then gpt-oss-20b on moe.cu's per-slot kernels
  # (MOET_OSS_TC=0); and DeepSeek-V3's first 8 layers (3 dense, 5 MoE) on the latent cache (mla.cu,
  # MOET_MLA_LATENT=1) and on full keys and values (CUDA's default: faster at these lengths). NEW=0 skips these.
  if [ "${NEW:-1}" = 1 ]; then
    for shape in gpt-oss-20b gpt-oss-120b; do
      TAIL=4 run bench_$shape $bin/moet bench --synthetic $shape --device cuda -p 128 -n 64 --reps 1 -b 4 \
        --json "$out/bench-$shape.json"
    done
    TAIL=4 run bench_gpt-oss-20b_perslot env MOET_OSS_TC=0 $bin/moet bench --synthetic gpt-oss-20b --device cuda \
      -p 128 -n 64 --reps 1 -b 4 --json "$out/bench-gpt-oss-20b-perslot.json"
    TAIL=4 run bench_deepseek_v3_8 env MOET_MLA_LATENT=1 $bin/moet bench --synthetic deepseek-v3:8 --device cuda \
      -p 128 -n 64 --reps 1 -b 4 --json "$out/bench-deepseek-v3-8.json"
    TAIL=4 run bench_deepseek_v3_8_naive $bin/moet bench --synthetic deepseek-v3:8 --device cuda \
      -p 128 -n 64 --reps 1 -b 4 --json "$out/bench-deepseek-v3-8-naive.json"
  fi
  TAIL=4 run bench_mini_a $bin/moet bench -m models/moe-mini-a --device cuda -p 512 -n 128 --reps 3 --json "$out/bench-moe-mini-a.json"
  # the attention projections and lm_head as Q8_0 (a pack's --dense q8_0): at batch 1 ~2.4 of a 30b token's ~3.0 GB
  # are these BF16 weights (W2 made the experts the small part), so Q8_0 takes a decode step to ~1.8 GB
  TAIL=4 run bench_30b_q8dense $bin/moet bench --synthetic qwen3-30b-a3b --dense q8_0 --device cuda -p 512 -n 128 \
    --reps 3 --json "$out/bench-qwen3-30b-a3b-q8dense.json"
  # the expert cache: 30b with half and a quarter of its 6144 experts in device slots, the rest in host memory
  # (pageable, then pinned); synthetic routing is near uniform, so this is the cache's worst case, not a model's
  for spec in "3072 mapped" "3072 pinned" "1536 pinned"; do
    set -- $spec
    TAIL=4 run bench_30b_cache_$1_$2 $bin/moet bench --synthetic qwen3-30b-a3b --device cuda -t 16 -p 0 -n 64 --reps 1 \
      --expert-slots $1 --expert-home $2 --json "$out/bench-qwen3-30b-a3b-slots$1-$2.json"
  done
  # --expert-slots auto: the reserve set so that ~7.5 GiB of the free memory is left for the model (30b: ~3.1 GiB
  # of dense weights, 8.2 GiB of experts): auto must pick a cache of roughly half the experts, and run
  free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  reserve=$(awk -v f="$free_mib" 'BEGIN { printf "%.1f", f / 1024 - 7.5 }')
  TAIL=6 run bench_30b_cache_auto $bin/moet bench --synthetic qwen3-30b-a3b --device cuda -t 16 -p 0 -n 64 --reps 1 \
    --expert-slots auto --expert-reserve "$reserve" --expert-home pinned --json "$out/bench-qwen3-30b-a3b-slots-auto-pinned.json"
  # the confidence gate's own cost (a tau it never passes): its top-1 probability from the candidates' lz (the row
  # stays on the device), then with --candidates 0 from the whole row on the host (what the gate did before stop 24)
  TAIL=3 run bench_30b_gate $bin/moet bench --synthetic qwen3-30b-a3b --experts w2+nvfp4 --device cuda -p 0 -n 128 \
    --reps 3 --gate 1e-9
  TAIL=3 run bench_30b_gate_row $bin/moet bench --synthetic qwen3-30b-a3b --experts w2+nvfp4 --device cuda -p 0 \
    -n 128 --reps 3 --gate 1e-9 --candidates 0
  # who routes a decode token (moe_tc.cu): k_tc_gate_up only where its grid is one wave, so forced both ways on the
  # two grids of two waves (the delta's 2 CTAs an SM at 30b; 235b's 768 CTAs): the rule's A/B in one binary
  for g in 1 0; do
    TAIL=3 run bench_30b_delta_route_gu$g env MOET_ROUTE_GU=$g $bin/moet bench --synthetic qwen3-30b-a3b \
      --experts w2+nvfp4 --device cuda -p 0 -n 128 --reps 3
    TAIL=3 run bench_235b_route_gu$g env MOET_ROUTE_GU=$g $bin/moet bench --synthetic qwen3-235b-a22b --device cuda \
      -p 0 -n 128 --reps 2
  done
  # the FP4 delta on every step (W2 base + NVFP4 residuals through the tensor-core decode kernels)
  TAIL=4 run bench_30b_delta $bin/moet bench --synthetic qwen3-30b-a3b --experts w2+nvfp4 --device cuda -p 512 -n 128 \
    --reps 3 -b 4 --json "$out/bench-qwen3-30b-a3b-delta.json"
fi
# each kernel of a 30b decode step timed alone under Nsight Compute, averaged over the layers (where ncu works)
if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
  TAIL=14 run ncu_layer env OUT="$out" NCU_TIMEOUT=150 bash tools/ncu_layer.sh qwen3-30b-a3b
fi
# the device call brings back at most 8 files: with $OUT set, everything goes back as one archive
if [ -n "${OUT:-}" ] && [ "$out" = "$OUT" ]; then
  tar -C "$out" -czf /tmp/gpu-check.tgz . && find "$out" -mindepth 1 -delete && mv /tmp/gpu-check.tgz "$out/"
fi
exit $fail
