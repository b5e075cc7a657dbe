#!/usr/bin/env python3
"""Reference fixtures for moet's tests, made with transformers + HF tokenizers.

Runs on the GPU machine (it has torch, transformers and tokenizers; this machine does not).
Nothing here is hand-written expectation: every id and logit comes from the Hugging Face stack.

  python3 tools/make_fixtures.py --out OUTDIR [--dev PATH_TO_dev.txt]

Writes into OUTDIR:
  tokenizer_cases.json      [{"text": s, "ids": [...]}, ...] from tokenizers.Tokenizer(models/moe-mini-a/tokenizer.json)
  moe-mini-b/               a second Qwen3-MoE of a different shape (random init, bf16 on disk):
                            config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
                            reference_fp32.safetensors (logits [W,T,V] f32, input_ids [W,T] i32, greedy_ids [W,G] i32)
  mixtral-mini/             a small MixtralForCausalLM (random init, bf16 on disk, moe-mini-a's tokenizer): the same
                            files as moe-mini-b (--only-mixtral writes just this one, and glm4moe-mini)
  glm4moe-mini/             a small Glm4MoeForCausalLM, the same way (--only-glm4moe writes just this one)
  deepseek-mini/            a small DeepseekV3ForCausalLM (MLA with a q bottleneck, interleaved rope dims, YaRN with
                            an attention factor != 1), the same way but only windows 0-1, 24 tokens each (the tree
                            must fit a device call's 64 MiB); --only-deepseek writes just this one
  gpt-oss-mini/             a small GptOssForCausalLM (sinks, a sliding layer, YaRN untruncated, biased router and
                            experts, the clamped SwiGLU), the same way; --only-gpt-oss writes just this one
                            (--only-new: both, each on its own even if the other fails)
  dev_ids.u16               the whole dev text tokenized (little-endian uint16), if --dev is given
  ppl_ref.json              transformers' fp32 perplexity of moe-mini-a on dev windows (ctx 512, 16 chunks)
"""
import argparse, json, os, shutil, struct, hashlib, sys

import torch
from tokenizers import Tokenizer
from safetensors.torch import save_file
import transformers
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL_A = os.path.join(ROOT, "models", "moe-mini-a")

CASES = [
    "",
    "Hello, world!",
    "hello world",
    " leading space",
    "trailing space ",
    "   three leading spaces",
    "multiple   spaces    between     words",
    "tab\tseparated\tvalues\t\t",
    "line one\nline two\n\nline four\n",
    "windows\r\nline\r\nendings\r\n",
    "mixed \t \n whitespace \r\n\t  end",
    "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "def f(x):\n\treturn [i**2 for i in range(x) if i % 3 == 0]\n",
    "my $x = $h{'key'} // 'default'; s/foo(\\d+)/bar$1/g;",
    "3.14159 2718 1000000 0x1F -42 1e-6 12,345.67",
    "version 5.20.3 released 2015-09-12",
    "café naïve résumé façade Ångström",
    "Straße über Öl æøå ÆØÅ",
    "日本語のテキストです。",
    "中文文本，包括标点符号！",
    "한국어 텍스트",
    "Ελληνικά και русский текст",
    "emoji: 😀🎉👍🏽",
    "family: 👨‍👩‍👧‍👦 and flag 🏳️‍🌈",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|endoftext|>",
    "a<|im_end|>b<|im_start|>c",
    "don't won't it's we're they've I'm you'll he'd",
    "DON'T SHOUT IT'S LOUD",
    "=head1 NAME\n\nperl5203delta - what is new for perl v5.20.3\n",
    "L<perlfunc/study> C<$Config{cppsymbols}> F<t/perf/taint.t>",
    "https://github.com/Perl/perl5/issues/14491",
    "!!!???...,,,;;;:::",
    "    indented code block\n        more indented\n",
    "\u00a0non-breaking\u00a0space and\u2009thin space",
    "zero\u200bwidth\u200bspace",
    "a" * 100,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "\n\n\n",
    " ",
    "x",
]


def tokenizer_cases(out):
    tok = Tokenizer.from_file(os.path.join(MODEL_A, "tokenizer.json"))
    rows = []
    for s in CASES:
        ids = tok.encode(s).ids
        rows.append({"text": s, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(out, "tokenizer_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": __import__("tokenizers").__version__, "cases": rows}, f,
                  ensure_ascii=True, indent=1)
    print(f"tokenizer cases: {len(rows)}", flush=True)
    return tok


def make_model_b(out, tok, windows):
    torch.manual_seed(1234)
    cfg = Qwen3MoeConfig(
        vocab_size=4096, hidden_size=128, intermediate_size=192, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=48, hidden_act="silu",
        max_position_embeddings=512, initializer_range=0.1, rms_norm_eps=1e-5,
        tie_word_embeddings=True, rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
        attention_bias=False, decoder_sparse_step=1, moe_intermediate_size=32,
        num_experts_per_tok=8, num_experts=64, norm_topk_prob=False, mlp_only_layers=[2],
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    model = Qwen3MoeForCausalLM(cfg)
    save_with_reference(model, os.path.join(out, "moe-mini-b"), windows)


def make_model_mixtral(out, windows):
    torch.manual_seed(4321)
    cfg = MixtralConfig(
        vocab_size=4096, hidden_size=128, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
        max_position_embeddings=512, initializer_range=0.1, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=None,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    model = MixtralForCausalLM(cfg)
    save_with_reference(model, os.path.join(out, "mixtral-mini"), windows)


def make_model_glm4moe(out, windows):
    """GLM-4.5's MoE: sigmoid router with a choice bias and group-limited top-k (4 groups, 2 kept), a shared
    expert, one dense first layer, q/k/v biases, q/k norm, half the head's dims rotated."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    def build(dense_ffn):
        torch.manual_seed(2468)
        cfg = Glm4MoeConfig(
            vocab_size=4096, hidden_size=128, intermediate_size=dense_ffn, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, hidden_act="silu",
            max_position_embeddings=512, initializer_range=0.1, rms_norm_eps=1e-5, tie_word_embeddings=False,
            partial_rotary_factor=0.5,
            rope_parameters={"rope_theta": 1000000.0, "rope_type": "default", "partial_rotary_factor": 0.5},
            attention_bias=True, moe_intermediate_size=32, num_experts_per_tok=4, n_shared_experts=1,
            n_routed_experts=16, routed_scaling_factor=2.5, n_group=4, topk_group=2, first_k_dense_replace=1,
            norm_topk_prob=True, use_qk_norm=True, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )
        return Glm4MoeForCausalLM(cfg)
    model = build(160)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if ".layers.1.mlp.experts" in n}
    print("glm4moe expert params:", shapes, flush=True)
    if any(v[1] != 64 for n, v in shapes.items() if n.endswith("gate_up_proj")):
        print("glm4moe: experts not moe_intermediate_size wide; dense width set equal", flush=True)
        model = build(32)
    with torch.no_grad():  # a choice bias that changes picks (zeros at init), and biases that are not zero
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn_like(b))
        for n, p in model.named_parameters():
            if n.endswith("_proj.bias"):
                p.copy_(0.2 * torch.randn_like(p))
    save_with_reference(model, os.path.join(out, "glm4moe-mini"), windows)


def make_model_deepseek(out, windows):
    """DeepSeek-V3's MLA (q through a rank-48 bottleneck, latent kv of rank 32, 16 rope dims interleaved, v 24 wide
    of a 48-wide q/k head), YaRN x4 from a 128-token pre-training context with mscale 1 / mscale_all_dim 0.8 (an
    attention factor != 1 and a scaled softmax), the sigmoid group router (4 groups, 2 kept), a shared expert, one
    dense first layer; rms_norm_eps 1e-5, so that the bottleneck norms' own epsilon (1e-6 in transformers) shows."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    import inspect
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdv3
    src = inspect.getsource(mdv3.DeepseekV3Attention.__init__)
    print("DeepseekV3Attention.__init__ (norm eps, scaling):", flush=True)
    for line in src.splitlines():
        if "RMSNorm" in line or "scaling" in line or "mscale" in line or "rope" in line:
            print("   ", line.strip(), flush=True)
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}
    torch.manual_seed(97531)
    cfg = DeepseekV3Config(
        vocab_size=4096, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=16,
        routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, v_head_dim=24,
        qk_nope_head_dim=32, n_group=4, topk_group=2, num_experts_per_tok=4, first_k_dense_replace=1,
        norm_topk_prob=True, hidden_act="silu", max_position_embeddings=512, initializer_range=0.1,
        rms_norm_eps=1e-5, tie_word_embeddings=True, rope_interleave=True, attention_bias=False,
        rope_parameters=rope, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    model = DeepseekV3ForCausalLM(cfg)
    print("deepseek rotary: attention_scaling", model.model.rotary_emb.attention_scaling,
          "inv_freq", model.model.rotary_emb.inv_freq.tolist(), "attn scaling", model.model.layers[0].self_attn.scaling,
          flush=True)
    with torch.no_grad():  # a choice bias that changes picks (zeros at init)
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn_like(b))
    save_with_reference(model, os.path.join(out, "deepseek-mini"), [w[:24] for w in windows[:2]])


def make_model_gpt_oss(out, windows):
    """gpt-oss: q/k/v/o biases, attention sinks, layer 0 sliding (window 8 of 24 tokens) and layer 1 full, YaRN x32
    from a 64-token context, untruncated, the router's bias, top-2 of 4 experts softmaxed among themselves, expert
    biases and the clamped SwiGLU (limit 7), experts saved as transformers lays them out ([E, in, out], bf16)."""
    from transformers import GptOssConfig, GptOssForCausalLM
    torch.manual_seed(8642)
    cfg = GptOssConfig(
        vocab_size=4096, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64},
        tie_word_embeddings=False, swiglu_limit=7.0, initializer_range=0.1, attention_bias=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    model = GptOssForCausalLM(cfg)
    print("gpt-oss params:", {n: tuple(p.shape) for n, p in model.named_parameters() if ".layers.0." in n}, flush=True)
    print("gpt-oss rotary: attention_scaling", model.model.rotary_emb.attention_scaling,
          "inv_freq", model.model.rotary_emb.inv_freq.tolist(), flush=True)
    with torch.no_grad():  # biases and sinks that are not zero, experts large enough that the clamp at 7 bites
        for n, p in model.named_parameters():
            if n.endswith("bias") or n.endswith("sinks"):
                p.copy_(0.5 * torch.randn_like(p))
            if ".experts." in n and not n.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
    save_with_reference(model, os.path.join(out, "gpt-oss-mini"), [w[:24] for w in windows[:2]])


def save_with_reference(model, d, windows):
    """bf16 checkpoint + moe-mini-a's tokenizer in d, and transformers' fp32 logits and greedy ids of what was written."""
    name = os.path.basename(d)
    # Larger norm weights than the all-ones init so the norms are exercised.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    for i, layer in enumerate(model.model.layers):
        print(f"{name} layer {i}: mlp = {type(layer.mlp).__name__}", flush=True)
    os.makedirs(d, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(MODEL_A, f), d)
    # Reference: reload what was written, upcast to fp32, like the shared models' references.
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.tensor(windows, dtype=torch.long)
    with torch.no_grad():
        logits = ref(ids).logits.float()
        gen = ref.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0, eos_token_id=None)
    greedy = gen[:, ids.shape[1]:]
    # Greedy must not hinge on a near-tie, or an exact-match test would test rounding.
    with torch.no_grad():
        full = ref(gen).logits.float()[:, ids.shape[1] - 1:-1]
    top2 = torch.topk(torch.softmax(full, -1), 2, dim=-1).values
    print(f"{name}: min greedy top1-top2 prob margin {float((top2[..., 0] - top2[..., 1]).min()):.4g}", flush=True)
    save_file({"logits": logits.contiguous(), "input_ids": ids.to(torch.int32).contiguous(),
               "greedy_ids": greedy.to(torch.int32).contiguous()},
              os.path.join(d, "reference_fp32.safetensors"),
              metadata={"transformers": transformers.__version__,
                        "note": "transformers fp32 forward of model.safetensors (bf16 weights upcast)"})
    print(f"{name} files:", sorted(os.listdir(d)), flush=True)
    with open(os.path.join(d, "config.json")) as f:
        print(f.read(), flush=True)
    import safetensors
    with safetensors.safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        print(f"{name} tensors (layer 0):", sorted(k for k in f.keys() if ".layers.0." in k), flush=True)


def ppl_ref(out, dev_ids, ctx=512, chunks=16):
    model = AutoModelForCausalLM.from_pretrained(MODEL_A, dtype=torch.float32).cuda().eval()
    nll, n = 0.0, 0
    with torch.no_grad():
        for c in range(chunks):
            w = torch.tensor(dev_ids[c * ctx:(c + 1) * ctx], dtype=torch.long, device="cuda")[None]
            lp = torch.log_softmax(model(w).logits.float()[0, :-1].double(), -1)
            nll -= float(lp.gather(1, w[0, 1:, None]).sum())
            n += ctx - 1
    res = {"model": "moe-mini-a", "ctx": ctx, "chunks": chunks, "tokens": n,
           "ppl": float(torch.exp(torch.tensor(nll / n, dtype=torch.float64))),
           "transformers": transformers.__version__}
    with open(os.path.join(out, "ppl_ref.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("ppl_ref", res, flush=True)


def extra_tokenizers(out, dev_path):
    """Tokenizers of the other real layouts, trained on the dev text so they have real merges:
    spm-legacy: Llama-2/Mixtral (Prepend+Replace normalizer, byte_fallback BPE, Replace/ByteFallback/Fuse/Strip
                decoder, <s> template); spm-metaspace: the newer Metaspace pre-tokenizer + decoder form;
    qwen2: NFC normalizer, Split(Qwen2 regex, Isolated) + ByteLevel(use_regex=false), as Qwen2/Qwen3 ship."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders, trainers, processors, Regex
    lines = open(dev_path, encoding="utf-8").read().splitlines()[:20000]
    byte_toks = [f"<0x{i:02X}>" for i in range(256)]
    made = {}
    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>"] + byte_toks))
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])
    made["spm-legacy"] = t
    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    t.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>"] + byte_toks))
    made["spm-metaspace"] = t
    qwen_re = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(qwen_re), behavior="isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    made["qwen2"] = t
    cases = CASES + ["e\u0301t\u00e9 (NFC: e + combining acute)", "ﬁ ligature and ① circled", "<s>inside</s> text"]
    for name, t in made.items():
        t.save(os.path.join(out, f"tok-{name}.json"))
        rows = [{"text": c, "ids": t.encode(c).ids, "decoded": t.decode(t.encode(c).ids, skip_special_tokens=False)}
                for c in cases]
        with open(os.path.join(out, f"tok-{name}-cases.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizers_version": __import__("tokenizers").__version__, "cases": rows}, f, ensure_ascii=True, indent=1)
        print(f"tokenizer {name}: {len(rows)} cases", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dev")
    ap.add_argument("--only-tokenizers", action="store_true")
    ap.add_argument("--only-mixtral", action="store_true")
    ap.add_argument("--only-glm4moe", action="store_true")
    ap.add_argument("--only-deepseek", action="store_true")
    ap.add_argument("--only-gpt-oss", action="store_true")
    ap.add_argument("--only-new", action="store_true", help="deepseek-mini and gpt-oss-mini (one device call)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    tok = tokenizer_cases(a.out)
    if a.dev:
        extra_tokenizers(a.out, a.dev)
    if a.only_tokenizers:
        return
    dev_ids = None
    if a.dev:
        with open(a.dev, encoding="utf-8") as f:
            dev_ids = tok.encode(f.read()).ids
        # little-endian uint16 (every id of a vocabulary below 65536; half the bytes of int32: the tree travels to
        # each device call); the sha256 below stays that of the int32 packing, comparable with earlier runs
        assert max(dev_ids) < 65536
        with open(os.path.join(a.out, "dev_ids.u16"), "wb") as f:
            f.write(struct.pack(f"<{len(dev_ids)}H", *dev_ids))
        print(f"dev ids: {len(dev_ids)} sha256 "
              f"{hashlib.sha256(struct.pack(f'<{len(dev_ids)}i', *dev_ids)).hexdigest()}", flush=True)
        windows = [dev_ids[i * 1000: i * 1000 + 40] for i in range(4)]
    else:
        windows = [[(7 * i + 13 * j) % 4000 + 3 for j in range(40)] for i in range(4)]
    if a.only_glm4moe:
        make_model_glm4moe(a.out, windows)
        return
    if a.only_new:
        for make in (make_model_deepseek, make_model_gpt_oss):
            try:  # one failing (an API change in transformers) must not cost the other
                make(a.out, windows)
            except Exception as ex:
                print(f"{make.__name__} failed: {type(ex).__name__}: {ex}", flush=True)
        return
    if a.only_deepseek:
        make_model_deepseek(a.out, windows)
        return
    if a.only_gpt_oss:
        make_model_gpt_oss(a.out, windows)
        return
    if not a.only_mixtral:
        make_model_b(a.out, tok, windows)
    make_model_mixtral(a.out, windows)
    make_model_glm4moe(a.out, windows)
    if a.only_mixtral:
        return
    if dev_ids is not None and torch.cuda.is_available():
        ppl_ref(a.out, dev_ids)


if __name__ == "__main__":
    main()
