#!/usr/bin/python3
"""The Python package's overhead per step against the CLI on the same work (BENCHMARKS.md "Python").

Runs the same generation (prompt ids, new tokens, steps, greedy entropy, threads) alternately with
`diffucoder generate --json` (its `total_ms`: the engine's generate, load excluded) and with the package's
`model.diffusion_generate` (the wall time of the call: conversions, the binding, the engine), `--runs`
times each, and prints the medians and the overhead: the median over the back-to-back pairs of
(python − cli) / cli, which cancels most of the load other processes put on a shared machine.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py --model DIR [--binary build/diffucoder]
        [--prompt-len 64] [--new-tokens 64] [--steps 64] [--threads 2] [--runs 5]
"""
import argparse
import json
import statistics
import subprocess
import time

import torch

import diffucoder


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--binary", default="build/diffucoder")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    prompt = [(7 * i + 11) % 300 for i in range(a.prompt_len)]  # ids every fixture's vocabulary holds
    cli = [a.binary, "generate", "--model", a.model, "--prompt-ids", ",".join(map(str, prompt)), "--json", "--quiet",
           "--max-new-tokens", str(a.new_tokens), "--steps", str(a.steps), "--alg", "entropy", "--temperature", "0",
           "--threads", str(a.threads), "--precision", a.precision, "--weight-cache", "off"]
    model = diffucoder.AutoModel.from_pretrained(a.model, precision=a.precision, threads=a.threads, weight_cache="off")
    x = torch.tensor([prompt])
    kw = dict(max_new_tokens=a.new_tokens, steps=a.steps, alg="entropy", temperature=0.0)
    cli_ms, py_ms = [], []
    cli_ids = py_ids = None
    for _ in range(a.runs):
        out = json.loads(subprocess.run(cli, capture_output=True, text=True, check=True).stdout.splitlines()[0])
        cli_ms.append(out["timings"]["total_ms"])
        cli_ids = out["token_ids"]
        t0 = time.perf_counter()
        seq = model.diffusion_generate(x, **kw)
        py_ms.append((time.perf_counter() - t0) * 1e3)
        py_ids = seq[0, a.prompt_len:].tolist()
    c, p = statistics.median(cli_ms), statistics.median(py_ms)
    pair = statistics.median((py - cl) / cl for py, cl in zip(py_ms, cli_ms))
    print(json.dumps({"model": a.model, "steps": a.steps, "runs": a.runs, "same_tokens": cli_ids == py_ids,
                      "cli_ms": round(c, 2), "python_ms": round(p, 2),
                      "cli_ms_per_step": round(c / a.steps, 3), "python_ms_per_step": round(p / a.steps, 3),
                      "overhead_ms_per_step": round(pair * c / a.steps, 3),
                      "overhead_percent": round(100.0 * pair, 2),
                      "cli_all": [round(v, 1) for v in cli_ms], "python_all": [round(v, 1) for v in py_ms]}))


if __name__ == "__main__":
    main()
