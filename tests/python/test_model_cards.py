"""The model cards' examples (tests/python/model_cards/: DiffuCoder-Instruct / cpGRPO, DiffuCoder-Base and
Dream-Instruct, as published apart from the import line) run unchanged on the tiny real-vocabulary
checkpoint. Two substitutions are made when they run: the model path (a hub name) becomes the checkpoint
directory, and "cuda" becomes "cpu" (that `.to("cuda")` is torch's own call on the input tensors, which
fails on a machine without CUDA; the model's `.to("cuda")` is an accepted no-op). Every card runs at its
published length: the DiffuCoder cards 256 new tokens in 256 steps, Dream's 512 in 512 (about a minute on
2 cores: each step samples every masked position over the 152064-entry vocabulary)."""

import os
import re

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("card, new_tokens", [("diffucoder_instruct.py", 256), ("diffucoder_base.py", 256),
                                              ("dream_instruct.py", 512)])
def test_model_card_example_runs(card, new_tokens, tiny_vocab, capsys):
    with open(os.path.join(HERE, "model_cards", card), encoding="utf-8") as f:
        source = f.read()
    assert "from diffucoder import AutoModel, AutoTokenizer" in source
    source, n = re.subn(r'model_path = "[^"]+"', f"model_path = {tiny_vocab!r}", source)
    assert n == 1
    source = source.replace('"cuda"', '"cpu"')
    scope = {"__name__": "__model_card__"}
    exec(compile(source, card, "exec"), scope)
    output, input_ids = scope["output"], scope["input_ids"]
    assert tuple(output.sequences.shape) == (1, input_ids.shape[1] + new_tokens)
    assert len(output.history) == new_tokens  # output_history: one canvas per step
    assert not (output.sequences == scope["tokenizer"].mask_token_id).any()
    completion = scope["generations"][0]
    assert isinstance(completion, str) and len(completion) > 0
    # the card prints the first completion, cut at its stop token
    stop = "<|dlm_pad|>" if card == "diffucoder_instruct.py" else scope["tokenizer"].eos_token
    assert capsys.readouterr().out == completion.split(stop)[0] + "\n"
