#!/usr/bin/env bash
# gpu_moe_st.sh — one device call for the decode MoE kernels (moe_st.cu, moe_tc.cu) and their options, most needed
# first (a call that runs out of time keeps what is already under $OUT; the files come back as at most a few, since
# a call returns only so many): test_ops cuda (every option bit for bit against the legacy kernels), tg64 A/B of
# the options against the base build (two rounds, the second in reverse order), the 235b timeline (trace build),
# Nsight Compute with the stall reasons on the streamed kernels (235b's first 4 layers: the whole model makes ncu
# save and restore 74 GB a pass), the legacy decode kernels (30b) and the grouped prefill kernel (30b pp512).
# Pack first:
#   BINS="moet test_ops" BASE_BUILD=/tmp/base/build TRACE_BUILD=build-sm90tr bash tools/gpu_carry.sh build-sm90so
# (BASE_BUILD: the previous commit built in a git worktree; the working tree and .carry must stay under ~64 MiB:
# move the three largest test models aside for the call). Then, on the device machine: bash tools/gpu_moe_st.sh
# OPTS: the settings to A/B beside `base` and `default` (';'-separated, as tools/gpu_ab.sh). NCU=0 skips ncu, DENSE=0
# the dense ops table, Q8=0 the Q8_0 block;
# HEAD_BENCH=1 adds the README's headline benches after the timeline.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out" /tmp/res
opts=${OPTS:-MOET_MVS_SWZ=0;MOET_RT_SPLIT=1;MOET_ATTN_TRIG=1}; [ "$opts" = none ] && opts=default  # OPTS=none: base and default alone
tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)  # the bench JSONs' commit (the copy's git is stale)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee /tmp/res/gpu.txt
(.carry/bin/test_ops cuda > /tmp/res/test_ops.txt 2>&1; echo "rc $?" >> /tmp/res/test_ops.txt)
grep -E "FAIL|FATAL|streamed|regs|mv16s|split|^rc " /tmp/res/test_ops.txt | tail -30 | tee "$out/summary.txt"
# the single-token dense ops alone (30b and 235b shapes), to set beside the same ops inside a step (the timeline);
# DENSE=0 skips them (a short call)
if [ "${DENSE:-1}" = 1 ]; then
  MOET_PERF_ONLY=dense .carry/bin/test_ops cuda --perf > /tmp/res/dense-perf.txt 2>&1
  grep -A4 "dense ops (" /tmp/res/dense-perf.txt | tee -a "$out/summary.txt"
  grep -A5 "dense q8_0 GEMV" /tmp/res/dense-perf.txt | tee -a "$out/summary.txt"
fi
# Q8=1: the Q8_0 GEMV through k_mv16p (MOET_MVS_Q8=0) alone, and tg64 of the --dense q8_0 models: base, default
# (one token's Q8_0 rows through k_mv16s since stop 38) and MOET_MVS_Q8=0
if [ "${Q8:-1}" = 1 ]; then
  MOET_MVS_Q8=0 MOET_PERF_ONLY=dense .carry/bin/test_ops cuda --perf > /tmp/res/dense-perf-mv16p-q8.txt 2>&1
  grep -A5 "dense q8_0 GEMV" /tmp/res/dense-perf-mv16p-q8.txt | tee -a "$out/summary.txt"
  for r in 1 2; do
    sets="base;default;MOET_MVS_Q8=0"; [ $r = 2 ] && sets="MOET_MVS_Q8=0;default;base"
    ENVS="$sets" ROUNDS=1 TG=64 ARGS="--dense q8_0" SHAPES="qwen3-235b-a22b qwen3-30b-a3b" OUT=/tmp/res/abq8-$r \
      bash tools/gpu_ab.sh > /dev/null 2>&1
    cut -f1-4 /tmp/res/abq8-$r/ab.txt | awk -F'|' '{print "q8 r'$r'", $1, $9, $10}' | tee -a "$out/summary.txt"
  done
fi
tar -C /tmp -cJf "$out/res.tar.xz" res
sets="base;default"; [ "$opts" != default ] && sets="$sets;$opts"
ENVS="$sets" ROUNDS=1 TG=64 SHAPES="qwen3-235b-a22b qwen3-30b-a3b" OUT=/tmp/res/ab bash tools/gpu_ab.sh > /dev/null 2>&1
cut -f1-4 /tmp/res/ab/ab.txt | awk -F'|' '{print $1, $9, $10}' > "$out/ab-round1.txt"
rev=$(echo "$sets" | tr ';' '\n' | tac | paste -sd';')
ENVS="$rev" ROUNDS=1 TG=64 SHAPES="qwen3-235b-a22b qwen3-30b-a3b" OUT=/tmp/res/ab2 bash tools/gpu_ab.sh > /dev/null 2>&1
sed 's/\t1\t/\t2\t/' /tmp/res/ab2/ab.txt >> /tmp/res/ab/ab.txt
cut -f1-4 /tmp/res/ab/ab.txt | awk -F'|' '{print $1, $9, $10}' | tee -a "$out/summary.txt"
tar -C /tmp -cJf "$out/res.tar.xz" res
# the timeline of a 235b decode step from the trace build (TRACE=0 skips it)
if [ "${TRACE:-1}" = 1 ]; then
  ENVS="default;$opts" SHAPES="qwen3-235b-a22b" TG=16 OUT=/tmp/tr bash tools/gpu_trace.sh > /dev/null 2>&1
  mkdir -p /tmp/res/trace && tar -C /tmp/res/trace -xf /tmp/tr/trace-all.tar && for f in /tmp/res/trace/*=*; do mv "$f" "${f//=/_}"; done
  rm -f /tmp/res/trace/*.txt.xz  # the raw records (large); the reports and JSONs stay
  tar -C /tmp -cJf "$out/res.tar.xz" res
fi
# HEAD_BENCH=1: the README's headline benches (bench/results/cuda/: the synthetic shapes pp512 / tg128 / batches,
# moe-mini-a) from this build, as tools/gpu_check.sh runs them
if [ "${HEAD_BENCH:-0}" = 1 ]; then
  mkdir -p /tmp/res/headline
  for shape in qwen3-30b-a3b qwen3-235b-a22b; do
    .carry/bin/moet bench --synthetic $shape --device cuda -p 512 -n 128 --reps 3 -b 4,16,64 \
      --json /tmp/res/headline/bench-$shape.json > /tmp/res/headline/bench-$shape.txt 2>&1
  done
  .carry/bin/moet bench -m models/moe-mini-a --device cuda -p 512 -n 128 --reps 3 \
    --json /tmp/res/headline/bench-moe-mini-a.json > /tmp/res/headline/bench-moe-mini-a.txt 2>&1
  grep -h "t/s\|tg\|pp" /tmp/res/headline/*.txt | tail -20 >> "$out/summary.txt"
  tar -C /tmp -cJf "$out/res.tar.xz" res
fi
[ "${NCU:-1}" = 0 ] && exit 0
S=$(for r in long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait barrier not_selected selected \
  dispatch_stall no_instruction lg_throttle branch_resolving membar drain sleeping tex_throttle imc_miss misc; do
  printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' $r; done); S=${S%,}
KERNEL='k_st_(gate_up|down)' SKIP=4 COUNT=2 NCU_METRICS=$S NCU_TIMEOUT=100 OUT=/tmp/res/ncu NAME=st235 \
  bash tools/ncu_kernel.sh qwen3-235b-a22b:4
KERNEL='k_tc_(router|gate_up|down)' SKIP=6 COUNT=3 NCU_METRICS=$S NCU_TIMEOUT=100 OUT=/tmp/res/ncu NAME=tc30 \
  bash tools/ncu_kernel.sh qwen3-30b-a3b:4
KERNEL='k_gb_experts' SKIP=0 COUNT=2 BENCH="-p 512 -n 1" NCU_METRICS=$S NCU_TIMEOUT=100 OUT=/tmp/res/ncu NAME=gb30 \
  bash tools/ncu_kernel.sh qwen3-30b-a3b:4
tar -C /tmp -cJf "$out/res.tar.xz" res
