#!/usr/bin/env python3
"""Which signal should the delta gate use? Reads the CSV of `moet perplexity --gate-study` (every step's base
confidence signals, its routing's margin and entropy, and the KLD of the base and of base+delta to the reference) and prints, per signal, the mean
KLD when the least confident X% of steps use the delta, and the fraction needed to come within 1.3x of `on`.
The per-step KLDs are measured from the base step's cache, so a correction's effect on later steps' caches is not
counted (the real gate, `--delta gate`, includes it).  usage: tools/gate_study.py STUDY.csv [--json OUT]"""
import csv, json, sys

rows = list(csv.DictReader(open(sys.argv[1])))
kb = [float(r["kld_base"]) for r in rows]
ko = [float(r["kld_on"]) for r in rows]
n = len(rows)
on, base = sum(ko) / n, sum(kb) / n
signals = {
    "low top-1 probability": [float(r["top1"]) for r in rows],
    "low top-1 margin": [float(r["margin"]) for r in rows],
    "high entropy": [-float(r["entropy"]) for r in rows],
}
if "route_margin_min" in rows[0]:  # router-side signals (moet perplexity --gate-study since stop 21)
    signals.update({
        "low router margin (min over layers)": [float(r["route_margin_min"]) for r in rows],
        "low router margin (mean over layers)": [float(r["route_margin_mean"]) for r in rows],
        "high router entropy (mean over layers)": [-float(r["route_entropy"]) for r in rows],
    })
signals.update({
    "oracle (largest gain)": [-(b - o) for b, o in zip(kb, ko)],
})
out = {"steps": n, "kld_base": base, "kld_on": on, "signals": {}}
print(f"{n} steps: base KLD {base:.5f}, on KLD {on:.5f}")
for name, sig in signals.items():
    order = sorted(range(n), key=lambda i: sig[i])
    cur = sum(kb)
    curve, need = [], None
    for k, i in enumerate(order, 1):
        cur += ko[i] - kb[i]
        if need is None and cur / n <= 1.3 * on:
            need = k / n
        if k * 10 % n < 10 and k * 10 // n in range(1, 10):
            curve.append((round(k / n, 2), cur / n))
    out["signals"][name] = {"fraction_for_1.3x_on": need, "curve": curve}
    pts = "  ".join(f"{f:.0%}:{v:.4f}" for f, v in curve[:6])
    print(f"{name:24s} within 1.3x of on at {need:.1%} corrected | {pts}")
if "--json" in sys.argv:
    json.dump(out, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)
