"""model(input_ids, attention_mask, position_ids).logits against the PyTorch reference's forward fixtures
(the same the C++ model tests compare with): unshifted logits of every real position."""

import numpy as np
import pytest
import torch

import diffucoder
from conftest import model_dir, reference_cases


@pytest.mark.parametrize("name", ["tiny-gqa2", "tiny-gqa4-bf16"])
def test_logits_equal_the_reference(name):
    model = diffucoder.AutoModel.from_pretrained(model_dir(name), torch_dtype=torch.float32, threads=2)
    forward = reference_cases(name, "forward")
    for case in forward["cases"]:
        ids = torch.tensor(case["input_ids"])
        mask = None if case["attention_mask"] is None else torch.tensor(case["attention_mask"])
        pos = None if case["position_ids"] is None else torch.tensor(case["position_ids"])
        logits = model(ids, mask, pos).logits
        assert isinstance(logits, torch.Tensor) and logits.dtype == torch.float32
        want = np.fromfile(f"{model_dir(name)}/reference/{case['logits_file']}", dtype="<f4").reshape(case["shape"])
        real = np.ones(ids.shape, dtype=bool) if mask is None else mask.numpy() != 0
        got = logits.numpy()[real]
        np.testing.assert_allclose(got, want[real], rtol=1e-4, atol=1e-4, err_msg=case["name"])
    # numpy in, numpy out; the position ids may be one row for every row
    out = model.forward(np.array([[1, 2, 3], [4, 5, 6]]), position_ids=np.array([[0, 1, 2]])).logits
    assert isinstance(out, np.ndarray) and out.shape == (2, 3, model.config.vocab_size)
    np.testing.assert_allclose(out, model(torch.tensor([[1, 2, 3], [4, 5, 6]])).logits.numpy(), rtol=0, atol=0)
