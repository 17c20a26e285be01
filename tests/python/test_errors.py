"""Bad arguments raise ValueError / TypeError / FileNotFoundError naming the argument; failed loads and
loaded-then-freed models leak nothing."""

import gc
import os
import shutil

import numpy as np
import pytest
import torch

import diffucoder


@pytest.fixture(scope="module")
def model(tiny_gqa2):
    return diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=2)


def test_load_errors(tiny_gqa2, tiny_vocab, tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-dir"):
        diffucoder.AutoModel.from_pretrained(str(tmp_path / "no-such-dir"))
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        diffucoder.AutoTokenizer.from_pretrained(str(tmp_path))
    broken = tmp_path / "broken"
    shutil.copytree(tiny_gqa2, broken)
    (broken / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="config.json"):
        diffucoder.AutoModel.from_pretrained(str(broken))
    with pytest.raises(ValueError, match="torch_dtype"):
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, torch_dtype=torch.float16)
    with pytest.raises(ValueError, match="precision"):
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, precision="f64")
    with pytest.raises(ValueError, match="--device 'gpu'"):
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, device="gpu")
    with pytest.raises(ValueError, match="threads"):
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=-1)
    with pytest.raises(TypeError, match="attn_implementation"):
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="vocab_size"):  # a tokenizer that does not belong to the model
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, tokenizer_path=os.path.join(tiny_vocab, "tokenizer.json"))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(steps=0), ValueError, "steps"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(alg="greedy"), ValueError, "entropy"),
    (dict(cache="lru"), ValueError, "dual"),
    (dict(max_length=3), ValueError, "max_length"),
    (dict(steps="ten"), TypeError, "steps"),
    (dict(top_k=2.5), TypeError, "top_k"),
    (dict(num_return_sequences=0), ValueError, "num_return_sequences"),
    (dict(beams=4), TypeError, "beams"),
    (dict(generation_tokens_hook_func=5), TypeError, "generation_tokens_hook_func"),
    (dict(attention_mask=[[1, 0, 1]]), ValueError, "attention_mask"),
    (dict(attention_mask=[[1, 1]]), ValueError, "attention_mask"),
    (dict(seed=-3), ValueError, "seed"),
])
def test_generate_argument_errors(model, kwargs, error, match):
    kwargs = dict(kwargs, max_new_tokens=None if "max_length" in kwargs else 4)
    with pytest.raises(error, match=match):
        model.diffusion_generate(torch.tensor([[1, 2, 3]]), **kwargs)


def test_input_errors(model):
    with pytest.raises(ValueError, match="input_ids"):
        model.diffusion_generate(torch.zeros(2, 2, 2, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.diffusion_generate(torch.tensor([[1, 100000]]), max_new_tokens=2)
    with pytest.raises(TypeError, match="input_ids"):
        model.diffusion_generate(np.array([[1.5, 2.0]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="every row starts with padding"):
        model.diffusion_generate(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[0, 1, 1]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 1, 2, 2))


def test_hook_errors(model):
    def boom(step, x, logits):
        raise KeyError("from the hook")

    with pytest.raises(KeyError, match="from the hook"):
        model.diffusion_generate(torch.tensor([[1, 2]]), max_new_tokens=4, steps=2, generation_tokens_hook_func=boom)
    with pytest.raises(ValueError, match="generation_logits_hook_func"):
        model.diffusion_generate(torch.tensor([[1, 2]]), max_new_tokens=4, steps=2,
                                 generation_logits_hook_func=lambda s, x, logits: logits[:, :1])

    def bad_id(step, x, logits):
        x[0, -1] = 10**6
        return x

    with pytest.raises(ValueError, match="vocabulary|out of range|outside"):
        model.diffusion_generate(torch.tensor([[1, 2]]), max_new_tokens=4, steps=2, generation_tokens_hook_func=bad_id)
    # the model is still usable after every failure
    assert model.diffusion_generate(torch.tensor([[1, 2]]), max_new_tokens=4, steps=2).shape == (1, 6)


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_models_loaded_in_a_loop_keep_memory_flat(tiny_vocab, tiny_gqa2):
    """tiny-vocab holds ~40 MB of tokenizer and weights: a leak per load would add that much each time."""
    def cycle():
        m = diffucoder.AutoModel.from_pretrained(tiny_vocab, threads=1, weight_cache="off")
        m.diffusion_generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, steps=1)
        del m
        with pytest.raises(ValueError):
            diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=1,
                                                 tokenizer_path=os.path.join(tiny_vocab, "tokenizer.json"))
        gc.collect()

    for _ in range(3):
        cycle()
    before = rss_bytes()
    for _ in range(8):
        cycle()
    grown = rss_bytes() - before
    assert grown < 24 << 20, f"RSS grew by {grown >> 20} MiB over 8 load / free cycles"
