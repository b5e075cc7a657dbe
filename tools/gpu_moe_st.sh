#!/usr/bin/env bash
# gpu_moe_st.sh — one device call for the streamed decode MoE (moe_st.cu) and its options, most needed first (a call
# that runs out of time keeps what is already under $OUT): test_ops cuda (every option bit for bit against the legacy
# kernels), tg64 A/B of the options against the base build (two rounds, the second in reverse order), the 235b
# timeline with and without down's L2 prefetch (trace build), the streamed kernels' SASS, Nsight Compute on one
# gate/up and one down launch, the MoE op at 235b's expert shape, and 30b at 2-3 sequences a step. Pack first:
#   BINS="moet test_ops" BASE_BUILD=/tmp/base/build TRACE_BUILD=build-sm90tr bash tools/gpu_carry.sh build-sm90so
# (BASE_BUILD: the previous commit built in a git worktree; the working tree and .carry must stay under ~64 MiB:
# move the three largest test models aside for the call). Then, on the device machine: bash tools/gpu_moe_st.sh
# OPTS: the settings to A/B beside `base` and `default` (';'-separated, as tools/gpu_ab.sh).
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
opts=${OPTS:-MOET_MOE_ST_SHARE=1;MOET_MOE_DNPF=2;MOET_MOE_DNCP=1;MOET_RT_L2=1}
tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$out/gpu.txt"
(.carry/bin/test_ops cuda > /tmp/test_ops.txt 2>&1; echo "rc $?" >> /tmp/test_ops.txt)
grep -E "FAIL|streamed|^rc |passed|failed" /tmp/test_ops.txt | tail -25 | tee "$out/test_ops-summary.txt"
ENVS="base;default;$opts" ROUNDS=1 TG=64 SHAPES="qwen3-235b-a22b" OUT=/tmp/ab bash tools/gpu_ab.sh > /dev/null 2>&1
ENVS="base;default" ROUNDS=1 TG=64 SHAPES="qwen3-30b-a3b" OUT=/tmp/ab bash tools/gpu_ab.sh > /dev/null 2>&1
cp /tmp/ab/ab.txt "$out/ab.txt"; cat "$out/ab.txt"
# the timeline of a 235b decode step from the trace build: default and with down's matrix asked into L2 early
ENVS="default;MOET_MOE_DNPF=2" SHAPES="qwen3-235b-a22b" TG=16 OUT=/tmp/tr bash tools/gpu_trace.sh > /dev/null 2>&1
mkdir -p /tmp/trx && tar -C /tmp/trx -xf /tmp/tr/trace-all.tar && for f in /tmp/trx/*=*; do mv "$f" "${f//=/_}"; done
tar -C /tmp/trx -cJf "$out/trace-reports.tar.xz" $(cd /tmp/trx && ls | grep -E "report|bench")
cuobjdump -sass .carry/lib/libmoet.so 2>/dev/null | awk '/Function : .*k_st_/{p=1} /Function : / && !/k_st_/{p=0} p' |
  xz > "$out/st_sass.txt.xz"
# the second round, settings in reverse order (drift falls on every setting alike)
rev=$(echo "base;default;$opts" | tr ';' '\n' | tac | paste -sd';')
ENVS="$rev" ROUNDS=1 TG=64 SHAPES="qwen3-235b-a22b" OUT=/tmp/ab2 bash tools/gpu_ab.sh > /dev/null 2>&1
sed 's/\t1\t/\t2\t/' /tmp/ab2/ab.txt >> "$out/ab.txt"
KERNEL='k_st_(gate_up|down)' SKIP=100 COUNT=2 NCU_TIMEOUT=120 OUT=/tmp/ncu bash tools/ncu_kernel.sh qwen3-235b-a22b
xz -c /tmp/ncu/ncu-qwen3-235b-a22b.txt > "$out/ncu-235b.txt.xz"
MOET_PERF_ONLY=moe MOET_PERF_MOE_SHAPE=235b .carry/bin/test_ops cuda --perf > /tmp/perf235.txt 2>&1
grep -iE "moe" /tmp/perf235.txt > "$out/perf235.txt"
for s in "MOET_MOE_ST=0" "MOET_MOE_ST=auto"; do
  env $s .carry/bin/moet bench --synthetic qwen3-30b-a3b --device cuda -p 0 -n 64 -b 2,3 2>/dev/null | grep tg | sed "s/^/$s /"
done | tee "$out/batch23.txt"
tar -C /tmp -cJf "$out/raw.tar.xz" test_ops.txt perf235.txt ab ab2
# last (least needed): where the grouped prefill kernels' time goes (issue 6's pp512 tensor-core target)
KERNEL='k_gb_experts' SKIP=2 COUNT=2 NCU_TIMEOUT=150 BENCH="-p 512 -n 1" NAME=ncu-30b-pp OUT=/tmp/ncu bash tools/ncu_kernel.sh qwen3-30b-a3b
xz -c /tmp/ncu/ncu-30b-pp.txt > "$out/ncu-30b-pp.txt.xz"
