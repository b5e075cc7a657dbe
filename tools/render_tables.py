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
            rows.append(f"| {os.path.basename(d['model'])} | {r['threads']} | {r['pp_tps']:.1f} | {r['tg_tps']:.1f} | "
                        f"{d['peak_rss_bytes'] / 2**20:.0f} MiB | {d['machine']['cpu']}, {d['machine']['cores']} cores | "
                        f"{d['commit']} | {d['date'][:10]} |")
    return "\n".join(rows)


TABLES = {"cpu-bench": cpu_bench}


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
