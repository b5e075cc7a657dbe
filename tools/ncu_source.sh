#!/usr/bin/env bash
# ncu_source.sh — one kernel of a synthetic decode step under Nsight Compute's full set, with the per-line source
# counters (the build carries -lineinfo): where its time goes (stall reasons per SASS line, CUDA line beside it).
# Usage on the device machine after tools/gpu_carry.sh: bash tools/ncu_source.sh KERNEL_REGEX [SHAPE] [SKIP]
# Writes $OUT/ncu-<name>-details.txt (sections) and $OUT/ncu-<name>-source.csv (SASS lines with their metrics).
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
re=$1; shape=${2:-qwen3-30b-a3b}; skip=${3:-200}
name=$(echo "$re" | tr -c 'a-zA-Z0-9_\n' '_')
rep=/tmp/ncu-$name
ncu --graph-profiling node --set full --import-source yes --warp-sampling-interval ${NCU_SAMPLING:-0} -k "regex:$re" -s "$skip" -c 1 -f -o "$rep" \
    .carry/bin/moet bench --synthetic "$shape" --device cuda -p 0 -n 8 --reps 1 > "$out/ncu-$name-run.txt" 2>&1
ncu --import "$rep.ncu-rep" --page details > "$out/ncu-$name-details.txt" 2>&1
ncu --import "$rep.ncu-rep" --page source --csv --print-source cuda,sass > "$out/ncu-$name-source.csv" 2>&1
tail -3 "$out/ncu-$name-run.txt"; grep -E "Duration|Registers|Achieved Occupancy|Memory Throughput" "$out/ncu-$name-details.txt" | head
