"""AutoTokenizer: ids equal to `diffucoder tokenize` on a corpus, padding, tensors, decoding, chat template."""

import json
import os

import numpy as np
import pytest
import torch

import diffucoder
from conftest import SOURCE, run_cli

CORPUS = [os.path.join(SOURCE, "tests", "reference", f) for f in ("dream_ref.py", "make_tiny.py")] + [
    os.path.join(SOURCE, "README.md")]
EDGE = "héllo wörld  \t\n\n  ｆｕｌｌ　width 🤖 <|im_start|>user\n<|mask|><|dlm_pad|> 12345 ÅÅ naïve\r\n"


def test_ids_equal_the_cli_on_a_corpus(tiny_vocab, tmp_path):
    tok = diffucoder.AutoTokenizer.from_pretrained(tiny_vocab)
    edge = tmp_path / "edge.txt"
    edge.write_text(EDGE, encoding="utf-8")
    for path in CORPUS + [str(edge)]:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        cli = json.loads(run_cli("tokenize", "--model", tiny_vocab, "--text-file", path))
        assert tok.encode(text) == cli, path
        assert tok(text).input_ids == cli, path
        assert tok.decode(cli) == text, path


def test_special_tokens_and_properties(tiny_vocab):
    tok = diffucoder.AutoTokenizer.from_pretrained(tiny_vocab)
    assert tok.mask_token_id == 151666 and tok.mask_token == "<|mask|>"
    assert tok.eos_token_id == 151643 and tok.eos_token == "<|endoftext|>"
    assert tok.pad_token_id == 151643
    assert tok.convert_tokens_to_ids("<|dlm_pad|>") == 151667
    assert len(tok) == 151668


def test_call_padding_and_tensors(tiny_vocab):
    tok = diffucoder.AutoTokenizer.from_pretrained(tiny_vocab)
    short, long = tok.encode("a"), tok.encode("def f(x): return x")
    enc = tok(["a", "def f(x): return x"], return_tensors="pt", padding=True)
    assert isinstance(enc.input_ids, torch.Tensor) and enc.input_ids.dtype == torch.int64
    pad = len(long) - len(short)
    assert enc.input_ids[0].tolist() == [tok.pad_token_id] * pad + short
    assert enc.attention_mask[0].tolist() == [0] * pad + [1] * len(short)
    right = tok(["a", "def f(x): return x"], return_tensors="np", padding="longest", padding_side="right")
    assert isinstance(right["input_ids"], np.ndarray)
    assert right["input_ids"][0].tolist() == short + [tok.pad_token_id] * pad
    one = tok("def f(x): return x", return_tensors="pt")
    assert tuple(one.input_ids.shape) == (1, len(long)) and one.attention_mask.sum() == len(long)
    with pytest.raises(ValueError, match="padding=True"):
        tok(["a", "def f(x): return x"], return_tensors="pt")
    with pytest.raises(ValueError, match="return_tensors"):
        tok("a", return_tensors="tf")
    with pytest.raises(TypeError, match="text"):
        tok(5)


def test_decode_and_batch_decode(tiny_vocab):
    tok = diffucoder.AutoTokenizer.from_pretrained(tiny_vocab)
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.decode(torch.tensor(ids), skip_special_tokens=True) == "user\nhi"
    assert tok.batch_decode(torch.tensor([ids, ids]), skip_special_tokens=True) == ["user\nhi"] * 2
    assert tok.decode(ids + [152000]) == tok.decode(ids)  # ids past the tokenizer (embedding rows) are dropped


def test_apply_chat_template(tiny_vocab):
    tok = diffucoder.AutoTokenizer.from_pretrained(tiny_vocab)
    messages = [{"role": "user", "content": "Write a sort."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a sort."
                    "<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template(messages, add_generation_prompt=True) == tok.encode(text)
    enc = tok.apply_chat_template(messages, return_tensors="pt", return_dict=True, add_generation_prompt=True)
    assert enc.input_ids.tolist() == [tok.encode(text)] and enc.attention_mask.shape == enc.input_ids.shape
    with pytest.raises(ValueError, match=r"messages\[0\]\.role"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])
    with pytest.raises(TypeError, match="message 0"):
        tok.apply_chat_template([{"role": "user"}])
