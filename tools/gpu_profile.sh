#!/usr/bin/env bash
# gpu_profile.sh — per-kernel timings of the MoE perf case under Nsight Compute (ncu ships in the device image's CUDA
# toolkit): duration, DRAM bytes, achieved occupancy, grid and registers of each kernel of a few MoE ops.
# Usage on the device machine after tools/gpu_carry.sh: bash tools/gpu_profile.sh [KERNEL_REGEX] [COUNT]
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
re=${1:-k_moe|k_rotate|k_mul}
ncu --graph-profiling node -k "regex:$re" -c "${2:-16}" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,launch__block_size \
    .carry/bin/test_ops cuda --perf > "$out/ncu.txt" 2>&1
grep -E "k_[a-z_0-9<>]+|duration|dram__bytes|warps_active|grid_size|registers|block_size" "$out/ncu.txt" | head -${3:-200}
