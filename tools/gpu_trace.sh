#!/usr/bin/env bash
# gpu_trace.sh — the kernel timeline of one decode step (trace.cuh) on the device machine, from a trace build:
#   cmake -S . -B build-sm90tr -DMOET_SHARED_LIB=ON -DMOET_CUDA_TRACE=ON -DCMAKE_BUILD_TYPE=Release \
#         -DMOET_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"; BINS=moet bash tools/gpu_carry.sh build-sm90tr
# then this script: for each shape, tg with the trace compiled in but off (what the records cost), then on; the
# report (tools/trace_report.py) and its JSON go to $OUT, the raw records xz'd beside them.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
# The trace build comes as .carry/bin (BINS=moet bash tools/gpu_carry.sh build-sm90tr) or, beside a release build's
# binaries, as .carry/tr.tar.xz (TRACE_BUILD=build-sm90tr bash tools/gpu_carry.sh build-sm90so).
# ENVS (';'-separated settings, as tools/gpu_ab.sh): one timeline each, tagged.
bin=.carry/bin/moet
if [ -f .carry/tr.tar.xz ]; then
  mkdir -p .carry/tr && tar -C .carry/tr -xJf .carry/tr.tar.xz
  bin=.carry/tr/bin/moet
  export LD_LIBRARY_PATH=$PWD/.carry/tr/lib:$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  [ -f .carry/bin.tar.xz ] && [ ! -x .carry/bin/moet ] && tar -C .carry -xJf .carry/bin.tar.xz
  export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
IFS=';' read -r -a sets <<< "${ENVS:-}"
[ ${#sets[@]} -eq 0 ] && sets=("")  # the word `default` is the empty setting too (bash drops a trailing empty one)
for shape in ${SHAPES:-qwen3-30b-a3b qwen3-235b-a22b}; do
  n=${TG:-32}
  $bin bench --synthetic "$shape" --device cuda -p 0 -n "$n" --reps 2 ${ARGS:-} 2>/dev/null | grep tg | tee "$out/bench-$shape-trace-off.txt"
  for s in "${sets[@]}"; do
    [ "$s" = default ] && s=
    tag=$shape; [ -n "$s" ] && tag=$shape-$(echo "$s" | sed 's/MOET_//g; s/ /,/g')
    env $s MOET_TRACE="$out/trace-$tag.txt" $bin bench --synthetic "$shape" --device cuda -p 0 -n "$n" --reps 2 ${ARGS:-} \
      2>"$out/trace-$tag.log" | grep tg | tee "$out/bench-$tag-trace-on.txt"
    python3 tools/trace_report.py "$out/trace-$tag.txt" --launches ${LAUNCHES:-16} --detail ${DETAIL:-61:67} --early \
      --json "$out/trace-$tag.json" > "$out/trace-$tag-report.txt"  # DETAIL: a mid layer of the Qwen3 shapes
    tail -n 16 "$out/trace-$tag-report.txt"
    xz -9 "$out/trace-$tag.txt"
  done
done
# one archive (a device call returns a few files only)
tar -C "$out" -cf "$out/../trace-all.tar" . && rm -rf "$out"/* && mv "$out/../trace-all.tar" "$out/"
