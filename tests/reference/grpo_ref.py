#!/usr/bin/python3
"""The Coupled-GRPO loss of DiffuCoder in PyTorch, written from spec §4.4-4.6 (and the logits shift of
§2.6) on the reference model of dream_ref.py, and the fixtures the engine's `grpo-loss` is compared with.

    /usr/bin/python3 tests/reference/grpo_ref.py --out DIR

What it computes (spec §4):
  * advantages: leave-one-out within each group of G consecutive completions, A_i = r_i - mean of the
    others; with scale_rewards divided by (unbiased group std + 1e-4); NaN rewards count as 0 (nansum).
  * completion_mask: 1 up to and including the first <|im_end|>, 0 after; all ones without one.
  * the three versions of prompt + completion: v0 every completion position masked, v1 the positions of
    `mask` (R < t), v2 the others; the prompt is never masked. One forward over the 3B sequences with no
    attention mask and default positions (the reference's form), or, when the batch gives a `prompt_mask`
    with left pads, the rollout's padding mask and positions (spec §3.3; the engine's scoring),
    logits[:, :-1] then the last C positions, log_softmax, gather;
    logp = (logp_v0 + where(mask, logp_v1 / t, logp_v2 / (1 - t))) / 2.
  * ratio = exp(logp - old) (old = logp.detach() when absent), TRL's clipped objective
    -min(ratio*A, clamp(ratio, 1-eps, 1+eps)*A) + beta*k3 KL, k3 = exp(ref-logp) - (ref-logp) - 1,
    loss = sum(per_token*mask) / max(sum(mask), 1); gradients by autograd.
  * clip_fraction: share of scored tokens where the clipped term is the smaller one (no gradient).
  * loss_scale: the mean |per-token loss|, the size a loss that sums terms of both signs is compared at.

Layout of DIR:
    policy/, ref/                 tiny f32 checkpoints (make_tiny.py; ref = policy + 5 % noise)
    cases.json                    [{name, batch: <grpo-loss input>, ref: bool, expected: {...}}]
    <case>.grads.safetensors      d loss / d w of every policy weight (f32)
    lora/cases.json               [{name (a case's batch), adapter, ref, expected}]: grpo-loss --lora
    lora/<case>/adapter/          a PEFT adapter over the policy; lora/<case>.grads.safetensors: d loss / d A, B
    .complete                     written last
"""

import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dream_ref as R  # noqa: E402
import make_grad_fixtures as G  # noqa: E402
import make_tiny as MT  # noqa: E402
import safetensors_np as st  # noqa: E402

MODEL = dict(G.MODEL, seed=3001)  # the shape of the gradient fixtures' tiny checkpoint, other weights
IM_END = 60  # an ordinary id of the tiny vocabulary standing for <|im_end|> (mask 62, pad = eos 63)


def advantages(rewards, G, scale_rewards):
    r = torch.tensor([0.0 if (x is None or math.isnan(x)) else x for x in rewards], dtype=torch.float64)
    g = r.view(-1, G)
    a = g - (g.sum(1, keepdim=True) - g) / (G - 1)
    if scale_rewards:
        a = a / (g.std(1, keepdim=True) + 1e-4)
    return a.flatten()


def completion_mask(completion_ids, im_end):
    ids = torch.tensor(completion_ids)
    is_end = ids == im_end
    C = ids.shape[1]
    first = torch.where(is_end.any(1), is_end.int().argmax(1), torch.full((ids.shape[0],), C))
    return (torch.arange(C)[None, :] <= first[:, None]).int()


def coupled_logps(model, prompt_ids, completion_ids, mask, t, prompt_mask=None):
    prompt, comp = torch.tensor(prompt_ids), torch.tensor(completion_ids)
    partial = torch.tensor(mask).bool()
    C = comp.shape[1]
    mask_id = model.mask_token_id
    v0 = torch.full_like(comp, mask_id)
    v1 = torch.where(partial, v0, comp)
    v2 = torch.where(~partial, v0, comp)
    batch = torch.cat([torch.cat([prompt, v], 1) for v in (v0, v1, v2)], 0)
    valid = pos = None
    if prompt_mask is not None and not torch.tensor(prompt_mask).bool().all():
        # Left pads: the rollout's padding mask and positions (spec §3.3: cumsum(mask) - 1, pads at 1).
        m = torch.cat([torch.tensor(prompt_mask), torch.ones_like(comp)], 1).repeat(3, 1)
        valid = m
        pos = torch.where(m.bool(), m.cumsum(1) - 1, torch.ones_like(m))
    logits = R.forward(model, batch, valid, pos)[:, :-1][:, -C:]  # position j predicted from j - 1 (spec §2.6)
    lp = torch.log_softmax(logits, -1).gather(-1, comp.repeat(3, 1)[..., None])[..., 0]
    lp0, lp1, lp2 = lp.chunk(3, 0)
    return (lp0 + torch.where(partial, lp1 / t, lp2 / (1 - t))) / 2


def grpo_loss(logps, old_logps, ref_logps, adv, cmask, beta, eps):
    old = logps.detach() if old_logps is None else old_logps
    coef_1 = torch.exp(logps - old)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps)
    l1 = coef_1 * adv[:, None]
    l2 = coef_2 * adv[:, None]
    per_token = -torch.min(l1, l2)
    d = ref_logps - logps
    kl = torch.exp(d) - d - 1
    per_token = per_token + beta * kl
    m = cmask.to(per_token.dtype)
    n = m.sum().clamp(min=1)
    return ((per_token * m).sum() / n, (kl * m).sum() / n, ((l2 < l1).to(m.dtype) * m).sum() / n,
            (per_token.abs() * m).sum() / n)


def run_case(policy, ref, batch, use_ref):
    B = len(batch["completion_ids"])
    G = batch["group_size"]
    prompts = batch["prompt_ids"]
    pmask = batch.get("prompt_mask")
    if len(prompts) != B:  # one prompt per group
        prompts = [p for p in prompts for _ in range(G)]
        pmask = None if pmask is None else [m for m in pmask for _ in range(G)]
    adv = advantages(batch["rewards"], G, batch.get("scale_rewards", False)).float()
    cmask = completion_mask(batch["completion_ids"], batch["im_end_id"])
    with torch.no_grad():
        ref_lp = coupled_logps(ref if use_ref else policy, prompts, batch["completion_ids"], batch["mask"], batch["t"],
                               pmask)
    for w in policy.weights.values():
        w.grad = None
        w.requires_grad_(True)
    logps = coupled_logps(policy, prompts, batch["completion_ids"], batch["mask"], batch["t"], pmask)
    old = torch.tensor(batch["old_logps"]) if "old_logps" in batch else None
    loss, kl, clip, scale = grpo_loss(logps, old, ref_lp, adv, cmask, batch.get("beta", 0.01), batch.get("epsilon", 0.5))
    loss.backward()
    grads = {n: w.grad.detach().numpy().astype(np.float32) for n, w in policy.weights.items()}
    for w in policy.weights.values():
        w.requires_grad_(False)
    expected = dict(loss=float(loss), loss_scale=float(scale), advantages=adv.tolist(), logps=logps.detach().tolist(), ref_logps=ref_lp.tolist(),
                    completion_mask=cmask.tolist(), kl=float(kl), clip_fraction=float(clip),
                    grad_norm=float(math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))),
                    grad_norms={n: float(np.sqrt((g.astype(np.float64) ** 2).sum())) for n, g in grads.items()})
    return expected, grads


def run_lora_case(policy, ref, batch, use_ref, fields, rng, out, name):
    """run_case with a LoRA adapter over the frozen policy (make_grad_fixtures.attach_lora): the loss and its
    gradients with respect to the adapter's A and B; the reference model is --ref-model's (or the adapted
    policy itself). Writes OUT/lora/<name>/adapter and OUT/lora/<name>.grads.safetensors."""
    B = len(batch["completion_ids"])
    Gs = batch["group_size"]
    prompts = batch["prompt_ids"]
    pmask = batch.get("prompt_mask")
    if len(prompts) != B:
        prompts = [p for p in prompts for _ in range(Gs)]
        pmask = None if pmask is None else [m for m in pmask for _ in range(Gs)]
    adv = advantages(batch["rewards"], Gs, batch.get("scale_rewards", False)).float()
    cmask = completion_mask(batch["completion_ids"], batch["im_end_id"])
    leaves, restore = G.attach_lora(policy, fields, rng, os.path.join(out, "lora", name, "adapter"))
    with torch.no_grad():
        ref_lp = coupled_logps(ref if use_ref else policy, prompts, batch["completion_ids"], batch["mask"], batch["t"],
                               pmask)
    logps = coupled_logps(policy, prompts, batch["completion_ids"], batch["mask"], batch["t"], pmask)
    old = torch.tensor(batch["old_logps"]) if "old_logps" in batch else None
    loss, kl, clip, scale = grpo_loss(logps, old, ref_lp, adv, cmask, batch.get("beta", 0.01), batch.get("epsilon", 0.5))
    loss.backward()
    grads = G.lora_grads(leaves)
    restore()
    st.write_file(os.path.join(out, "lora", name + ".grads.safetensors"), grads)
    return dict(name=name, adapter="lora/%s/adapter" % name, ref=use_ref,
                expected=dict(loss=float(loss), loss_scale=float(scale), kl=float(kl), clip_fraction=float(clip),
                              grad_norms={n: float(np.sqrt((g.astype(np.float64) ** 2).sum())) for n, g in grads.items()}))


def make_batch(rng, model, B, G, P, C, t, rewards, im_end_rows, per_group_prompt=False, **extra):
    V = model.vocab_size
    n_prompts = B // G if per_group_prompt else B
    prompts = rng.integers(0, V - 4, size=(n_prompts, P)).tolist()  # ordinary ids (not im_end / specials)
    comps = rng.integers(0, V - 4, size=(B, C))
    for row, pos in im_end_rows.items():
        comps[row, pos] = IM_END
        if pos + 1 < C:
            comps[row, pos + 1:] = V - 1  # the fill after <|im_end|> (pad), not scored
    mask = (rng.random((B, C)) < t).astype(int)
    batch = dict(prompt_ids=prompts, completion_ids=comps.tolist(), rewards=rewards, group_size=G, t=t,
                 mask=mask.tolist(), im_end_id=IM_END)
    batch.update(extra)
    return batch


def main():
    todo = G.fixture_dir(__doc__, __file__, G.__file__)
    if todo is None:
        return
    out, done, stamp = todo
    MT.make_tiny(os.path.join(out, "policy"), **MODEL)
    # The reference model: the policy's weights moved by 5 % noise (a policy some steps away from it).
    MT.make_tiny(os.path.join(out, "ref"), **MODEL)
    ref_file = os.path.join(out, "ref", "model.safetensors")
    noise = np.random.default_rng(3002)
    st.write_file(ref_file, {n: (w + 0.05 * np.abs(w).mean() * noise.standard_normal(w.shape)).astype(np.float32)
                             for n, w in sorted(st.read_file(ref_file)[0].items())}, metadata={"format": "pt"})
    policy = R.load(os.path.join(out, "policy"), torch.float32)
    ref = R.load(os.path.join(out, "ref"), torch.float32)
    rng = np.random.default_rng(314)

    cases = []
    # G = 2, no old log-probs (ratio 1), a reference model that differs, <|im_end|> inside / at the end.
    b1 = make_batch(rng, policy, B=4, G=2, P=5, C=8, t=0.37, rewards=[1.0, 0.0, 2.5, 0.5], im_end_rows={0: 3, 2: 7})
    # G = 4 with old log-probs that put the ratio below 1 - eps, inside, and above 1 + eps, for advantages of
    # both signs (both sides of the clip), std scaling, and a reward given as null (NaN → 0).
    b2 = make_batch(rng, policy, B=4, G=4, P=3, C=6, t=0.61, rewards=[2.5, None, 0.5, 2.0], im_end_rows={1: 2},
                    scale_rewards=True)
    # G = 3, one group with equal rewards (advantage 0: only the KL term), one prompt per group, beta 0.04.
    b3 = make_batch(rng, policy, B=6, G=3, P=4, C=5, t=0.25, rewards=[1.0, 1.0, 1.0, 0.0, 2.5, 0.5],
                    im_end_rows={4: 0}, per_group_prompt=True, beta=0.04, epsilon=0.2)
    # No reference model (the policy itself: KL 0), G = 2, a completion of one token.
    b4 = make_batch(rng, policy, B=2, G=2, P=2, C=1, t=0.5, rewards=[0.0, 2.0], im_end_rows={})
    with torch.no_grad():
        lp = coupled_logps(policy, b2["prompt_ids"], b2["completion_ids"], b2["mask"], b2["t"])
    ratios = [0.3, 0.9, 1.2, 2.5, 1.0, 0.45]
    b2["old_logps"] = [[float(lp[i, j]) - math.log(ratios[(i + j) % len(ratios)]) for j in range(6)] for i in range(4)]
    # Two prompts of different lengths in one batch (3 and 6 tokens), the shorter left-padded with the pad id
    # as a rollout pads them: scored with the rollout's padding mask and positions (prompt_mask).
    b5 = make_batch(rng, policy, B=4, G=2, P=6, C=5, t=0.45, rewards=[2.0, 0.5, 1.0, 0.0], im_end_rows={1: 3},
                    per_group_prompt=True)
    b5["prompt_ids"][0][:3] = [policy.vocab_size - 1] * 3
    b5["prompt_mask"] = [[0, 0, 0, 1, 1, 1], [1] * 6]
    for name, batch, use_ref in (("g2_fresh", b1, True), ("g4_clip", b2, True), ("g3_equal", b3, True),
                                 ("no_ref", b4, False), ("left_padded", b5, True)):
        expected, grads = run_case(policy, ref, batch, use_ref)
        st.write_file(os.path.join(out, name + ".grads.safetensors"), grads)
        cases.append(dict(name=name, batch=batch, ref=use_ref, expected=expected))
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f)
    # LoRA adapters over the frozen policy (grpo-loss --lora): a subset of projections against the reference
    # model, and every projection with left pads and the policy as its own reference.
    lora_rng = np.random.default_rng(2718)
    lora = [run_lora_case(policy, ref, b2, True, {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]},
                          lora_rng, out, "g4_clip"),
            run_lora_case(policy, ref, b5, False, {"r": 3, "lora_alpha": 5, "target_modules": G.LORA_LINEAR},
                          lora_rng, out, "left_padded")]
    with open(os.path.join(out, "lora", "cases.json"), "w") as f:
        json.dump(lora, f)
    for c in cases:
        with open(os.path.join(out, c["name"] + ".batch.json"), "w") as f:
            json.dump(c["batch"], f)
    with open(done, "w") as f:
        f.write(stamp)


if __name__ == "__main__":
    main()
