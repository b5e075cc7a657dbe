#!/usr/bin/env bash
# ncu_kernel.sh — where one decode kernel's time goes, from the hardware counters (Nsight Compute; Firecracker
# machines only): its speed of light, issue-slot use, warp stall reasons, shared-memory and L2/DRAM traffic, for
# COUNT launches of the kernels matching KERNEL (a regex) after SKIP of them, inside a synthetic decode step (graph
# nodes profiled one by one: each launch runs alone, so no PDL overlap with its neighbours). Usage on the device
# machine after tools/gpu_carry.sh:
#   KERNEL='k_st_(gate_up|down)' SKIP=100 COUNT=4 bash tools/ncu_kernel.sh qwen3-235b-a22b
# The report (text) goes to $OUT/ncu-SHAPE.txt (NAME= another name). ENV="MOET_X=1" sets the bench's environment;
# BENCH its options (default "-p 0 -n 3": decode; "-p 512 -n 1" for the prefill kernels); NCU_METRICS more metrics,
# NCU_EXTRA more ncu options (e.g. "--print-details all": the sections' tables, the stall reasons among them).
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
[ -f .carry/bin.tar.xz ] && [ ! -x .carry/bin/moet ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
shape=${1:-qwen3-235b-a22b}
timeout ${NCU_TIMEOUT:-240} env ${ENV:-} ncu --graph-profiling node --clock-control none \
    -k "regex:${KERNEL:-k_st_}" --launch-skip "${SKIP:-100}" -c "${COUNT:-4}" \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --metrics smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,dram__bytes_read.sum,sm__pipe_tensor_op_imma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active${NCU_METRICS:+,$NCU_METRICS} ${NCU_EXTRA:-} \
    .carry/bin/moet bench --synthetic "$shape" --device cuda ${BENCH:--p 0 -n 3} --reps 1 > "$out/${NAME:-ncu-$shape}.txt" 2>&1
rc=$?
# a timed-out ncu may leave its target running, holding the GPU's memory (stop 35: after the 235b model's timeout
# the next two steps of that call failed to allocate): end it
pkill -9 -f '\.carry/bin/moet bench' 2>/dev/null; sleep 1
echo "ncu_kernel: rc $rc ($(grep -c 'Speed Of Light' "$out/${NAME:-ncu-$shape}.txt") kernels profiled) -> $out/${NAME:-ncu-$shape}.txt"
