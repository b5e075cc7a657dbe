#!/usr/bin/env bash
# ncu_layer.sh — the kernels of one synthetic decode step, each timed alone under Nsight Compute (graph nodes
# profiled one by one, clocks and caches as they run), averaged per kernel over the step's layers: which kernel of a
# decode layer costs what (ALL=1 BENCH_ARGS="-p 512 -n 0 --reps 1": every kernel of a prefill, totalled; a 512-token
# prefill is one chunk, ~12 kernels a layer). NCU_EXTRA="-c 400" caps a long run. Usage on the device machine after
# tools/gpu_carry.sh:
#   bash tools/ncu_layer.sh [SHAPE]
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
shape=${1:-qwen3-30b-a3b}
# only the step's kernels (profiling the synthetic model's set-up kernels as well takes many minutes)
timeout ${NCU_TIMEOUT:-240} ncu --graph-profiling node ${NCU_EXTRA:-} -k 'regex:k_(mv16|att|tc_|gb_|get|moe|rms|add|rope|mul|kv_|swiglu|norm|argmax|sample|top|route)' --clock-control none --cache-control none --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread \
    .carry/bin/moet bench --synthetic "$shape" --device cuda ${BENCH_ARGS:--p 0 -n 3 --reps 1} > "$out/ncu-layer-$shape.csv" 2>/dev/null
python3 - "$out/ncu-layer-$shape.csv" "${ALL:-0}" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("ncu_layer: no kernel was profiled (timed out, or NCU_EXTRA skipped past the run's kernels)")
hdr = rows[0]; ix = {k: i for i, k in enumerate(hdr)}
recs = collections.OrderedDict()
for r in rows[1:]:
    recs.setdefault(r[ix["ID"]], {"name": r[ix["Kernel Name"]].split("(")[0]})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
ks = list(recs.values())
# the last decode step (from its embedding lookup on), or with ALL=1 every kernel profiled (prefill: BENCH_ARGS)
last = 0 if sys.argv[2] == "1" else max(i for i, k in enumerate(ks) if k["name"].startswith("k_get_rows"))
step = ks[last:]
agg = collections.OrderedDict()
for k in step:
    a = agg.setdefault(k["name"], [0, 0.0, 0.0, k.get("launch__grid_size"), k.get("launch__registers_per_thread")])
    a[0] += 1; a[1] += float(k["gpu__time_duration.sum"].replace(",", "")); a[2] += float(k["dram__bytes_read.sum"].replace(",", ""))
tot = sum(a[1] for a in agg.values())
print(f"{'kernel':40s} {'n':>4s} {'us each':>8s} {'MB each':>8s} {'GB/s':>7s} {'grid':>6s} {'regs':>5s} {'share':>6s}")
for n, a in agg.items():
    us = a[1] / a[0] / 1e3; mb = a[2] / a[0] / 1e6
    print(f"{n[:40]:40s} {a[0]:4d} {us:8.2f} {mb:8.2f} {mb / us * 1e3 if us else 0:7.0f} {a[3]:>6s} {a[4]:>5s} {100 * a[1] / tot:5.1f}%")
print(f"step: {len(step)} kernels, {tot / 1e3:.1f} us (kernels alone)")
PY
