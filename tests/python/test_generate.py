"""diffusion_generate against the PyTorch reference fixtures, the PyTorch reference run live, and the CLI."""

import json

import numpy as np
import pytest
import torch

import diffucoder
from conftest import model_dir, reference_cases, run_cli

import dream_ref as R


def padded(prompts, pad_id):
    ids, mask = R.left_pad(prompts, pad_id)
    return ids, mask


def settings(params):
    out = dict(steps=params["steps"], max_new_tokens=params["max_new_tokens"], eps=params["eps"], alg=params["alg"],
               temperature=params["temperature"], top_p=params["top_p"], top_k=params["top_k"],
               alg_temp=params["alg_temp"])
    return out


@pytest.mark.parametrize("name", ["tiny-gqa2", "tiny-gqa4-bf16", "tiny-vocab"])
def test_equals_reference_fixtures(name):
    """Every T = 0 case of generate.json: sequences and the per-step history, token for token."""
    fixtures = reference_cases(name)
    model = diffucoder.AutoModel.from_pretrained(model_dir(name), torch_dtype=torch.float32, threads=2)
    for case in fixtures["cases"]:
        ids, mask = padded(case["prompts"], fixtures["pad_token_id"])
        out = model.diffusion_generate(ids, attention_mask=mask, return_dict_in_generate=True, output_history=True,
                                       **settings(case["params"]))
        assert isinstance(out.sequences, torch.Tensor) and out.sequences.dtype == torch.int64, case["name"]
        assert out.sequences.tolist() == case["sequences"], case["name"]
        assert len(out.history) == case["params"]["steps"], case["name"]
        assert [h.tolist() for h in out.history] == case["history"], case["name"]


def test_defaults_are_the_references_effective_ones(tiny_gqa2):
    """No settings: 20 new tokens, 512 steps, origin, T = 1, top_k 50; sequences only (no dict)."""
    model = diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=2)
    x = torch.tensor([[1, 2, 3, 4]])
    out = model.diffusion_generate(x, seed=3)
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (1, 24)
    assert out[0, :4].tolist() == [1, 2, 3, 4]
    assert not (out[0, 4:] == model.config.mask_token_id).any()
    # the same seed gives the same tokens; torch.manual_seed makes seed-less calls repeatable
    assert out.tolist() == model.diffusion_generate(x, seed=3).tolist()
    torch.manual_seed(0)
    a = model.diffusion_generate(x)
    torch.manual_seed(0)
    assert a.tolist() == model.diffusion_generate(x).tolist()


def test_numpy_in_numpy_out_and_lists(tiny_gqa2):
    model = diffucoder.AutoModel.from_pretrained(tiny_gqa2, torch_dtype=torch.float32, threads=2)
    kw = dict(max_new_tokens=6, steps=6, alg="entropy", temperature=0.0)
    t = model.diffusion_generate(torch.tensor([[5, 6, 7]]), **kw)
    n = model.diffusion_generate(np.array([[5, 6, 7]]), **kw)
    lst = model.diffusion_generate([[5, 6, 7]], **kw)
    assert isinstance(n, np.ndarray) and n.dtype == np.int64 and n.shape == (1, 9)
    assert t.tolist() == n.tolist() == lst.tolist()


def test_num_return_sequences_and_max_length(tiny_gqa2):
    model = diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=2)
    out = model.diffusion_generate(torch.tensor([[1, 2], [3, 4]]), max_length=7, steps=5, num_return_sequences=3,
                                   temperature=0.9, seed=11, return_dict_in_generate=True)
    assert tuple(out.sequences.shape) == (6, 7) and out.history is None
    assert out.sequences[:3, :2].tolist() == [[1, 2]] * 3 and out.sequences[3:, :2].tolist() == [[3, 4]] * 3


def test_left_padding_keeps_the_callers_pad_ids(tiny_gqa2):
    """The prompt part of `sequences` is the input as given, pads included (the engine pads with its own id);
    the pads' values change nothing else (a left-padded fixture case, its pads written as 7)."""
    fixtures = reference_cases("tiny-gqa2")
    case = next(c for c in fixtures["cases"] if c["name"].startswith("b3_") and c["params"]["alg"] == "entropy")
    ids, mask = padded(case["prompts"], 7)
    model = diffucoder.AutoModel.from_pretrained(tiny_gqa2, torch_dtype=torch.float32, threads=2)
    out = model.diffusion_generate(ids, attention_mask=mask, **settings(case["params"]))
    width = ids.shape[1]
    assert out[:, :width].tolist() == ids.tolist()
    assert out[:, width:].tolist() == [row[width:] for row in case["sequences"]]


def test_equals_the_cli_for_the_same_seed(tiny_vocab):
    """Sampling at T > 0 with a seed: the package and `diffucoder generate` give the same tokens."""
    prompt = [151644, 872, 198, 7985, 264, 729, 151645, 198]
    common = dict(max_new_tokens=12, steps=6, temperature=0.8, top_p=0.9, top_k=40, alg="maskgit_plus", seed=42)
    model = diffucoder.AutoModel.from_pretrained(tiny_vocab, torch_dtype=torch.float32, threads=2)
    py = model.diffusion_generate(torch.tensor([prompt]), **common)[0, len(prompt):].tolist()
    line = run_cli("generate", "--model", tiny_vocab, "--prompt-ids", ",".join(map(str, prompt)), "--json", "--quiet",
                   "--precision", "f32", "--threads", "2", "--max-new-tokens", "12", "--steps", "6",
                   "--temperature", "0.8", "--top-p", "0.9", "--top-k", "40", "--alg", "maskgit_plus", "--seed", "42")
    assert json.loads(line.splitlines()[0])["token_ids"] == py


def test_stream_yields_every_step_then_the_result(tiny_gqa2):
    model = diffucoder.AutoModel.from_pretrained(tiny_gqa2, torch_dtype=torch.float32, threads=2)
    kw = dict(max_new_tokens=8, steps=4, alg="entropy", temperature=0.0, return_dict_in_generate=True)
    whole = model.diffusion_generate(torch.tensor([[3, 4, 5]]), **kw)
    items = list(model.diffusion_generate(torch.tensor([[3, 4, 5]]), stream=True, **kw))
    steps, final = items[:-1], items[-1]
    assert [s for s, _ in steps] == [0, 1, 2, 3]
    assert steps[-1][1].tolist() == whole.sequences.tolist() == final.sequences.tolist()
    mask_id = model.config.mask_token_id
    masked = [int((x == mask_id).sum()) for _, x in steps]
    assert masked == sorted(masked, reverse=True) and masked[-1] == 0
    # leaving early cancels the generation on its thread
    stream = model.diffusion_generate(torch.tensor([[3, 4, 5]]), stream=True, max_new_tokens=64, steps=64)
    assert next(stream)[0] == 0
    stream.close()


def test_block_decoding_extensions_equal_the_cli(tiny_vocab):
    """The extensions (blocks, the dual KV cache, threshold decoding) pass through: `fast=True` equals
    `diffucoder generate --fast`, and explicit block_length / cache / refresh_every / factor equal the CLI's flags."""
    prompt = [151644, 872, 198, 7985, 264, 729, 151645, 198]
    model = diffucoder.AutoModel.from_pretrained(tiny_vocab, torch_dtype=torch.float32, threads=2)
    base = ["generate", "--model", tiny_vocab, "--prompt-ids", ",".join(map(str, prompt)), "--json", "--quiet",
            "--precision", "f32", "--threads", "2", "--max-new-tokens", "16", "--temperature", "0", "--top-k", "0"]
    kw = dict(max_new_tokens=16, temperature=0.0, top_k=None, alg="entropy")
    for py, flags in ((dict(fast=True, steps=16), ["--fast"]),
                      (dict(block_length=8, cache="prefix", factor=2.0, steps=16),
                       ["--block-length", "8", "--cache", "prefix", "--factor", "2"]),
                      (dict(block_length=8, cache="committed", refresh_every=3, steps=16),
                       ["--block-length", "8", "--cache", "committed", "--refresh-every", "3"])):
        ours = model.diffusion_generate(torch.tensor([prompt]), **kw, **py)[0, len(prompt):].tolist()
        cli = json.loads(run_cli(*base, *flags).splitlines()[0])["token_ids"]
        assert ours == cli, flags
