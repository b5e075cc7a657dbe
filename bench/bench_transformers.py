#!/usr/bin/env python3
"""The same models through transformers (bf16, eager PyTorch, same GPU): the denominator of moet/transformers.

Runs on the device machine (torch + transformers there; no hub: models are local or built from a config).

  python3 bench/bench_transformers.py --json OUT.json [--tg 128] [--tg-synthetic 16]

moe-mini-a: from models/moe-mini-a (safetensors), bf16. qwen3-30b-a3b: Qwen3MoeConfig of the real shape (48 layers,
128 experts top-8, hidden 2048, expert FFN 768, 32 q / 4 kv heads of 128, vocab 151936) with random bf16 weights
made on the GPU (61 GB). qwen3-235b-a22b (470 GB in bf16) does not fit one H200 and is left out.
pp: one forward of 512 tokens (after a warm-up). tg: greedy decode with the KV cache (DynamicCache), one token per
forward from a 4-token prompt, like `moet bench`; t/s = tokens / wall time with a synchronize at the end.
"""
import argparse, datetime, json, os, subprocess, time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sync():
    torch.cuda.synchronize()


@torch.inference_mode()
def bench(model, vocab, pp, tg):
    dev = "cuda"
    ids = (torch.arange(pp + tg + 8, device=dev) * 7919 + 13) % vocab
    model(ids[None, :pp])  # warm-up
    sync()
    t0 = time.perf_counter()
    model(ids[None, :pp])
    sync()
    pp_tps = pp / (time.perf_counter() - t0)
    out = model(ids[None, :4], use_cache=True)
    pkv = out.past_key_values
    nxt = out.logits[:, -1:].argmax(-1)
    for _ in range(2):  # warm-up steps
        out = model(nxt, past_key_values=pkv, use_cache=True)
        pkv, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    out = model(ids[None, :4], use_cache=True)
    pkv, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    sync()
    t0 = time.perf_counter()
    for _ in range(tg):
        out = model(nxt, past_key_values=pkv, use_cache=True)
        pkv, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    sync()
    return pp_tps, tg / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--tg-synthetic", type=int, default=16)
    a = ap.parse_args()
    results = []
    m = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "models", "moe-mini-a"), dtype=torch.bfloat16).cuda().eval()
    pp, tg = bench(m, m.config.vocab_size, a.pp, a.tg)
    results.append({"model": "moe-mini-a", "dtype": "bf16", "pp": a.pp, "pp_tps": pp, "tg": a.tg, "tg_tps": tg})
    print(f"moe-mini-a: pp{a.pp} {pp:.1f} t/s, tg{a.tg} {tg:.1f} t/s", flush=True)
    del m
    torch.cuda.empty_cache()
    cfg = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                         num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                         num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=4096,
                         rope_theta=1e6, tie_word_embeddings=False)
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        m = Qwen3MoeForCausalLM(cfg).eval()
    print(f"qwen3-30b-a3b (random bf16) built in {time.perf_counter() - t0:.1f} s", flush=True)
    pp, tg = bench(m, cfg.vocab_size, a.pp, a.tg_synthetic)
    results.append({"model": "qwen3-30b-a3b", "dtype": "bf16", "pp": a.pp, "pp_tps": pp, "tg": a.tg_synthetic,
                    "tg_tps": tg})
    print(f"qwen3-30b-a3b: pp{a.pp} {pp:.1f} t/s, tg{a.tg_synthetic} {tg:.1f} t/s", flush=True)
    commit = os.environ.get("MOET_COMMIT") or subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"],
                                                             cwd=ROOT, capture_output=True, text=True).stdout.strip()
    doc = {"tool": "bench/bench_transformers.py", "commit": commit, "gpu": torch.cuda.get_device_name(0),
           "date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "transformers": transformers.__version__, "results": results}
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
