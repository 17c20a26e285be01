#!/usr/bin/python3
"""Writes a random tiny Dream / DiffuCoder checkpoint in the exact Hugging Face layout.

    DIR/config.json                  every key of the real DiffuCoder-7B config (spec §1.1), tiny sizes
    DIR/generation_config.json       Dream-v0 style generation config (spec §1.2), tiny special ids
    DIR/model.safetensors            (--shards 1), or
    DIR/model-0000i-of-0000N.safetensors + DIR/model.safetensors.index.json   (--shards N > 1)
    DIR/tokenizer.json               only with --tokenizer: the DiffuCoder variant of a Qwen2/Qwen3 file

Weights are named exactly as the HF module tree (spec §1.1): model.embed_tokens.weight,
model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, model.layers.{i}.self_attn.{q,k,v}_proj.bias,
model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.layers.{i}.{input,post_attention}_layernorm.weight,
model.norm.weight, lm_head.weight (untied). No o_proj bias, no inv_freq buffers.

Random init (numpy Generator(PCG64(seed)), drawn in a fixed order, so the output is deterministic):
linear weights N(0, 1/fan_in) (std 0.18 for fan_in 32 .. 0.10 for 96), q/k/v biases N(0, 0.1^2),
embeddings N(0, 1), norm weights 1 + N(0, 0.1^2), lm_head N(0, (2.5/sqrt(hidden))^2) so the logits
have a spread of a few units (no ties, peaked but not one-hot softmax). bf16 checkpoints hold the
round-to-nearest-even bf16 of the same float32 draws.

Usage:
    /usr/bin/python3 make_tiny.py --out DIR [--preset NAME] [--vocab N --hidden N --layers N --heads N
        --kv-heads N --ff N --head-dim N --dtype f32|bf16 --shards N --seed S --tokenizer PATH
        --mask-id N --pad-id N --eos-id N --bos-id N --rope-theta F]
Every file is written atomically (tmp + rename); config.json is written last.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np as st  # noqa: E402

REAL_VOCAB = 152064

# Presets used by make_fixtures.py. head_dim = hidden / heads (Qwen2 / Dream have no head_dim key).
PRESETS = {
    "tiny-gqa1": dict(vocab=384, hidden=32, layers=2, heads=4, kv_heads=4, ff=64, dtype="f32", shards=1,
                      seed=1001, rope_theta=1000000.0),
    "tiny-gqa2": dict(vocab=384, hidden=96, layers=3, heads=6, kv_heads=3, ff=160, dtype="f32", shards=2,
                      seed=1002, rope_theta=10000.0),
    "tiny-gqa4-bf16": dict(vocab=384, hidden=32, layers=2, heads=8, kv_heads=2, ff=75, dtype="bf16",
                           shards=1, seed=1003, rope_theta=1000000.0),
    "tiny-vocab": dict(vocab=REAL_VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, ff=64, dtype="bf16",
                       shards=1, seed=1004, rope_theta=1000000.0,
                       mask_id=151666, pad_id=151643, eos_id=151643, bos_id=151643),
    # Not a test fixture: the server load test's model (BENCHMARKS.md), big enough that reading the
    # weights (the 78 MB lm_head) costs more per forward than one request's arithmetic, as in real models.
    "small-serve": dict(vocab=REAL_VOCAB, hidden=256, layers=2, heads=4, kv_heads=2, ff=768, dtype="bf16",
                        shards=1, seed=1005, rope_theta=1000000.0,
                        mask_id=151666, pad_id=151643, eos_id=151643, bos_id=151643),
}

# DiffuCoder-Instruct's added tokens above the Qwen2.5 block (spec §1.3).
DIFFUCODER_ADDED = [(151665, "<|beginoftext|>"), (151666, "<|mask|>"), (151667, "<|dlm_pad|>")]
QWEN25_LAST_ID = 151664


def default_ids(vocab):
    """Special ids for a small vocab: mask = V-2, pad = eos = V-1, bos = V-3. Real ids for the real vocab."""
    if vocab >= 151668:
        return dict(mask_id=151666, pad_id=151643, eos_id=151643, bos_id=151643)
    return dict(mask_id=vocab - 2, pad_id=vocab - 1, eos_id=vocab - 1, bos_id=vocab - 3)


def config_dict(vocab, hidden, layers, heads, kv_heads, ff, dtype, mask_id, pad_id, eos_id, bos_id,
                rope_theta=1000000.0, rms_eps=1e-6, max_pos=131072):
    # Same key set as DiffuCoder-7B-Instruct's config.json. The spec's table (§1.1) does not list
    # max_window_layers, but the real file is 875 bytes and the table's keys re-serialise to 848; the
    # missing 27 bytes are exactly `  "max_window_layers": 28,\n` (a standard Qwen2 key), so it is kept.
    return {
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_dream.DreamConfig",
            "AutoModel": "modeling_dream.DreamModel",
        },
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": ff,
        "mask_token_id": mask_id,
        "max_position_embeddings": max_pos,
        "max_window_layers": layers,
        "model_type": "Dream",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "pad_token_id": pad_id,
        "rms_norm_eps": rms_eps,
        "rope_scaling": None,
        "rope_theta": float(rope_theta),
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16" if dtype == "bf16" else "float32",
        "transformers_version": "4.51.3",
        "use_cache": False,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


def generation_config_dict(mask_id, pad_id, eos_id, bos_id):
    # Dream-v0-Instruct's generation_config.json (spec §1.2); mask_token_id null there.
    return {
        "_from_model_config": True,
        "alg": "origin",
        "alg_temp": None,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "eps": 0.001,
        "mask_token_id": None,
        "output_history": False,
        "pad_token_id": pad_id,
        "steps": 512,
        "temperature": 0.0,
        "top_k": None,
        "top_p": None,
        "transformers_version": "4.46.2",
    }


def hf_json(obj):
    """How transformers serialises configs: 2-space indent, sorted keys, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_text_atomic(path, text):
    st.atomic_write_bytes(path, [text.encode("utf-8")])


def weight_names(layers):
    names = ["model.embed_tokens.weight"]
    for i in range(layers):
        p = "model.layers.%d." % i
        names += [p + "self_attn.q_proj.weight", p + "self_attn.q_proj.bias",
                  p + "self_attn.k_proj.weight", p + "self_attn.k_proj.bias",
                  p + "self_attn.v_proj.weight", p + "self_attn.v_proj.bias",
                  p + "self_attn.o_proj.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight",
                  p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names += ["model.norm.weight", "lm_head.weight"]
    return names


def random_weights(vocab, hidden, layers, heads, kv_heads, ff, seed):
    """float32 weights in module order (deterministic)."""
    head_dim = hidden // heads
    rng = np.random.Generator(np.random.PCG64(seed))

    def normal(shape, std):
        return (rng.standard_normal(size=shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def linear(out_f, in_f):
        return normal((out_f, in_f), 1.0 / np.sqrt(in_f))

    def norm_w(n):
        return (np.float32(1.0) + normal((n,), 0.1)).astype(np.float32)

    w = {}
    w["model.embed_tokens.weight"] = normal((vocab, hidden), 1.0)
    for i in range(layers):
        p = "model.layers.%d." % i
        w[p + "self_attn.q_proj.weight"] = linear(heads * head_dim, hidden)
        w[p + "self_attn.q_proj.bias"] = normal((heads * head_dim,), 0.1)
        w[p + "self_attn.k_proj.weight"] = linear(kv_heads * head_dim, hidden)
        w[p + "self_attn.k_proj.bias"] = normal((kv_heads * head_dim,), 0.1)
        w[p + "self_attn.v_proj.weight"] = linear(kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.bias"] = normal((kv_heads * head_dim,), 0.1)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, heads * head_dim)
        w[p + "mlp.gate_proj.weight"] = linear(ff, hidden)
        w[p + "mlp.up_proj.weight"] = linear(ff, hidden)
        w[p + "mlp.down_proj.weight"] = linear(hidden, ff)
        w[p + "input_layernorm.weight"] = norm_w(hidden)
        w[p + "post_attention_layernorm.weight"] = norm_w(hidden)
    w["model.norm.weight"] = norm_w(hidden)
    w["lm_head.weight"] = normal((vocab, hidden), 2.5 / np.sqrt(hidden))
    assert list(w) == weight_names(layers)
    return w


def split_shards(names, sizes, n):
    """Contiguous split of the module-ordered names into n non-empty groups of about equal bytes."""
    if n < 1 or n > len(names):
        raise ValueError("bad shard count %d for %d tensors" % (n, len(names)))
    total = float(sum(sizes))
    groups = [[] for _ in range(n)]
    acc = 0
    for name, sz in zip(names, sizes):
        mid = acc + sz / 2.0  # a tensor goes to the shard its middle byte falls in
        groups[min(n - 1, int(mid * n / total))].append(name)
        acc += sz
    # guarantee non-empty groups (tiny models: fall back to an even split by count)
    if any(not gr for gr in groups):
        per = len(names) // n
        groups = [names[i * per:(i + 1) * per] for i in range(n - 1)] + [names[(n - 1) * per:]]
    return groups


def diffucoder_tokenizer(src_path):
    """Qwen2/Qwen3 tokenizer.json -> DiffuCoder-Instruct variant (as a JSON-able dict).

    Every added token with id > 151664 is removed (from added_tokens and from model.vocab if present);
    151665 <|beginoftext|>, 151666 <|mask|>, 151667 <|dlm_pad|> are appended as special added tokens.
    """
    with open(src_path, "r", encoding="utf-8") as f:
        tok = json.load(f)
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] <= QWEN25_LAST_ID]
    vocab = tok.get("model", {}).get("vocab")
    if isinstance(vocab, dict):
        for k in [k for k, i in vocab.items() if i > QWEN25_LAST_ID]:
            del vocab[k]
    for tid, content in DIFFUCODER_ADDED:
        tok["added_tokens"].append({"id": tid, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    return tok


def write_tokenizer(src_path, out_dir):
    tok = diffucoder_tokenizer(src_path)
    text = json.dumps(tok, ensure_ascii=False, indent=2)
    write_text_atomic(os.path.join(out_dir, "tokenizer.json"), text)


def make_tiny(out, vocab, hidden, layers, heads, kv_heads, ff, head_dim=None, dtype="f32", shards=1, seed=0,
              tokenizer=None, mask_id=None, pad_id=None, eos_id=None, bos_id=None, rope_theta=1000000.0,
              rms_eps=1e-6, max_pos=131072):
    if head_dim is not None:
        if hidden is None:
            hidden = heads * head_dim
        if hidden != heads * head_dim:
            raise ValueError("hidden (%d) must equal heads*head_dim (%d*%d): Dream has no head_dim key"
                             % (hidden, heads, head_dim))
    if hidden % heads or heads % kv_heads:
        raise ValueError("need hidden %% heads == 0 and heads %% kv_heads == 0")
    if dtype not in ("f32", "bf16"):
        raise ValueError("dtype must be f32 or bf16")
    ids = default_ids(vocab)
    mask_id = ids["mask_id"] if mask_id is None else mask_id
    pad_id = ids["pad_id"] if pad_id is None else pad_id
    eos_id = ids["eos_id"] if eos_id is None else eos_id
    bos_id = ids["bos_id"] if bos_id is None else bos_id
    for n, v in (("mask", mask_id), ("pad", pad_id), ("eos", eos_id), ("bos", bos_id)):
        if not 0 <= v < vocab:
            raise ValueError("%s id %d out of range for vocab %d" % (n, v, vocab))
    os.makedirs(out, exist_ok=True)

    w32 = random_weights(vocab, hidden, layers, heads, kv_heads, ff, seed)
    if dtype == "bf16":
        tensors = {k: st.BF16(st.f32_to_bf16_bits(v)) for k, v in w32.items()}
    else:
        tensors = w32
    names = list(w32)
    sizes = [st.tensor_nbytes(tensors[n]) for n in names]

    # remove stale weight files from an earlier run with a different sharding
    for fn in os.listdir(out):
        if fn.startswith("model") and (fn.endswith(".safetensors") or fn.endswith(".index.json")):
            os.remove(os.path.join(out, fn))
    if os.path.exists(os.path.join(out, "tokenizer.json")) and not tokenizer:
        os.remove(os.path.join(out, "tokenizer.json"))

    meta = {"format": "pt"}
    if shards == 1:
        st.write_file(os.path.join(out, "model.safetensors"), tensors, metadata=meta)
    else:
        groups = split_shards(names, sizes, shards)
        weight_map = {}
        for i, gr in enumerate(groups):
            fn = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
            st.write_file(os.path.join(out, fn), {n: tensors[n] for n in gr}, metadata=meta)
            for n in gr:
                weight_map[n] = fn
        index = {"metadata": {"total_size": int(sum(sizes))}, "weight_map": weight_map}
        write_text_atomic(os.path.join(out, "model.safetensors.index.json"), hf_json(index))

    if tokenizer:
        write_tokenizer(tokenizer, out)
    write_text_atomic(os.path.join(out, "generation_config.json"),
                      hf_json(generation_config_dict(mask_id, pad_id, eos_id, bos_id)))
    cfg = config_dict(vocab, hidden, layers, heads, kv_heads, ff, dtype, mask_id, pad_id, eos_id, bos_id,
                      rope_theta, rms_eps, max_pos)
    write_text_atomic(os.path.join(out, "config.json"), hf_json(cfg))
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="start from a preset (explicit flags override it); default: tiny-gqa1 sizes")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--ff", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--dtype", choices=["f32", "bf16"])
    ap.add_argument("--shards", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--rope-theta", type=float)
    ap.add_argument("--tokenizer", default=None, help="Qwen2/Qwen3 tokenizer.json to turn into DiffuCoder's")
    ap.add_argument("--mask-id", type=int)
    ap.add_argument("--pad-id", type=int)
    ap.add_argument("--eos-id", type=int)
    ap.add_argument("--bos-id", type=int)
    a = ap.parse_args(argv)
    p = dict(PRESETS[a.preset or "tiny-gqa1"])
    for key in ("vocab", "hidden", "layers", "heads", "kv_heads", "ff", "dtype", "shards", "seed", "rope_theta",
                "mask_id", "pad_id", "eos_id", "bos_id"):
        v = getattr(a, key)
        if v is not None:
            p[key] = v
    if a.head_dim is not None:
        p["head_dim"] = a.head_dim
        if a.hidden is None:
            p["hidden"] = p["heads"] * a.head_dim
    if a.vocab is not None and a.preset is None:
        for k in ("mask_id", "pad_id", "eos_id", "bos_id"):
            if getattr(a, k) is None:
                p.pop(k, None)
    cfg = make_tiny(a.out, tokenizer=a.tokenizer, **p)
    print(json.dumps({k: cfg[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                          "num_key_value_heads", "intermediate_size", "torch_dtype",
                                          "mask_token_id", "pad_token_id")}))


if __name__ == "__main__":
    main()
