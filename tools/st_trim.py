#!/usr/bin/env python3
"""Keeps the first N windows (the leading dimension) of every tensor of a reference safetensors file.

  python3 tools/st_trim.py IN OUT N

Standard library only (this machine has no torch). Used to fit the fixtures into a device call's 64 MiB working tree:
moe-mini-b's reference keeps windows 0-1 of the 4 made, and tools/gpu_carry.sh carries moe-mini-a's with window 0.
"""
import json, struct, sys

def main():
    src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(src, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out, blobs, off = {}, [], 0
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        t, shape = data[s:e], v["shape"]
        if shape[0] < keep:
            sys.exit(f"{k}: {shape[0]} windows, fewer than {keep}")
        per = len(t) // shape[0]
        t = t[:keep * per]
        out[k] = {"dtype": v["dtype"], "shape": [keep] + shape[1:], "data_offsets": [off, off + len(t)]}
        blobs.append(t)
        off += len(t)
    if "__metadata__" in h:
        md = dict(h["__metadata__"])
        md["note"] = md.get("note", "") + f" (the first {keep} windows kept)"
        out["__metadata__"] = md
    hj = json.dumps(out, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))

if __name__ == "__main__":
    main()
