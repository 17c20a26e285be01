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
