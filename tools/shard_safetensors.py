#!/usr/bin/env python3
"""Splits a checkpoint's model.safetensors into N shards with a model.safetensors.index.json, as the hub lays out
large models (stdlib only; used by the sharded-loading test).  usage: shard_safetensors.py SRC_DIR DST_DIR N"""
import json, os, shutil, struct, sys

src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
hl = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + hl])
data = raw[8 + hl:]
names = sorted(k for k in hdr if k != "__metadata__")
os.makedirs(dst, exist_ok=True)
weight_map = {}
for s in range(n):
    part = names[s::n]
    fname = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
    out, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for k in part:
        b, e = hdr[k]["data_offsets"]
        out[k] = {"dtype": hdr[k]["dtype"], "shape": hdr[k]["shape"], "data_offsets": [off, off + e - b]}
        blobs.append(data[b:e])
        off += e - b
        weight_map[k] = fname
    h = json.dumps(out).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(dst, fname), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map},
          open(os.path.join(dst, "model.safetensors.index.json"), "w"), indent=1)
for f in os.listdir(src):
    if f.endswith(".json") and f != "model.safetensors.index.json":
        shutil.copy(os.path.join(src, f), dst)
