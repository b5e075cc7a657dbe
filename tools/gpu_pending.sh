#!/usr/bin/env bash
# gpu_pending.sh — the short device call for code that was compiled but has not run on a GPU yet, in a minute or two;
# tools/gpu_check.sh is the whole GPU suite. Run after tools/gpu_carry.sh, on the device machine:
#     BINS="moet test_ops test_kv test_ecache" bash tools/gpu_carry.sh build-sm90; then bash tools/gpu_pending.sh
# (or the whole suite in one call from a shared-library build: cmake -S . -B build-sm90so -DMOET_SHARED_LIB=ON
#  -DCMAKE_BUILD_TYPE=Release -DMOET_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"; gpu_carry.sh build-sm90so;
#  bash tools/gpu_check.sh: built and CPU-tested at stop 30, not yet run on the device)
# Pending at the end of stop 30: test_ops on the last commits (tc_i8_fetch_staged, tc_stage_slot, moet_f32_bits by
# memcpy: code motion, compiled, CPU-tested (quant/tile.h), not run on a GPU:
# the device budget was spent), and the rest of gpu_check.sh at the final commit (its last call carried test_ops,
# test_cuda, test_logits, test_batch and test_arch, all passed: bench/results/cuda-h100/stop30/gpu-check/): the paged
# KV tests, the expert cache (bit-identical to the resident model, both homes) and the server's curl smoke test, with
# the integer form and the prestaged inputs on by default.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
TESTS=1 PERF=0 BENCH=0 NCU=0 OUT="$out" bash tools/gpu_check.sh 2>&1 | grep "^== \|rc=\|FAIL\|SKIP"
