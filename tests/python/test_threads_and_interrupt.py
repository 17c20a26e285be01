"""Two Python threads generating at once (the GIL is released while the engine computes), and Ctrl-C:
a SIGINT to a child process generating stops it cleanly with KeyboardInterrupt."""

import os
import signal
import subprocess
import sys
import threading
import time

import torch

import diffucoder

KW = dict(max_new_tokens=24, steps=12, temperature=0.9, top_k=20, alg="entropy", seed=7, return_dict_in_generate=True)


def test_two_threads_on_two_models_equal_one_after_the_other(tiny_gqa2, tiny_vocab):
    jobs = [(diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=1), torch.tensor([[1, 2, 3], [4, 5, 6]])),
            (diffucoder.AutoModel.from_pretrained(tiny_vocab, threads=1), torch.tensor([[151644, 872, 198]]))]
    alone = [m.diffusion_generate(x, **KW).sequences.tolist() for m, x in jobs]
    together = [None, None]

    def work(i):
        m, x = jobs[i]
        together[i] = m.diffusion_generate(x, **KW).sequences.tolist()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == alone


def test_two_threads_on_one_model(tiny_gqa2):
    model = diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=2)
    inputs = [torch.tensor([[1, 2, 3]]), torch.tensor([[9, 8]])]
    alone = [model.diffusion_generate(x, **KW).sequences.tolist() for x in inputs]
    together = [None, None]
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(
        i, model.diffusion_generate(inputs[i], **KW).sequences.tolist())) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == alone


CHILD = r"""
import sys, time, torch, diffucoder
model = diffucoder.AutoModel.from_pretrained(sys.argv[1], threads=1)
print("generating", flush=True)
start = time.monotonic()
try:
    model.diffusion_generate(torch.tensor([[1, 2, 3]]), max_new_tokens=1500, steps=1500, alg="entropy")
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted after %.1f s" % (time.monotonic() - start), flush=True)
# the model is still usable
print("after", model.diffusion_generate(torch.tensor([[1, 2]]), max_new_tokens=2, steps=1).shape, flush=True)
"""


def test_ctrl_c_stops_a_generation_cleanly(tiny_gqa2):
    env = dict(os.environ)
    child = subprocess.Popen([sys.executable, "-c", CHILD, tiny_gqa2], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "generating"
        time.sleep(1.0)  # well inside the generation (1500 steps over 1503 positions: tens of seconds)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("interrupted after"), out
    assert lines[1] == "after torch.Size([1, 4])", out
