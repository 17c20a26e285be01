#!/usr/bin/python3
"""Writes the training fixtures: masked-diffusion loss and every parameter gradient of a tiny random
checkpoint from PyTorch autograd on dream_ref.py, and ten torch.optim.AdamW steps (a second, a few seconds).

    /usr/bin/python3 tests/reference/make_grad_fixtures.py --out DIR

Layout:
    DIR/tiny-train/...                    checkpoint from make_tiny.py (f32, GQA 4:2, vocab 64)
    DIR/grad_cases.json                   [{name, tokens, loss_mask, mask, t, valid, positions, norm, loss}]
    DIR/<case>.grads.safetensors          d loss / d w for every weight, by checkpoint name (f32)
    DIR/adamw.json, DIR/adamw.safetensors ten AdamW steps: hyper-parameters, lr per step, p0, g<i>, final
    DIR/lora/<case>/adapter/              a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors)
    DIR/lora/<case>.grads.safetensors     d loss / d lora_A, lora_B by autograd, PEFT tensor names, base frozen
    DIR/lora/cases.json                   [{name, adapter, loss}] (the batch: grad_cases.json's case of that name)
    DIR/.complete                         written last

Loss (src/train/masked_diffusion.h): noisy = where(mask, mask_id, tokens); logits shifted by one
(spec §2.6); loss = Σ_b Σ_{j masked} CE(logits[b, j-1], tokens[b, j]) / t_b / Z, Z = Σ_b N_b ("tokens")
or B·N_b ("sequences"), N_b = Σ_j loss_mask[b, j].
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dream_ref as R  # noqa: E402
import make_tiny as MT  # noqa: E402
import safetensors_np as st  # noqa: E402

MODEL = dict(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, ff=48, dtype="f32", shards=1, seed=2001,
             rope_theta=10000.0)


def md_loss(model, tokens, loss_mask, mask, t, valid, positions, norm):
    B, L = tokens.shape
    noisy = torch.where(mask, torch.full_like(tokens, model.mask_token_id), tokens)
    logits = R.forward(model, noisy, attention_mask=valid, position_ids=positions)
    logits = R.shift_logits(logits)
    n_b = loss_mask.sum(1).to(torch.float64)
    total = torch.zeros((), dtype=torch.float32)
    for b in range(B):
        z = n_b.sum() if norm == "tokens" else B * n_b[b]
        for j in range(L):
            if mask[b, j]:
                ce = F.cross_entropy(logits[b, j][None], tokens[b, j][None])
                total = total + ce / float(t[b] * z)
    return total


def make_case(model, name, rng, B, L, prompt_lens, pads, norm):
    V = model.vocab_size
    tokens = torch.tensor(rng.integers(0, V - 3, size=(B, L)), dtype=torch.long)  # avoid the special ids
    loss_mask = torch.zeros(B, L, dtype=torch.bool)
    valid = torch.ones(B, L, dtype=torch.long)
    positions = torch.zeros(B, L, dtype=torch.long)
    for b in range(B):
        valid[b, :pads[b]] = 0
        tokens[b, :pads[b]] = model.pad_token_id
        loss_mask[b, pads[b] + prompt_lens[b]:] = True
        positions[b] = torch.clamp(torch.cumsum(valid[b], 0) - 1, min=0)
        positions[b, :pads[b]] = 1  # spec §2.4: pads at position 1
    t = [0.35 + 0.4 * b for b in range(B)]
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        r = rng.random(L)
        mask[b] = loss_mask[b] & torch.tensor(r < t[b])
        if not mask[b].any():
            mask[b, L - 1] = True
    padded = any(pads)
    for w in model.weights.values():
        w.grad = None
        w.requires_grad_(True)
    loss = md_loss(model, tokens, loss_mask, mask, t, valid if padded else None, positions if padded else None, norm)
    loss.backward()
    grads = {n: w.grad.detach().numpy().astype(np.float32) for n, w in model.weights.items()}
    # The same under bf16 autocast (PyTorch's mixed precision: linear layers and matmuls on bf16 operands),
    # the peer of the engine's bf16 training mode.
    for w in model.weights.values():
        w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_bf16 = md_loss(model, tokens, loss_mask, mask, t, valid if padded else None,
                            positions if padded else None, norm)
    loss_bf16.float().backward()
    grads_bf16 = {n: w.grad.detach().float().numpy().astype(np.float32) for n, w in model.weights.items()}
    case = dict(name=name, n_batch=B, n_seq=L, tokens=tokens.flatten().tolist(), loss_bf16=float(loss_bf16),
                loss_mask=loss_mask.flatten().int().tolist(), mask=mask.flatten().int().tolist(), t=t,
                valid=valid.flatten().tolist() if padded else None,
                positions=positions.flatten().tolist() if padded else None, norm=norm, loss=float(loss))
    return case, grads, grads_bf16


LORA_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def attach_lora(model, fields, rng, adapter_dir):
    """Adapts the targeted projections of `model` in place: W + scaling * B @ A with A, B autograd leaves.

    Written from PEFT's LoRA layer (y = x W^T + scaling * (x A^T) B^T, scaling = lora_alpha / r) and its file
    layout ("base_model.model.<module>.lora_A.weight" [r, in], ".lora_B.weight" [out, r]), not from the
    engine's code: the adapted weight is the same function of A and B, so autograd through it gives the LoRA
    gradients. B is random (not PEFT's zero init) so that dA is not zero. Writes the adapter to adapter_dir;
    returns (leaves {module: (A, B)}, restore()), restore() putting the base weights back."""
    r, alpha, targets = fields["r"], fields["lora_alpha"], fields["target_modules"]
    scaling = alpha / r
    base = dict(model.weights)
    leaves, tensors = {}, {}
    for name, w in sorted(base.items()):
        module = name[:-len(".weight")]
        if not (name.endswith(".weight") and w.dim() == 2 and any(module.endswith("." + t) for t in targets)):
            continue
        out_dim, in_dim = w.shape
        a = torch.tensor(rng.normal(0, 1 / math.sqrt(in_dim), (r, in_dim)), dtype=torch.float32, requires_grad=True)
        b = torch.tensor(rng.normal(0, 0.5, (out_dim, r)), dtype=torch.float32, requires_grad=True)
        leaves[module] = (a, b)
        tensors["base_model.model.%s.lora_A.weight" % module] = a.detach().numpy().copy()
        tensors["base_model.model.%s.lora_B.weight" % module] = b.detach().numpy().copy()
    for w in base.values():
        w.requires_grad_(False)
    for module, (a, b) in leaves.items():
        model.weights[module + ".weight"] = base[module + ".weight"] + scaling * (b @ a)
    os.makedirs(adapter_dir, exist_ok=True)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
              "target_modules": targets, "bias": "none", "use_rslora": False, "fan_in_fan_out": False,
              "modules_to_save": None, "init_lora_weights": True, "inference_mode": True}
    with open(os.path.join(adapter_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    st.write_file(os.path.join(adapter_dir, "adapter_model.safetensors"), tensors, metadata={"format": "pt"})

    def restore():
        model.weights.clear()
        model.weights.update(base)
    return leaves, restore


def lora_grads(leaves):
    """{PEFT tensor name: d loss / d tensor} of attach_lora's leaves after a backward."""
    grads = {}
    for module, (a, b) in leaves.items():
        grads["base_model.model.%s.lora_A.weight" % module] = a.grad.numpy().astype(np.float32)
        grads["base_model.model.%s.lora_B.weight" % module] = b.grad.numpy().astype(np.float32)
    return grads


def lora_case(model, case, fields, out, rng):
    """The masked-diffusion loss of `case` over the frozen model with an adapter, and its A / B gradients."""
    leaves, restore = attach_lora(model, fields, rng, os.path.join(out, "lora", case["name"], "adapter"))
    tokens = torch.tensor(case["tokens"]).view(case["n_batch"], case["n_seq"])
    shape = tokens.shape
    as_bool = lambda key: torch.tensor(case[key]).view(shape).bool()  # noqa: E731
    valid = None if case["valid"] is None else torch.tensor(case["valid"]).view(shape)
    positions = None if case["positions"] is None else torch.tensor(case["positions"]).view(shape)
    loss = md_loss(model, tokens, as_bool("loss_mask"), as_bool("mask"), case["t"], valid, positions, case["norm"])
    loss.backward()
    st.write_file(os.path.join(out, "lora", case["name"] + ".grads.safetensors"), lora_grads(leaves))
    restore()
    return {"name": case["name"], "adapter": "lora/%s/adapter" % case["name"], "loss": float(loss)}


def lr_at(step, lr, warmup, total, min_ratio):
    """HF get_cosine_with_min_lr_schedule_with_warmup (min_lr_rate), written independently of the C++."""
    if step < warmup:
        return lr * step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def adamw_fixture(out):
    rng = np.random.default_rng(7)
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, warmup=2, total=10, min_lr_ratio=0.1)
    p0 = {"matrix": rng.standard_normal((6, 5)).astype(np.float32), "vector": rng.standard_normal(5).astype(np.float32)}
    params = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in p0.items()}
    opt = torch.optim.AdamW([{"params": [params["matrix"]], "weight_decay": hp["weight_decay"]},
                             {"params": [params["vector"]], "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    tensors = {"p0." + k: v for k, v in p0.items()}
    lrs = []
    for step in range(hp["total"]):
        lr = lr_at(step, hp["lr"], hp["warmup"], hp["total"], hp["min_lr_ratio"])
        lrs.append(lr)
        for g in opt.param_groups:
            g["lr"] = lr
        for k, p in params.items():
            g = rng.standard_normal(p.shape).astype(np.float32)
            tensors["g%d.%s" % (step, k)] = g
            p.grad = torch.tensor(g)
        opt.step()
    for k, p in params.items():
        tensors["final." + k] = p.detach().numpy().copy()
    st.write_file(os.path.join(out, "adamw.safetensors"), tensors)
    with open(os.path.join(out, "adamw.json"), "w") as f:
        json.dump(dict(hp, lrs=lrs), f, indent=1)


def fixture_dir(doc, *scripts):
    """Parses --out; returns (out, done path, stamp), or None when out/.complete already holds the stamp of
    `scripts` and dream_ref.py (the fixtures are up to date). A stale .complete is removed first."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    done = os.path.join(a.out, ".complete")
    stamp = "".join(str(os.path.getmtime(f)) for f in scripts + (R.__file__,))
    if os.path.exists(done):
        if open(done).read() == stamp:
            return None
        os.remove(done)
    torch.manual_seed(0)
    return a.out, done, stamp


def main():
    todo = fixture_dir(__doc__, __file__)
    if todo is None:
        return
    out, done, stamp = todo
    mdir = os.path.join(out, "tiny-train")
    MT.make_tiny(mdir, **MODEL)
    model = R.load(mdir, torch.float32)
    rng = np.random.default_rng(123)
    cases = []
    for name, B, L, prompts, pads, norm in (("full", 2, 10, [3, 4], [0, 0], "tokens"),
                                            ("left_padded", 3, 9, [2, 3, 2], [3, 0, 1], "sequences")):
        case, grads, grads_bf16 = make_case(model, name, rng, B, L, prompts, pads, norm)
        st.write_file(os.path.join(out, name + ".grads.safetensors"), grads)
        st.write_file(os.path.join(out, name + ".grads_autocast_bf16.safetensors"), grads_bf16)
        cases.append(case)
    with open(os.path.join(out, "grad_cases.json"), "w") as f:
        json.dump(cases, f)
    lora = [lora_case(model, cases[0], {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]},
                      out, rng),
            lora_case(model, cases[1], {"r": 3, "lora_alpha": 5, "target_modules": LORA_LINEAR}, out, rng)]
    with open(os.path.join(out, "lora", "cases.json"), "w") as f:
        json.dump(lora, f)
    adamw_fixture(out)
    with open(done, "w") as f:
        f.write(stamp)


if __name__ == "__main__":
    main()
