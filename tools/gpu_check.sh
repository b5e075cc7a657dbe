#!/usr/bin/env bash
# gpu_check.sh — the GPU half of the test suite, run on the device machine (tools/gpu_carry.sh prepares .carry/).
# Runs the CUDA op harness, CUDA vs CPU end to end (graphs vs eager), the transformers logits tests on the GPU,
# and the op harness's perf mode; logs under $OUT (or ./gpu-out). Exit status: non-zero if a test failed.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
bin=.carry/bin
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
fail=0
run() { local name=$1; shift; echo "== $name: $*"; "$@" > "$out/$name.log" 2>&1; local rc=$?; tail -n "${TAIL:-6}" "$out/$name.log"; echo "   rc=$rc"; [ $rc -eq 0 ] || fail=1; }
TAIL=40 run ops_cuda $bin/test_ops cuda
TAIL=12 run cuda_vs_cpu $bin/test_cuda models/moe-mini-a
run logits_a_cuda $bin/test_logits models/moe-mini-a .carry/shared/reference_fp32.safetensors 16 1
run logits_b_cuda $bin/test_logits tests/models/moe-mini-b tests/models/moe-mini-b/reference_fp32.safetensors 40 0
[ "${PERF:-1}" = 1 ] && TAIL=12 run ops_perf $bin/test_ops cuda --perf
if [ "${BENCH:-1}" = 1 ]; then
  for shape in qwen3-30b-a3b qwen3-235b-a22b; do
    TAIL=4 run bench_$shape $bin/moet bench --synthetic $shape --device cuda -p 512 -n 128 --reps 3 --json "$out/bench-$shape.json"
  done
  TAIL=4 run bench_mini_a $bin/moet bench -m models/moe-mini-a --device cuda -p 512 -n 128 --reps 3 --json "$out/bench-moe-mini-a.json"
fi
exit $fail
