#!/usr/bin/env bash
# gpu_trace.sh — the kernel timeline of one decode step (trace.cuh) on the device machine, from a trace build:
#   cmake -S . -B build-sm90tr -DMOET_SHARED_LIB=ON -DMOET_CUDA_TRACE=ON -DCMAKE_BUILD_TYPE=Release \
#         -DMOET_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"; BINS=moet bash tools/gpu_carry.sh build-sm90tr
# then this script: for each shape, tg with the trace compiled in but off (what the records cost), then on; the
# report (tools/trace_report.py) and its JSON go to $OUT, the raw records xz'd beside them.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
for shape in ${SHAPES:-qwen3-30b-a3b qwen3-235b-a22b}; do
  n=${TG:-32}
  .carry/bin/moet bench --synthetic "$shape" --device cuda -p 0 -n "$n" --reps 2 ${ARGS:-} 2>/dev/null | grep tg | tee "$out/bench-$shape-trace-off.txt"
  MOET_TRACE="$out/trace-$shape.txt" .carry/bin/moet bench --synthetic "$shape" --device cuda -p 0 -n "$n" --reps 2 ${ARGS:-} 2>"$out/trace-$shape.log" |
    grep tg | tee "$out/bench-$shape-trace-on.txt"
  python3 tools/trace_report.py "$out/trace-$shape.txt" --launches ${LAUNCHES:-16} --detail ${DETAIL:-61:67} \
    --json "$out/trace-$shape.json" > "$out/trace-$shape-report.txt"  # DETAIL: a mid layer of the Qwen3 shapes
  tail -n 16 "$out/trace-$shape-report.txt"
  xz -9 "$out/trace-$shape.txt"
done
# one archive (a device call returns a few files only)
tar -C "$out" -cf "$out/../trace-all.tar" . && rm -rf "$out"/* && mv "$out/../trace-all.tar" "$out/"
