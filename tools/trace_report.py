#!/usr/bin/env python3
"""trace_report.py — reads a kernel trace (MOET_TRACE=FILE from a -DMOET_CUDA_TRACE=ON build; see
src/backend/cuda/trace.cuh) and prints the step's critical path kernel by kernel.

One record a CTA: kid cta sm t0 tw t1 (ns). Records are grouped into launches in start order (a new launch where the
kernel changes or a CTA index repeats). For each launch: `lead`, how long before the previous launch's last CTA
ended its first CTA started (PDL overlap; negative: it started after), `wait`, from the previous launch's end to
when its last CTA got past its wait for it, and `adv`, how far it moved the end of the step (its end minus the
previous end): the advances sum to the step. --detail A:B prints launches A..B-1 CTA by CTA in quantiles
(min / median / 90% / max of each CTA's start, wait release and end, relative to the previous launch's end, and of
its marks where the kernel has them: trace.cuh's CU_TRACE_MARK): where a kernel's CTAs really start (beside the
previous kernel, or only when it leaves), when their waits return and where their time after the wait goes.
--early prints, for each kernel, the share of its CTAs a launch that started at least 1 us before the previous launch
ended (beside it: PDL overlap that the SMs' registers, shared memory and L1/shared split allowed), per launch min /
median / mean / max: stop 32 found q/k/v's start beside down erratic (7% to 100% of the CTAs, layer by layer).
TRACE may be xz-compressed (.xz).
Usage: trace_report.py TRACE [--launches N] [--detail A:B] [--early] [--json OUT]
"""
import collections
import json
import lzma
import sys

FAM = {1: "get_rows", 2: "mv16p", 3: "mv16", 4: "attn_decode", 5: "attention", 6: "tc_router", 7: "tc_gate_up",
       8: "tc_down", 9: "topk", 10: "mul_mat", 11: "elementwise", 12: "mv16s", 13: "st_gate_up", 14: "st_down"}
ELEM = {0: "add", 1: "rms_norm", 2: "swiglu", 3: "attn_prep"}


def kname(kid):
    fam, var = kid >> 8, kid & 255
    if fam == 11:
        return ELEM.get(var, f"elem{var}")
    if fam == 12:
        return f"mv16s<{['bf16', 'f16', 'q8t'][var >> 2]}{',norm' if var & 2 else ''}{',swz' if var & 1 else ''}>"
    if fam == 2:
        return f"mv16p<{['bf16', 'f16', 'q8t'][var >> 2]}{',norm' if var & 2 else ''}{',mt' if var & 1 else ''}>"
    if fam in (7, 8):
        return f"{FAM[fam]}<{var >> 2}{',dl' if var & 2 else ''}{',i8' if var & 1 else ''}>"
    if fam == 6:  # SP << 4 | NT: the split-row form (MOET_RT_SPLIT)
        return f"tc_router<{var & 15}{',split' if var & 16 else ''}>"
    if fam in (13, 14):  # M << 2 | TP (bit 6 was stop 34's shared-chunk gate/up, measured slower and taken out)
        return f"{FAM[fam]}<{(var >> 2) & 15},tp{var & 3}>"
    return FAM.get(fam, f"k{fam}") + (f"<{var}>" if var else "")


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    path, nshow, jout = args[0], 24, None
    if "--launches" in args:
        nshow = int(args[args.index("--launches") + 1])
    if "--json" in args:
        jout = args[args.index("--json") + 1]
    detail = None
    if "--detail" in args:
        a, b = args[args.index("--detail") + 1].split(":")
        detail = (int(a), int(b))
    recs = []
    for line in (lzma.open(path, "rt") if path.endswith(".xz") else open(path)):
        if line.startswith("#") or not line.strip():
            continue
        v = [int(f) for f in line.split()]
        kid, cta, sm, t0, tw, t1 = v[:6]
        m0, m1 = (v[6], v[7]) if len(v) >= 8 else (0, 0)  # CU_TRACE_MARK(0 / 1); older traces have none
        recs.append((t0, kid, cta, sm, tw, t1, m0, m1))
    if not recs:
        sys.exit("trace_report: no records")
    recs.sort()
    launches = []
    cur = None
    for t0, kid, cta, sm, tw, t1, m0, m1 in recs:
        if cur is None or kid != cur["kid"] or cta in cur["ctas"]:
            cur = {"kid": kid, "ctas": set(), "t0": t0, "t0last": t0, "tw": 0, "t1": 0, "sms": set(), "recs": []}
            launches.append(cur)
        cur["recs"].append((t0, tw, t1, m0, m1))
        cur["ctas"].add(cta)
        cur["sms"].add(sm)
        cur["t0last"] = t0
        cur["tw"] = max(cur["tw"], tw)
        cur["t1"] = max(cur["t1"], t1)
    base = launches[0]["t0"]
    ts = sorted({r[0] for r in recs} | {r[5] for r in recs})
    gran = min((b - a for a, b in zip(ts, ts[1:]) if b > a), default=0)
    prev_end = base
    agg = collections.OrderedDict()
    print(f"# {path}: {len(recs)} CTAs, {len(launches)} launches, step {(max(l['t1'] for l in launches) - base) / 1e3:.1f} us "
          f"(first start to last end); smallest timer step seen {gran} ns")
    print(f"{'#':>4s} {'kernel':28s} {'ctas':>5s} {'start':>8s} {'lead':>7s} {'wait':>7s} {'end':>8s} {'adv':>7s}  (us)")
    for i, l in enumerate(launches):
        lead = (prev_end - l["t0"]) / 1e3
        wait = (l["tw"] - prev_end) / 1e3 if l["tw"] else float("nan")
        adv = (l["t1"] - prev_end) / 1e3
        a = agg.setdefault(kname(l["kid"]), collections.defaultdict(float))
        a["n"] += 1
        a["adv"] += adv
        a["dur"] += (l["t1"] - l["t0"]) / 1e3
        a["lead"] += lead
        a["ctas"] += len(l["ctas"])
        if l["tw"]:
            a["wait"] += wait
            a["nw"] += 1
            a["post"] += (l["t1"] - l["tw"]) / 1e3
        if i < nshow or i >= len(launches) - 4:
            print(f"{i:4d} {kname(l['kid'])[:28]:28s} {len(l['ctas']):5d} {(l['t0'] - base) / 1e3:8.2f} {lead:7.2f} "
                  f"{wait:7.2f} {(l['t1'] - base) / 1e3:8.2f} {adv:7.2f}")
        elif i == nshow:
            print("   ...")
        prev_end = max(prev_end, l["t1"])
    total = (prev_end - base) / 1e3
    if detail:
        print(f"\nlaunches {detail[0]}..{detail[1] - 1}, CTA times relative to the previous launch's end (us): "
              "min / median / 90% / max")
        pe = base
        for i, l in enumerate(launches):
            if detail[0] <= i < detail[1]:
                def qs(v):
                    if not v:
                        return "-"
                    v = sorted(v)
                    return " / ".join(f"{v[int(p * (len(v) - 1))]:6.2f}" for p in (0, 0.5, 0.9, 1))
                st = [(r[0] - pe) / 1e3 for r in l["recs"]]
                wt = [(r[1] - pe) / 1e3 for r in l["recs"] if r[1]]
                en = [(r[2] - pe) / 1e3 for r in l["recs"]]
                print(f"{i:4d} {kname(l['kid'])[:24]:24s} {len(l['recs']):5d}  start {qs(st)}  waited {qs(wt)}  end {qs(en)}")
                for j in (0, 1):  # the kernel's marks (trace.cuh CU_TRACE_MARK), where it has them
                    mk = [(r[3 + j] - pe) / 1e3 for r in l["recs"] if r[3 + j]]
                    if mk:
                        print(f"{'':30s}  mark{j} {qs(mk)}")
            pe = max(pe, l["t1"])
    if "--early" in args:
        print("\nCTAs started >= 1 us before the previous launch's end, share a launch: min / median / mean / max")
        pe, ear = base, collections.OrderedDict()
        for l in launches:
            ear.setdefault(kname(l["kid"]), []).append(sum(1 for r in l["recs"] if r[0] < pe - 1000) / len(l["recs"]))
            pe = max(pe, l["t1"])
        for name, v in ear.items():
            w = sorted(v)
            print(f"  {name[:28]:28s} {len(v):4d} launches  {w[0]:.2f} / {w[len(w) // 2]:.2f} / {sum(w) / len(w):.2f} / {w[-1]:.2f}")
    print(f"\n{'kernel':28s} {'n':>4s} {'ctas':>6s} {'adv us':>8s} {'share':>6s} {'dur us':>7s} {'lead':>6s} {'wait':>6s} {'after wait':>10s}")
    out = {"trace": path, "ctas": len(recs), "launches": len(launches), "step_us": total, "timer_step_ns": gran, "kernels": []}
    for name, a in agg.items():
        n = a["n"]
        row = {"kernel": name, "n": int(n), "ctas": a["ctas"] / n, "adv_us": a["adv"] / n, "share": a["adv"] / total,
               "dur_us": a["dur"] / n, "lead_us": a["lead"] / n,
               "wait_us": a["wait"] / a["nw"] if a["nw"] else None, "after_wait_us": a["post"] / a["nw"] if a["nw"] else None}
        out["kernels"].append(row)
        f = lambda v: f"{v:6.2f}" if v is not None else "     -"
        print(f"{name[:28]:28s} {int(n):4d} {row['ctas']:6.0f} {row['adv_us']:8.2f} {100 * row['share']:5.1f}% {row['dur_us']:7.2f} "
              f"{f(row['lead_us'])} {f(row['wait_us'])} {f(row['after_wait_us']):>10s}")
    print(f"step: {total:.1f} us")
    if jout:
        json.dump(out, open(jout, "w"), indent=1)


if __name__ == "__main__":
    main()
