#!/usr/bin/env python3
"""PEFT LoRA adapters for a tiny reference checkpoint, and the logits of the adapted model (ctest `lora_fixtures`).

Written from PEFT's published format (save_pretrained of a LoraConfig: adapter_config.json + adapter_model.safetensors
with tensors "base_model.model.<module>.lora_A.weight" [r, in] and ".lora_B.weight" [out, r]; modules_to_save saved
whole as "base_model.model.<module>.weight") and the LoRA formula (W' = W + (B @ A) * scaling, scaling = lora_alpha / r,
or lora_alpha / sqrt(r) with use_rslora), not from the engine's code. The forward is dream_ref.py's, in float32.

    make_lora.py --fixtures build/fixtures --out build/lora_fixtures [--force]

Writes OUT/lora.json (the cases), OUT/<case>/adapter/ (the adapter), OUT/<case>/logits.f32 (raw little-endian f32
[B, L, V], unshifted), OUT/bad/<name>/ (broken adapters; bad.json: the error each must give) and OUT/.complete last.
"""
import argparse
import hashlib
import json
import math
import os
import re
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dream_ref  # noqa: E402
import safetensors_np as st  # noqa: E402

BASE = "tiny-gqa2"  # f32, 2 shards, 3 layers, hidden 96, 6 / 3 heads, ff 160, vocab 384
LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# name, config fields, tensor dtype ("F32" | "F16" | "BF16"), adapter-name infix in the tensor names.
CASES = [
    ("list_all", {"r": 4, "lora_alpha": 8, "target_modules": LINEAR}, "F32", ""),
    ("regex_patterns", {"r": 8, "lora_alpha": 16,
                        "target_modules": r"model\.layers\.[02]\.(self_attn\.(q|v)_proj|mlp\.down_proj)",
                        "rank_pattern": {"down_proj": 2}, "alpha_pattern": {"v_proj": 4},
                        "modules_to_save": ["embed_tokens"]}, "F16", ".default"),
    ("rslora_save_lm_head", {"r": 16, "lora_alpha": 4, "use_rslora": True, "target_modules": ["o_proj", "mlp.gate_proj"],
                             "layers_to_transform": [0, 2], "modules_to_save": ["lm_head"]}, "BF16", ""),
    ("target_lm_head", {"r": 2, "lora_alpha": 3, "target_modules": ["k_proj", "lm_head"]}, "F32", ""),
]


def peft_config(fields):
    """adapter_config.json as PEFT 0.13's LoraConfig.save_pretrained writes it (defaults, then the case's fields)."""
    c = {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "tiny-dream", "bias": "none",
         "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "layer_replication": None,
         "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": 8, "lora_dropout": 0.05,
         "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None, "peft_type": "LORA", "r": 8,
         "rank_pattern": {}, "revision": None, "target_modules": None, "task_type": "CAUSAL_LM", "use_dora": False,
         "use_rslora": False}
    c.update(fields)
    return c


def modules(model):
    """{module name: weight [out, in]} of the linear modules LoRA may target."""
    out = {}
    for name, w in model.weights.items():
        if name.endswith(".weight") and w.dim() == 2 and name != "model.embed_tokens.weight":
            out[name[:-len(".weight")]] = w
    return out


def selected(cfg, module):
    """PEFT's check_target_module_exists (list: equal or '.'-suffix; str: re.fullmatch) + layers_to_transform."""
    t = cfg["target_modules"]
    found = re.fullmatch(t, module) is not None if isinstance(t, str) else any(
        module == k or module.endswith("." + k) for k in t)
    if found and cfg.get("layers_to_transform") is not None:
        m = re.match(r"model\.layers\.(\d+)\.", module)
        found = m is not None and int(m.group(1)) in cfg["layers_to_transform"]
    return found


def pattern(patterns, module, default):
    """PEFT's rank_pattern / alpha_pattern lookup: the first key with re.match(rf"(.*\\.)?{key}$", module)."""
    for key, value in patterns.items():
        if re.match(r"(.*\.)?%s$" % key, module):
            return value
    return default


def stored(x, dtype):
    """x rounded to the dtype the adapter file stores, as the f32 values the merge reads back."""
    if dtype == "F16":
        return x.astype(np.float16)
    if dtype == "BF16":
        return st.BF16(st.f32_to_bf16_bits(x.astype(np.float32)))
    return x.astype(np.float32)


def as_f32(v):
    return st.bf16_bits_to_f32(v.bits).reshape(v.bits.shape) if isinstance(v, st.BF16) else np.asarray(v, np.float32)


def write_case(base, name, fields, dtype, infix, out, rng, input_ids):
    cfg = peft_config(fields)
    tensors, merged = {}, dict(base.weights)
    for module, w in sorted(modules(base).items()):
        if not selected(cfg, module):
            continue
        r = pattern(cfg["rank_pattern"], module, cfg["r"])
        alpha = pattern(cfg["alpha_pattern"], module, cfg["lora_alpha"])
        out_dim, in_dim = w.shape
        a = stored(rng.normal(0, 1 / math.sqrt(in_dim), (r, in_dim)), dtype)   # lora_A [r, in]
        b = stored(rng.normal(0, 0.3, (out_dim, r)), dtype)                    # lora_B [out, r]
        tensors["base_model.model.%s.lora_A%s.weight" % (module, infix)] = a
        tensors["base_model.model.%s.lora_B%s.weight" % (module, infix)] = b
        scaling = alpha / math.sqrt(r) if cfg["use_rslora"] else alpha / r
        delta = (torch.from_numpy(as_f32(b)) @ torch.from_numpy(as_f32(a))) * scaling
        merged[module + ".weight"] = w + delta
    for module in cfg["modules_to_save"] or []:
        key = "lm_head" if module == "lm_head" else "model.embed_tokens"
        w = base.weights[key + ".weight"]
        new = stored(w.numpy() + rng.normal(0, 0.05, tuple(w.shape)), dtype)
        tensors["base_model.model.%s.weight" % key] = new
        merged[key + ".weight"] = torch.from_numpy(as_f32(new).copy())
    adapter = os.path.join(out, name, "adapter")
    os.makedirs(adapter, exist_ok=True)
    with open(os.path.join(adapter, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=False)
    st.write_file(os.path.join(adapter, "adapter_model.safetensors"), tensors, metadata={"format": "pt"})
    model = dream_ref.DreamModel(base.config, merged, base.stored_dtypes, base.path)
    with torch.no_grad():
        logits = dream_ref.forward(model, input_ids).float().numpy()
    logits.astype("<f4").tofile(os.path.join(out, name, "logits.f32"))
    return {"name": name, "base": BASE, "adapter": name + "/adapter", "input_ids": input_ids,
            "logits": name + "/logits.f32", "shape": list(logits.shape), "max_abs_logit": float(np.abs(logits).max()),
            "modules": len(tensors)}


def write_bad(base, out, rng):
    """Broken adapters and the error each gives: (name, config or None, tensors, code, substrings)."""
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    hidden = base.config["hidden_size"]
    good = {q + ".lora_A.weight": rng.normal(0, 1, (4, hidden)).astype(np.float32),
            q + ".lora_B.weight": rng.normal(0, 1, (hidden, 4)).astype(np.float32)}
    cfg = peft_config({"r": 4, "target_modules": ["q_proj"], "layers_to_transform": [0]})
    cases = [
        ("missing_weights", cfg, None, "not_found", ["adapter_model.safetensors", "missing"]),
        ("bad_json", "{", good, "parse_error", ["adapter_config.json", "not valid JSON"]),
        ("bad_shape", cfg, {q + ".lora_A.weight": good[q + ".lora_A.weight"][:, :-1], q + ".lora_B.weight": good[q + ".lora_B.weight"]},
         "invalid_argument", ["adapter_model.safetensors", q + ".lora_A.weight", "shape"]),
        ("rank_mismatch", peft_config({"r": 8, "target_modules": ["q_proj"], "layers_to_transform": [0]}), good,
         "invalid_argument", ["adapter_model.safetensors", q + ".lora_A.weight", "'s r (8)"]),
        ("missing_b", cfg, {q + ".lora_A.weight": good[q + ".lora_A.weight"]}, "not_found",
         ["adapter_model.safetensors", q + ".lora_B.weight", "missing"]),
        ("unknown_target", peft_config({"r": 4, "target_modules": ["qkv_proj"]}), good, "invalid_argument",
         ["adapter_config.json", "field 'target_modules'", "qkv_proj"]),
        ("not_lora", peft_config({"peft_type": "IA3", "target_modules": ["q_proj"]}), good, "invalid_argument",
         ["adapter_config.json", "field 'peft_type'"]),
        ("dora", peft_config({"use_dora": True, "target_modules": ["q_proj"]}), good, "invalid_argument",
         ["adapter_config.json", "field 'use_dora'"]),
        ("embedding_lora", cfg, dict(good, **{"base_model.model.model.embed_tokens.lora_embedding_A": np.zeros((4, 384), np.float32)}),
         "invalid_argument", ["adapter_model.safetensors", "lora_embedding_A"]),
        ("untargeted_tensor", cfg, dict(good, **{q.replace("q_proj", "k_proj") + ".lora_A.weight": good[q + ".lora_A.weight"]}),
         "invalid_argument", ["adapter_model.safetensors", "k_proj.lora_A.weight", "target_modules"]),
    ]
    listed = []
    for name, config, tensors, code, substrings in cases:
        d = os.path.join(out, "bad", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            f.write(config if isinstance(config, str) else json.dumps(config, indent=2))
        if tensors is not None:
            st.write_file(os.path.join(d, "adapter_model.safetensors"), tensors, metadata={"format": "pt"})
        listed.append({"name": name, "adapter": "bad/" + name, "code": code, "contains": substrings})
    listed.append({"name": "missing_dir", "adapter": "bad/no_such_adapter", "code": "not_found",
                   "contains": ["no_such_adapter", "not a directory"]})
    return listed


def stamp(args):
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for f in ("make_lora.py", "dream_ref.py", "safetensors_np.py"):
        with open(os.path.join(here, f), "rb") as fh:
            h.update(fh.read())
    with open(os.path.join(args.fixtures, BASE, "config.json"), "rb") as fh:
        h.update(fh.read())
    h.update(("%s %s" % (torch.__version__, np.__version__)).encode())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", required=True, help="make_fixtures.py's output (holds %s)" % BASE)
    ap.add_argument("--out", required=True)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    complete = os.path.join(args.out, ".complete")
    want = stamp(args)
    if not args.force and os.path.exists(complete):
        with open(complete) as f:
            if f.read().strip() == want:
                return 0
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    torch.manual_seed(0)
    base = dream_ref.load(os.path.join(args.fixtures, BASE))
    rng = np.random.Generator(np.random.PCG64(37))
    input_ids = [[int(x) for x in rng.integers(0, 381, 13)]]
    cases = [write_case(base, name, fields, dtype, infix, args.out, rng, input_ids)
             for name, fields, dtype, infix in CASES]
    bad = write_bad(base, args.out, rng)
    manifest = {"format_version": 1, "generator": "tests/reference/make_lora.py", "precision": "float32",
                "base_dir": BASE, "cases": cases, "bad": bad}
    with open(os.path.join(args.out, "lora.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    with open(complete, "w") as f:
        f.write(want + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
