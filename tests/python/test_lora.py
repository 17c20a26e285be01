"""from_pretrained(..., lora=DIR): a PEFT LoRA adapter merged at load (docs/lora.md), against the logits of the
PyTorch reference of the adapted model (tests/reference/make_lora.py, ctest lora_fixtures); broken adapters raise
FileNotFoundError / ValueError naming the file and the field or tensor."""

import json
import os

import numpy as np
import pytest
import torch

import diffucoder
from conftest import BUILD, model_dir

LORA = os.environ.get("DC_LORA_FIXTURES_DIR", os.path.join(BUILD, "lora_fixtures"))


def manifest():
    path = os.path.join(LORA, "lora.json")
    if not os.path.isfile(path):
        pytest.fail(f"{path}: missing; run the lora_fixtures ctest test first")
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("case", [c["name"] for c in manifest()["cases"]] if os.path.isfile(os.path.join(LORA, "lora.json")) else [])
def test_merged_logits_equal_the_reference(case):
    c = next(c for c in manifest()["cases"] if c["name"] == case)
    model = diffucoder.AutoModel.from_pretrained(model_dir(c["base"]), torch_dtype=torch.float32, threads=2,
                                                 weight_cache="off", lora=os.path.join(LORA, c["adapter"]))
    logits = model(torch.tensor(c["input_ids"])).logits.numpy()
    want = np.fromfile(os.path.join(LORA, c["logits"]), dtype="<f4").reshape(c["shape"])
    assert np.abs(logits - want).max() <= 1e-5 * np.abs(want).max()


def test_broken_adapters_raise_naming_the_problem():
    m = manifest()
    kinds = {"not_found": FileNotFoundError, "invalid_argument": ValueError, "parse_error": ValueError}
    for c in m["bad"]:
        with pytest.raises(kinds[c["code"]]) as info:
            diffucoder.AutoModel.from_pretrained(model_dir(m["base_dir"]), threads=2, weight_cache="off",
                                                 lora=os.path.join(LORA, c["adapter"]))
        for s in c["contains"]:
            assert s in str(info.value), (c["name"], s, str(info.value))
    with pytest.raises(TypeError, match="lora"):
        diffucoder.AutoModel.from_pretrained(model_dir(m["base_dir"]), lora=3)


def test_unmerged_equals_merged():
    """lora_mode="unmerged": the base kept as it is and the adapter added by every forward; the merged logits
    (within 1e-5) and greedy tokens, with and without a KV cache; bad values named."""
    m = manifest()
    base = model_dir(m["base_dir"])
    adapter = os.path.join(LORA, "list_all/adapter")
    kw = dict(torch_dtype=torch.float32, threads=2, weight_cache="off", lora=adapter)
    merged = diffucoder.AutoModel.from_pretrained(base, **kw)
    unmerged = diffucoder.AutoModel.from_pretrained(base, lora_mode="unmerged", **kw)
    assert unmerged.lora_mode == "unmerged"
    ids = torch.tensor([[3, 17, 101, 5, 250, 42, 7]])
    lm, lu = merged(ids).logits.numpy(), unmerged(ids).logits.numpy()
    assert np.abs(lm - lu).max() <= 1e-5 * np.abs(lm).max()
    for extra in ({}, {"block_length": 4, "cache": "dual"}):
        gm = merged.diffusion_generate(ids, max_new_tokens=8, steps=8, temperature=0.0, alg="entropy", seed=0, **extra)
        gu = unmerged.diffusion_generate(ids, max_new_tokens=8, steps=8, temperature=0.0, alg="entropy", seed=0, **extra)
        assert torch.equal(gm, gu), extra
    with pytest.raises(ValueError, match="lora_mode"):
        diffucoder.AutoModel.from_pretrained(base, lora_mode="fused", **kw)
    with pytest.raises(ValueError, match="modules_to_save"):
        diffucoder.AutoModel.from_pretrained(base, threads=2, weight_cache="off", lora_mode="unmerged",
                                             lora=os.path.join(LORA, "regex_patterns/adapter"))
