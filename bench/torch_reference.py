"""Times the PyTorch reference generation loop (tests/reference/dream_ref.py, the reference's own loop:
full recompute every step) on a synthetic model of a named shape, for comparison with `diffucoder bench`.

Run with Debian's interpreter: /usr/bin/python3 bench/torch_reference.py --shape qwen2.5-0.5b --json
With --max-steps N the loop stops after N steps and the end-to-end time is extrapolated from the median
step (every step of the reference costs the same: one full forward over prompt + canvas).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import dream_ref  # noqa: E402

SHAPES = {  # the same shapes as src/model/synthetic.cc
    "diffucoder-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                          num_attention_heads=28, num_key_value_heads=4),
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2),
    "tiny": dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}


class Stop(Exception):
    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--alg", default="entropy")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-steps", type=int, default=0, help="stop after N steps and extrapolate (0 = all)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the reference on a GPU, as its users run it)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    cuda = a.device.startswith("cuda")
    if cuda:  # every tensor dream_ref makes (weights, canvas, masks, sampling) lives on the GPU
        torch.set_default_device(a.device)
    cfg = dict(SHAPES[a.shape], rms_norm_eps=1e-6, rope_theta=1e6, mask_token_id=SHAPES[a.shape]["vocab_size"] - 2,
               pad_token_id=SHAPES[a.shape]["vocab_size"] - 1, eos_token_id=SHAPES[a.shape]["vocab_size"] - 1,
               bos_token_id=None, tie_word_embeddings=False)
    gen = torch.Generator(device=a.device).manual_seed(0)
    t0 = time.perf_counter()
    weights = {}
    for name, shape in dream_ref.expected_shapes(cfg).items():
        if "norm" in name:
            weights[name] = torch.ones(shape, dtype=dtype)
        else:
            weights[name] = (torch.rand(shape, generator=gen) * 2 - 1).mul_(0.02 * 3 ** 0.5).to(dtype)
    model = dream_ref.DreamModel(cfg, weights, {n: a.dtype for n in weights})
    load_ms = (time.perf_counter() - t0) * 1e3
    prompt = torch.randint(0, cfg["vocab_size"] - 2, (a.prompt_len,), generator=gen).tolist()
    if cuda:
        torch.cuda.synchronize()

    # dream_ref computes in the weights' dtype; its forward upcasts nothing when weights are bf16.
    step_ms, last = [], [time.perf_counter()]

    def on_step(info):
        if cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        step_ms.append((now - last[0]) * 1e3)
        last[0] = now
        print("torch_reference: step %d/%d %.0f ms" % (len(step_ms), a.steps, step_ms[-1]), file=sys.stderr)
        if a.max_steps and len(step_ms) >= a.max_steps:
            raise Stop()

    t_gen = time.perf_counter()
    last[0] = t_gen
    complete = True
    with torch.no_grad():
        try:
            dream_ref.diffusion_generate(model, [prompt], max_new_tokens=a.new_tokens, steps=a.steps, alg=a.alg,
                                         temperature=0.0, top_k=50, step_callback=on_step)
        except Stop:
            complete = False
    gen_ms = (time.perf_counter() - t_gen) * 1e3
    median = statistics.median(step_ms)
    total_ms = gen_ms if complete else median * a.steps
    out = dict(shape=a.shape, dtype=a.dtype, device=torch.cuda.get_device_name() if cuda else "cpu",
               threads=a.threads, torch=torch.__version__, prompt_len=a.prompt_len,
               new_tokens=a.new_tokens, steps=a.steps, alg=a.alg, load_ms=load_ms, steps_run=len(step_ms),
               complete=complete, ms_per_step_median=median, total_ms=total_ms,
               tokens_per_second=a.new_tokens / (total_ms / 1e3),
               peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               peak_device_bytes=torch.cuda.max_memory_allocated() if cuda else 0)
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print("%-20s %s" % (k, v))


if __name__ == "__main__":
    main()
