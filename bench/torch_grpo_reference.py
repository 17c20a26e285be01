"""Times one Coupled-GRPO round of the PyTorch reference on a synthetic model of a named shape, split as
`diffucoder grpo` reports it, for bench/grpo_compare.sh.

Run with Debian's interpreter:
    /usr/bin/python3 bench/torch_grpo_reference.py --shape qwen2.5-0.5b --tokenizer tokenizer.json --json

One round (spec §4.2-4.7, the recipe's settings unless a flag says otherwise):
  * rollout: G completions of one prompt with the reference's decoding loop (dream_ref.diffusion_generate's
    steps: full recompute of prompt + canvas every step, alg entropy, temperature 1.0, top-p 0.95, top-k 50) of
    --new-tokens in --steps steps; the lm_head runs on the masked rows only, in chunks of --chunk rows
    (the same work as ours, and no [G, N, V] tensor). With --steps below the recipe's 256 the time is
    multiplied by 256 / --steps (each step of the uncached loop is one full forward; with the linear
    schedule the masked rows per step average half the canvas either way).
  * rewards: the reference's code_format (the regex of spec §4.3, ast.parse) and code (the tests as
    subprocesses, only when the format is 1.0) on the decoded completions (byte-level decode of the
    tokenizer's vocabulary, special tokens skipped). On a random model no completion has the format, so
    no test runs: the time is real but small.
  * old and reference log-probs: for each of --num-iterations mask seeds, the coupled log-probs
    (tests/reference/grpo_ref.py) of the policy and of the reference model, without gradient.
  * --num-iterations optimizer steps: per micro-batch of G / --grad-accum completions the coupled
    log-probs with autograd (three versions in one forward, lm_head on the completion rows), the loss of
    grpo_ref.grpo_loss (clip 0.5, beta 0.01), backward; clip_grad_norm_(0.2), torch.optim.AdamW.
--dtype bfloat16 runs the forwards under torch.autocast("cpu", torch.bfloat16) with f32 master weights.
"""

import argparse
import ast
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
sys.path.insert(0, HERE)
import dream_ref as R  # noqa: E402
import grpo_ref  # noqa: E402
from torch_reference import SHAPES  # noqa: E402

FORMAT = re.compile(r"^(?:(?!```)[\s\S])*?```python\n(?:(?!```)[\s\S])*?```\n$")


def byte_decoder(tokenizer_path):
    """id -> bytes of the byte-level BPE vocabulary; special added tokens map to b''."""
    tj = json.load(open(tokenizer_path, encoding="utf-8"))
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    unbyte = {chr(c): b for b, c in zip(bs, cs)}
    table = {i: bytes(unbyte[ch] for ch in tok) for tok, i in tj["model"]["vocab"].items()}
    for t in tj.get("added_tokens", []):
        table[t["id"]] = b"" if t.get("special") else t["content"].encode()
    return lambda ids: b"".join(table.get(i, b"") for i in ids).decode("utf-8", errors="replace")


def rewards(texts, tests):
    """spec §4.3: 2.0 * code + 0.5 * code_format per completion."""
    out = []
    for text in texts:
        fmt = 0.0
        if FORMAT.fullmatch(text):
            code = text.split("```python\n", 1)[1].split("```", 1)[0]
            try:
                ast.parse(code.strip())
                fmt = 1.0
            except SyntaxError:
                fmt = 0.5
        passed = 0
        if fmt == 1.0:
            for t in tests:
                try:
                    passed += subprocess.run([sys.executable, "-c", code + "\n" + t], capture_output=True,
                                             timeout=5).returncode == 0
                except subprocess.TimeoutExpired:
                    pass
        out.append(2.0 * passed / len(tests) + 0.5 * fmt)
    return out


def hidden_states(model, ids, lm_head):
    """The final-norm output [B, L, E] of dream_ref.forward (its lm_head swapped for the identity)."""
    W = model.weights
    W["lm_head.weight"] = torch.eye(model.hidden)
    try:
        return R.forward(model, ids)
    finally:
        W["lm_head.weight"] = lm_head


def rollout(model, prompt, a, gen):
    """dream_ref.diffusion_generate's entropy loop (spec §3), logits only on the masked rows; per-step times."""
    mask_id, lm_head = model.mask_token_id, model.weights["lm_head.weight"]
    x = torch.tensor([prompt + [mask_id] * a.new_tokens] * a.group)
    timesteps = torch.linspace(1, 1e-3, a.steps + 1)
    step_s = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        mask_index = x == mask_id
        h = R.shift_logits(hidden_states(model, x, lm_head))[mask_index]  # [n_masked, E]
        conf, x0 = [], []
        for c in range(0, h.shape[0], a.chunk):
            logits = F.linear(h[c:c + a.chunk], lm_head).float()
            cc, xx = R.sample_tokens(logits, 1.0, 0.95, 50, neg_entropy=True, generator=gen)
            conf.append(cc)
            x0.append(xx)
        conf, x0 = torch.cat(conf), torch.cat(x0)
        k = R.transfer_count(int(mask_index.sum()), a.group, timesteps[i], timesteps[i + 1], i == a.steps - 1)
        full = torch.full(x.shape, float("-inf"))
        full[mask_index] = conf
        if k > 0:
            sel = torch.stack([R.select_most_confident(full[b], k) for b in range(a.group)])
            cand = torch.full_like(x, mask_id)
            cand[mask_index] = x0
            rows = torch.arange(a.group).unsqueeze(1).expand_as(sel)
            x[rows, sel] = cand[rows, sel]
        step_s.append(time.perf_counter() - t0)
    return x[:, len(prompt):], step_s


def coupled_logps(model, prompt, comp, mask, t):
    """grpo_ref.coupled_logps with the lm_head on the C completion rows of each version only."""
    lm_head = model.weights["lm_head.weight"]
    C = comp.shape[1]
    v0 = torch.full_like(comp, model.mask_token_id)
    batch = torch.cat([torch.cat([prompt.expand(comp.shape[0], -1), v], 1)
                       for v in (v0, torch.where(mask, v0, comp), torch.where(~mask, v0, comp))], 0)
    h = hidden_states(model, batch, lm_head)[:, :-1][:, -C:]  # position j predicted from j - 1
    lp = torch.log_softmax(F.linear(h, lm_head).float(), -1).gather(-1, comp.repeat(3, 1)[..., None])[..., 0]
    lp0, lp1, lp2 = lp.chunk(3, 0)
    return (lp0 + torch.where(mask, lp1 / t, lp2 / (1 - t))) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json (decoding for the rewards)")
    ap.add_argument("--prompt-ids", required=True, help="JSON list: the prompt's token ids")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256, help="decoding steps run (time scaled to --recipe-steps)")
    ap.add_argument("--recipe-steps", type=int, default=256)
    ap.add_argument("--group", type=int, default=10)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--num-iterations", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=256, help="rows of logits at once in the rollout")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.group % a.grad_accum:
        ap.error("--group must be a multiple of --grad-accum")
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    V = SHAPES[a.shape]["vocab_size"]
    cfg = dict(SHAPES[a.shape], rms_norm_eps=1e-6, rope_theta=1e6, mask_token_id=151666 if V > 151666 else V - 2,
               pad_token_id=V - 1, eos_token_id=V - 1, bos_token_id=None, tie_word_embeddings=False)
    weights = {}
    for name, shape in R.expected_shapes(cfg).items():  # uniform with std 0.02, as src/model/synthetic.cc
        weights[name] = torch.ones(shape) if "norm" in name else (torch.rand(shape, generator=gen) * 2 - 1).mul_(0.02 * 3 ** 0.5)
    ref = R.DreamModel(cfg, {n: w.clone() for n, w in weights.items()}, {n: "F32" for n in weights})
    for w in weights.values():
        w.requires_grad_(True)
    policy = R.DreamModel(cfg, weights, {n: "F32" for n in weights})
    matrices = [w for w in weights.values() if w.dim() == 2]
    vectors = [w for w in weights.values() if w.dim() != 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
                            lr=1e-6, betas=(0.9, 0.99), eps=1e-8)
    decode = byte_decoder(a.tokenizer)
    prompt_ids = json.loads(a.prompt_ids)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")
    log = lambda msg: print("torch_grpo_reference: " + msg, file=sys.stderr, flush=True)  # noqa: E731

    t0 = time.perf_counter()
    with torch.no_grad(), autocast:
        comp, step_s = rollout(policy, prompt_ids, a, gen)
    measured = time.perf_counter() - t0
    rollout_s = measured * a.recipe_steps / a.steps
    log("rollout: %d steps in %.1f s (median step %.2f s) -> %.1f s for %d steps"
        % (a.steps, measured, statistics.median(step_s), rollout_s, a.recipe_steps))

    t0 = time.perf_counter()
    texts = [decode(row.tolist()) for row in comp]
    r = rewards(texts, ["assert f(1) == 2"])
    rewards_s = time.perf_counter() - t0
    adv = grpo_ref.advantages(r, a.group, False).float()
    cmask = grpo_ref.completion_mask(comp.tolist(), 151645)

    prompt = torch.tensor([prompt_ids])
    mb = a.group // a.grad_accum
    slices = [slice(i * mb, (i + 1) * mb) for i in range(a.grad_accum)]
    draws = []
    for it in range(a.num_iterations):  # one t ~ U(0.2, 0.8) per call, the masks R < t (spec §4.5)
        g = torch.Generator().manual_seed(it)
        t = 0.2 + 0.6 * float(torch.rand(1, generator=g))
        draws.append([(t, torch.rand(mb, comp.shape[1], generator=g) < t) for _ in slices])
    t0 = time.perf_counter()
    old, ref_lp = [], []
    with torch.no_grad(), autocast:
        for it in range(a.num_iterations):
            old.append([coupled_logps(policy, prompt, comp[s], m, t) for s, (t, m) in zip(slices, draws[it])])
            ref_lp.append([coupled_logps(ref, prompt, comp[s], m, t) for s, (t, m) in zip(slices, draws[it])])
    logps_s = time.perf_counter() - t0

    steps = []
    for it in range(a.num_iterations):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j, (s, (t, m)) in enumerate(zip(slices, draws[it])):
            with autocast:
                lp = coupled_logps(policy, prompt, comp[s], m, t)
            loss, _, _, _ = grpo_ref.grpo_loss(lp, old[it][j], ref_lp[it][j], adv[s], cmask[s], 0.01, 0.5)
            (loss / a.grad_accum).backward()
            total += float(loss) / a.grad_accum
        torch.nn.utils.clip_grad_norm_(list(weights.values()), 0.2)
        opt.step()
        steps.append(time.perf_counter() - t0)
        log("optimizer step %d: %.1f s, loss %.5f" % (it + 1, steps[-1], total))

    out = dict(shape=a.shape, dtype=a.dtype, threads=a.threads, torch=torch.__version__, group=a.group,
               prompt_len=len(prompt_ids), new_tokens=a.new_tokens, steps_run=a.steps, recipe_steps=a.recipe_steps,
               grad_accum=a.grad_accum, num_iterations=a.num_iterations,
               rollout_measured_s=measured, rollout_step_median_s=statistics.median(step_s), rollout_s=rollout_s,
               rewards_s=rewards_s, reward_mean=sum(r) / len(r), logps_s=logps_s, train_step_s=steps,
               round_s=rollout_s + rewards_s + logps_s + sum(steps),
               peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(json.dumps(out, indent=2) if a.json else out)


if __name__ == "__main__":
    main()
