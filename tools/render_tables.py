#!/usr/bin/env python3
"""Renders the tables in README.md / docs/*.md from bench/results/*.json (stdlib only).

Each table sits between <!-- table:NAME --> and <!-- /table:NAME --> markers and is replaced whole, so the
numbers in the docs are always the committed results'.  usage: tools/render_tables.py [--check]
"""
import glob, json, os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_bench():
    rows = ["| model | threads | pp512 t/s | tg128 t/s | peak RSS | machine | commit | date |",
            "|---|---|---|---|---|---|---|---|"]
    for f in sorted(glob.glob(os.path.join(ROOT, "bench/results/cpu-*.json"))):
        d = json.load(open(f))
        for r in d["results"]:
            if "batch" in r:
                continue  # batched decode rows: the cuda-batched table
            rows.append(f"| {os.path.basename(d['model'])} | {r['threads']} | {r['pp_tps']:.1f} | {r['tg_tps']:.1f} | "
                        f"{d['peak_rss_bytes'] / 2**20:.0f} MiB | {d['machine']['cpu']}, {d['machine']['cores']} cores | "
                        f"{d['commit']} | {d['date'][:10]} |")
    return "\n".join(rows)


def model_sizes(name):
    """(expert params, other params) of a shared model, from its config.json and safetensors header."""
    import struct
    for d in (os.path.join(ROOT, "models", name), os.path.join(ROOT, "..", "shared", "models", name),
              os.path.join(ROOT, "tests", "models", name)):
        if os.path.exists(os.path.join(d, "config.json")):
            break
    else:
        return None
    c = json.load(open(os.path.join(d, "config.json")))
    raw = open(os.path.join(d, "model.safetensors"), "rb")
    hl = struct.unpack("<Q", raw.read(8))[0]
    hdr = json.loads(raw.read(hl))
    total = 0
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        n = 1
        for x in v["shape"]:
            n *= x
        total += n
    layers = [i for i in range(c["num_hidden_layers"]) if i not in c.get("mlp_only_layers", [])]
    E = c.get("num_experts", c.get("num_local_experts", 0))
    ex = len(layers) * E * 3 * c["hidden_size"] * c["moe_intermediate_size"]
    return ex, total - ex


ORDER = ["bf16", "q8_0", "nvfp4", "mxfp4", "w2+w2.on", "asym2", "sym2", "int2", "w2-nocalib", "w2-nogptq", "w2",
         "w2+nvfp4.off", "w2+nvfp4.on", "w2+nvfp4.gate", "kv-f16", "w2.kv-f16"]
LABEL = {"bf16": "BF16 (round trip)", "q8_0": "Q8_0", "nvfp4": "NVFP4 (RTN)", "mxfp4": "MXFP4 (RTN)",
         "int2": "int2 naive {−2,−1,0,+1}", "asym2": "asym2 affine min-max", "sym2": "sym2 uniform {±½,±1½}",
         "w2-nocalib": "W2, no calibration", "w2-nogptq": "W2, calibrated, no error feedback", "w2": "**W2** (calibrated)",
         "w2+nvfp4.on": "W2 + NVFP4 delta, `on`", "w2+nvfp4.gate": "W2 + NVFP4 delta, `gate` τ=0.6",
         "w2+w2.on": "W2 + W2 delta, `on` (2-bit delta)",
         "kv-f16": "BF16, KV cache in f16 (`--kv-type f16`)", "w2.kv-f16": "W2 (calibrated), KV cache in f16",
         "w2+nvfp4.pick08": "W2 + NVFP4 delta, `pick` R=0.8 (the default)"}
PICK_MAIN = "w2+nvfp4.pick08"  # the one pick run in the main table; the sweep has its own (delta_pick)


def quality():
    out = []
    files = [f for f in sorted(glob.glob(os.path.join(ROOT, "bench/results/quality/*.json")))
             if "model" in json.load(open(f))]  # only bench/quality.sh results
    models = sorted({json.load(open(f))["model"] for f in files})
    for mname in models:
        sizes = model_sizes(mname)
        runs = {}
        for f in files:
            d = json.load(open(f))
            if d["model"] == mname and (".pick" not in d["run"] or d["run"] == PICK_MAIN):
                runs[d["run"]] = d
        if not runs:
            continue
        any_d = next(iter(runs.values()))
        # the runs' commits and dates, each with the runs measured there (rows are re-measured when their code moves)
        by_commit = {}
        for r, d in sorted(runs.items(), key=lambda kv: kv[1]["date"]):
            by_commit.setdefault((d["commit"], d["date"][:10]), []).append(r)
        where = "; ".join(f"commit {c}, {day}: {', '.join(rs)}" for (c, day), rs in by_commit.items())
        out.append(f"**{mname}**, {any_d['data']}, ctx {any_d['result']['ctx']}, {any_d['result']['chunks']} windows "
                   f"({any_d['result']['tokens']} predictions), KLD to the BF16 model; {any_d['machine']}; {where}.")
        out.append("")
        out.append("| experts as | expert bpw | est. size | PPL | mean KLD | p99 KLD | top-1 | steps corrected |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in sorted(runs, key=lambda r: ORDER.index(r) if r in ORDER else 99):
            res = runs[r]["result"]
            bpw = res.get("expert_bpw", 16)
            if res.get("delta") == "gate":
                bpw_s = f"2.25 + 4.5 on {100 * res['gate_corrected']:.0f}% of steps"
            elif res.get("delta_pick", 0) > 0:  # a pack + delta pack run: both stored, the picked share read
                bpw_s = f"2.25 + 4.5 on {100 * res['delta_picks']:.0f}% of picks"
                bpw = 6.75
            else:
                bpw_s = f"{bpw:g}"
            size = "" if not sizes else f"{(sizes[0] * bpw / 8 + sizes[1] * 2) / 2**20:.1f} MiB"
            corr = f"{100 * res['gate_corrected']:.1f}%" if res.get("delta") == "gate" else ""
            def kf(x, nd):  # the KV-cache rows' divergences are ~1e-5: two significant digits, not 0.0000
                return f"{x:.1e}" if r.startswith("kv") or ".kv" in r else f"{x:.{nd}f}"
            out.append(f"| {LABEL.get(r, r)} | {bpw_s} | {size} | {res['ppl']:.3f} | {kf(res['kld_mean'], 4)} | "
                       f"{kf(res['kld_p99'], 3)} | {res['top1_agree']:.3f} | {corr} |")
        out.append("")
    return "\n".join(out).rstrip()


def delta_pick():
    """The delta on the heavy picks (bench/quality.sh's pick runs) beside the rows they sit between."""
    out = ["| model | experts as | picks with the delta | expert bytes read a token (bpw) | PPL | mean KLD | p99 KLD | top-1 |",
           "|---|---|---|---|---|---|---|---|"]
    files = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(ROOT, "bench/results/quality/*.json")))]
    files = [d for d in files if "model" in d]
    for mname in sorted({d["model"] for d in files}):
        runs = {d["run"]: d for d in files if d["model"] == mname}
        picks = sorted((r for r in runs if ".pick" in r), key=lambda r: runs[r]["result"]["delta_pick"])
        if not picks:
            continue
        rows = [("w2", "W2 alone", 0.0)] + [(r, f"`pick` R={runs[r]['result']['delta_pick']:g}", None) for r in picks] + \
               [("w2+nvfp4.gate", "`gate` τ=0.6 (per step)", None), ("w2+nvfp4.on", "`on` (every pick)", 1.0),
                ("nvfp4", "NVFP4 alone (RTN, no W2)", None)]
        for r, label, frac in rows:
            if r not in runs:
                continue
            res = runs[r]["result"]
            if r == "nvfp4":
                fs, bpw = "", "4.5"
            elif r == "w2+nvfp4.gate":
                g = res["gate_corrected"]
                fs, bpw = f"all, on {100 * g:.1f}% of steps", f"{2.25 + 6.75 * g:.2f} (a redone step reads base + delta)"
            else:
                f = frac if frac is not None else res["delta_picks"]
                fs, bpw = f"{100 * f:.1f}%", f"{2.25 + 4.5 * f:.2f}"
            out.append(f"| {mname} | {label} | {fs} | {bpw} | {res['ppl']:.3f} | {res['kld_mean']:.4f} | "
                       f"{res['kld_p99']:.3f} | {res['top1_agree']:.3f} |")
    return "\n".join(out)


def cpu_delta_pick():
    """moet bench on the CPU, the delta on every pick, on the picks of R and the base alone (bench/delta_pick_cpu.sh:
    the configurations alternate over rounds; each row is a configuration's median over them)."""
    rows = ["| model | delta picks | tg t/s (median of rounds) | rounds (t/s) | bytes / token (MB) | vs `on` | machine | commit | date |",
            "|---|---|---|---|---|---|---|---|---|"]
    groups = {}
    for f in sorted(glob.glob(os.path.join(ROOT, "bench/results/cpu-delta/*.json"))):
        d = json.load(open(f))
        for r in d["results"]:
            if "batch" not in r:
                kind = 2 if r.get("delta", "off") == "off" else 1 if r.get("delta_pick", 0) > 0 else 0  # on, pick, none
                groups.setdefault((d["model"], kind, r.get("delta_pick", 0)), []).append((d, r))
    med = lambda xs: sorted(xs)[len(xs) // 2]
    on = {k[0]: med([r["tg_tps"] for _, r in v]) for k, v in groups.items() if k[1] == 0}
    for (model, kind, p), v in sorted(groups.items()):
        d, r = v[0]
        tps = med([x["tg_tps"] for _, x in v])
        share = [x["delta_picks"] for _, x in v if x.get("delta_picks", -1) >= 0]
        picks = ("none (W2 alone)" if kind == 2 else "every pick (`on`)" if kind == 0 else
                 f"R={p:g}: {100 * sum(share) / len(share):.1f}%" if share else f"R={p:g}")
        name = os.path.basename(model).replace(".gguf", " (pack + delta pack)")
        commits = ", ".join(sorted({x["commit"] for x, _ in v}))
        if model in on:
            each = " / ".join(f"{x['tg_tps']:.1f}" for _, x in v)
            rows.append(f"| {name} | {picks} | {tps:.2f} | {each} | "
                        f"{r['tg_bytes_per_token'] / 1e6:.1f} | {tps / on[model]:.2f}x | {d['machine']['cpu']}, "
                        f"{r['threads']} threads | {commits} | {d['date'][:10]} |")
    return "\n".join(rows)


def gate_study():
    out = ["| model | signal | KLD at 10% | 20% | 30% | 50% | corrected for 1.3× of on-from-base-cache |", "|---|---|---|---|---|---|---|"]
    for f in sorted(glob.glob(os.path.join(ROOT, "bench/results/gate/*.study.json"))):
        d = json.load(open(f))
        name = os.path.basename(f).split(".")[0]
        for sig, v in d["signals"].items():
            c = dict((round(a, 1), b) for a, b in v["curve"])
            need = v["fraction_for_1.3x_on"]
            out.append(f"| {name} | {sig} | " + " | ".join(f"{c.get(x, float('nan')):.4f}" for x in (0.1, 0.2, 0.3, 0.5)) +
                       f" | {need:.0%} |" if need is not None else " | — |")
        out.append(f"| {name} | (base alone / every step corrected from the base cache) | {d['kld_base']:.4f} | | | | on-from-base-cache {d['kld_on']:.4f} |")
    return "\n".join(out)


COPY_GBPS = 4277.0  # bench/results/cuda/ops-perf-h200.txt: d2d copy on the lent H200, read + write counted


def cuda_bench():
    rows = ["| model | weights | experts | pp512 t/s | tg128 t/s | bytes / token | effective GB/s | of copy BW | GPU | commit | date |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in sorted(glob.glob(os.path.join(ROOT, "bench/results/cuda/bench-*.json"))):
        d = json.load(open(f))
        for r in d["results"]:
            if "batch" in r:
                continue  # batched decode rows: the cuda-batched table
            rows.append(f"| {os.path.basename(d['model'])} | {r['weight_bytes'] / 2**30:.2f} GiB | {r['experts']} | "
                        f"{r['pp_tps']:.1f} | {r['tg_tps']:.1f} | {r['tg_bytes_per_token'] / 1e9:.3f} GB | "
                        f"{r['tg_gbps']:.0f} | {100 * r['tg_gbps'] / COPY_GBPS:.1f}% | {d['machine']['gpu'].split(' (')[0]} | "
                        f"{d['commit']} | {d['date'][:10]} |")
    return "\n".join(rows)


def serve_load():
    rows = ["| model | device | clients | max seqs | max tokens | requests | failed | req/s | output tok/s | TTFT p50 / p99 ms | "
            "ITL p50 / p99 ms | E2E p50 ms | RSS start → end MiB | machine | commit | date |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in sorted(glob.glob(os.path.join(ROOT, "bench/results/serve/*.json"))):
        d = json.load(open(f))
        rows.append(f"| {os.path.basename(d['model'])} | {d['device']} | {d['clients']} | {d['max_seqs']} | {d['max_tokens']} | "
                    f"{d['completed']} | {d['failed']} | {d['request_throughput']:.2f} | {d['output_token_throughput']:.1f} | "
                    f"{d['ttft_ms']['p50']:.1f} / {d['ttft_ms']['p99']:.1f} | {d['itl_ms']['p50']:.2f} / {d['itl_ms']['p99']:.2f} | "
                    f"{d['e2e_ms']['p50']:.0f} | {d['rss_mib_start']:.1f} → {d['rss_mib_end']:.1f} | {d['machine']} | "
                    f"{d['commit']} | {d['date'][:10]} |")
    return "\n".join(rows)


def cuda_batched():
    rows = ["| model | experts | sequences | aggregate decode t/s | per sequence t/s | vs one sequence | GPU | commit | date |",
            "|---|---|---|---|---|---|---|---|---|"]
    for f in sorted(glob.glob(os.path.join(ROOT, "bench/results/cuda/bench-*.json"))):
        d = json.load(open(f))
        single = next((r["tg_tps"] for r in d["results"] if "batch" not in r and r.get("tg_tps")), None)
        for r in d["results"]:
            if "batch" not in r:
                continue
            ratio = f"{r['batched_tps'] / single:.2f}×" if single else ""
            rows.append(f"| {os.path.basename(d['model'])} | {r['experts']} | {r['batch']} | {r['batched_tps']:.1f} | "
                        f"{r['batched_tps'] / r['batch']:.1f} | {ratio} | {d['machine']['gpu'].split(' (')[0]} | "
                        f"{d['commit']} | {d['date'][:10]} |")
    return "\n".join(rows)


def ecache_study(name="ecache-study"):
    """bench/ecache_study.sh: the expert cache's counts a token (a token a forward step over dev.txt)."""
    f = os.path.join(ROOT, f"bench/results/{name}.json")
    if not os.path.exists(f):
        return f"(no bench/results/{name}.json yet)"
    d = json.load(open(f))
    rows = ["| model | slots | home | policy | hit rate | misses / token | fetches / token | bus reads / token | "
            "steps run again / token | PPL |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    names = {"lfu+admit": "decayed LFU + admission", "lfu": "decayed LFU", "lru": "LRU",
             "lfu+admit+prefetch": "decayed LFU + admission + prefetch"}
    for r in d["runs"]:
        x, t = r["result"], r["result"]["tokens"]
        direct = r["home"] == "pinned"
        pol = names.get(r["policy"], r["policy"]) if direct else "LRU"
        mode = "pinned (direct)" if direct else "mapped (replay)"
        bus = f"{(x['cache_misses'] + x['cache_fetched']) / t:.2f}" if direct else "—"
        rows.append(f"| {r['model']} | {r['slots']} of {r['experts']} | {mode} | {pol} | "
                    f"{1 - x['cache_misses'] / x['cache_uses']:.4f} | {x['cache_misses'] / t:.2f} | "
                    f"{x['cache_fetched'] / t:.2f} | {bus} | {x['cache_replays'] / t:.2f} | {x['ppl']:.4f} |")
    rows.append(f"\n({d['dev']}, windows of {d['ctx']} × {d['chunks']}; {d['machine']}; commit {d['commit']}, "
                f"{d['date'][:10]}.)")
    return "\n".join(rows)


TABLES = {"ecache-study": ecache_study, "ecache-prefetch": lambda: ecache_study("ecache-prefetch"), "cuda-batched": cuda_batched, "serve-load": serve_load, "cuda-bench": cuda_bench, "cpu-bench": cpu_bench, "quality": quality, "gate-study": gate_study, "delta-pick": delta_pick, "cpu-delta-pick": cpu_delta_pick}


def render(path, check):
    txt = open(path).read()
    new = txt
    for name, fn in TABLES.items():
        pat = re.compile(r"(<!-- table:%s -->\n)(?:.*?\n)?(<!-- /table:%s -->)" % (name, name), re.S)
        new = pat.sub(lambda m: m.group(1) + fn() + "\n" + m.group(2), new)
    if new != txt:
        if check:
            print(f"{path}: tables are stale; run tools/render_tables.py", file=sys.stderr)
            return 1
        open(path, "w").write(new)
    return 0


if __name__ == "__main__":
    check = "--check" in sys.argv
    rc = 0
    for p in [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs/*.md")):
        rc |= render(p, check)
    sys.exit(rc)
