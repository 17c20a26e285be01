"""Times masked-diffusion training steps of the PyTorch reference (tests/reference/dream_ref.py, autograd)
on a synthetic model of a named shape, for comparison with `diffucoder bench --train`.

Run with Debian's interpreter:
    /usr/bin/python3 bench/torch_train_reference.py --shape qwen2.5-0.5b --seq-len 256 --batch 1 --json

One step, as src/train/ and tests/reference/make_grad_fixtures.py define it: t per sequence (fixed
--mask-ratio, or U(eps, 1) with 0), each completion position masked with probability t (the first
--prompt-len positions never), forward on the noised ids, logits shifted by one (spec §2.6), loss =
Σ_b Σ_{j masked} CE(logits[b, j-1], x0[b, j]) / t_b / Σ_b N_b, backward, clip_grad_norm_(1.0),
torch.optim.AdamW (weight decay 0.1 on matrices, 0 on norms and biases). f32 weights throughout.

--logits all:    dream_ref.forward as written: lm_head on every position (what upstream training does).
--logits masked: lm_head only on the rows that carry a loss, as the C++ engine computes them (the
                 forward runs with an identity lm_head, which returns the final-norm output exactly).
--dtype bfloat16: the step under torch.autocast("cpu", torch.bfloat16) (f32 master weights, bf16
                 matmuls, f32 loss); float32: no autocast.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
sys.path.insert(0, HERE)
import dream_ref  # noqa: E402
from torch_reference import SHAPES  # noqa: E402  the shapes of src/model/synthetic.cc


def train_step_flops(cfg, batch, seq_len, n_out):
    """bench_train.cc's formula: 6·(layer matmul params)·T + 12·B·L²·(H·D) per layer + 6·E·V·n_out."""
    E, Fd, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = E // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    layer_params = E * q + 2 * E * kv + q * E + 3 * E * Fd
    T = batch * seq_len
    return cfg["num_hidden_layers"] * (6.0 * layer_params * T + 12.0 * batch * seq_len ** 2 * q) + 6.0 * E * V * n_out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64, help="never-masked prefix")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    ap.add_argument("--mask-ratio", type=float, default=0.5, help="fixed t; 0 = t ~ U(eps, 1) per sequence")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--logits", default="all", choices=["all", "masked"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.seq_len < 2 or not 1 <= a.prompt_len < a.seq_len or a.batch < 1 or a.steps < 1:
        ap.error("need --seq-len >= 2, 1 <= --prompt-len < --seq-len, --batch >= 1, --steps >= 1")
    if not 0.0 <= a.mask_ratio <= 1.0:
        ap.error("--mask-ratio must be in [0, 1]")
    torch.set_num_threads(a.threads)
    V = SHAPES[a.shape]["vocab_size"]
    cfg = dict(SHAPES[a.shape], rms_norm_eps=1e-6, rope_theta=1e6, mask_token_id=V - 2, pad_token_id=V - 1,
               eos_token_id=V - 1, bos_token_id=None, tie_word_embeddings=False)
    gen = torch.Generator().manual_seed(a.seed)

    print("torch_train_reference: building random f32 weights of the %s shape..." % a.shape, file=sys.stderr)
    t0 = time.perf_counter()
    weights = {}
    for name, shape in dream_ref.expected_shapes(cfg).items():
        if "norm" in name:
            w = torch.ones(shape)
        else:  # uniform with std 0.02, as src/model/synthetic.cc
            w = (torch.rand(shape, generator=gen) * 2 - 1).mul_(0.02 * 3 ** 0.5)
        weights[name] = w.requires_grad_(True)
    model = dream_ref.DreamModel(cfg, weights, {n: "F32" for n in weights})
    matrices = [w for w in weights.values() if w.dim() == 2]
    vectors = [w for w in weights.values() if w.dim() != 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    identity = torch.eye(cfg["hidden_size"])
    load_s = time.perf_counter() - t0
    n_params = sum(w.numel() for w in weights.values())

    B, L = a.batch, a.seq_len
    loss_mask = torch.ones(B, L, dtype=torch.bool)
    loss_mask[:, :a.prompt_len] = False
    high = min(V, 150000)

    def step():
        tokens = torch.randint(0, high, (B, L), generator=gen)
        tokens[tokens == model.mask_token_id] = 0
        if a.mask_ratio > 0:
            t = torch.full((B,), a.mask_ratio, dtype=torch.float64)
        else:
            t = 1e-3 + (1 - 1e-3) * torch.rand(B, generator=gen, dtype=torch.float64)
        mask = loss_mask & (torch.rand(B, L, generator=gen, dtype=torch.float64) < t[:, None])
        noisy = torch.where(mask, torch.full_like(tokens, model.mask_token_id), tokens)
        z = loss_mask.sum().to(torch.float64)
        row_weight = (1.0 / (t[:, None] * z)).expand(B, L)[mask].to(torch.float32)  # [n_out]
        started = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16"):
            if a.logits == "all":
                logits = dream_ref.shift_logits(dream_ref.forward(model, noisy))[mask]  # [n_out, V]
                n_out = B * L
            else:
                weights["lm_head.weight"] = identity  # forward returns the final-norm output [B, L, E]
                try:
                    hidden = dream_ref.forward(model, noisy)
                finally:
                    weights["lm_head.weight"] = lm_head
                logits = F.linear(dream_ref.shift_logits(hidden)[mask], lm_head)  # [n_out, V]
                n_out = int(mask.sum())
        ce = F.cross_entropy(logits.float(), tokens[mask], reduction="none")
        loss = (ce * row_weight).sum()
        loss.backward()
        fwd_bwd = time.perf_counter() - started
        o0 = time.perf_counter()
        norm = torch.nn.utils.clip_grad_norm_(list(weights.values()), 1.0)
        opt.step()
        optimizer = time.perf_counter() - o0
        return dict(seconds=time.perf_counter() - started, fwd_bwd_s=fwd_bwd, optimizer_s=optimizer,
                    loss=float(loss), grad_norm=float(norm), n_loss_rows=int(mask.sum()),
                    gflops=train_step_flops(cfg, B, L, n_out) / fwd_bwd / 1e9)

    lm_head = weights["lm_head.weight"]
    records = []
    for i in range(a.steps + 1):
        r = step()
        records.append(r)
        print("torch_train_reference: %s %d/%d  %.2f s (fwd+bwd %.2f, optimizer %.2f)  loss %.4f  |g| %.3e" %
              ("warm-up" if i == 0 else "step", i, a.steps, r["seconds"], r["fwd_bwd_s"], r["optimizer_s"],
               r["loss"], r["grad_norm"]), file=sys.stderr)
    timed = records[1:]
    secs = [r["seconds"] for r in timed]
    med = statistics.median(secs)
    out = dict(mode="train", shape=a.shape, dtype=a.dtype, logits=a.logits, threads=a.threads,
               torch=torch.__version__, seq_len=L, prompt_len=a.prompt_len, batch=B, steps=a.steps,
               mask_ratio=a.mask_ratio, lr=a.lr, n_params=n_params, load_s=load_s,
               seconds_per_step=dict(median=med, min=min(secs)),
               fwd_bwd_s_median=statistics.median(r["fwd_bwd_s"] for r in timed),
               optimizer_s_median=statistics.median(r["optimizer_s"] for r in timed),
               tokens_per_second=B * L / med, tokens_per_second_best=B * L / min(secs),
               fwd_bwd_gflops_median=statistics.median(r["gflops"] for r in timed),
               warmup=dict(seconds=records[0]["seconds"], loss=records[0]["loss"]),
               losses=[r["loss"] for r in timed], per_step=timed,
               peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            if k != "per_step":
                print("%-22s %s" % (k, v))


if __name__ == "__main__":
    main()
