"""A dream GGUF (written by `diffucoder convert --out FILE.gguf`) through the Python package: the model and
the tokenizer load from the file and equal the checkpoint directory's."""

import numpy as np

import diffucoder
from conftest import run_cli


def test_gguf_model_and_tokenizer_equal_the_directory(tiny_vocab, tmp_path):
    path = str(tmp_path / "tiny-vocab.gguf")
    run_cli("convert", "--model", tiny_vocab, "--out", path, "--weights", "bf16", "--quiet", "--threads", "2")
    from_dir = diffucoder.AutoModel.from_pretrained(tiny_vocab, precision="f32", threads=2, weight_cache="off")
    from_gguf = diffucoder.AutoModel.from_pretrained(path, precision="f32", threads=2)
    assert from_gguf.config.vocab_size == from_dir.config.vocab_size
    assert from_gguf.config.mask_token_id == from_dir.config.mask_token_id
    ids = np.array([[1, 2, 3, from_dir.config.mask_token_id], [4, 5, 6, 7]])
    np.testing.assert_array_equal(from_gguf(ids).logits, from_dir(ids).logits)
    tok_dir = diffucoder.AutoTokenizer.from_pretrained(tiny_vocab)
    tok_gguf = diffucoder.AutoTokenizer.from_pretrained(path)
    text = "def add(a, b):\n    return a + b  # héllo 🙂<|im_end|>"
    assert tok_gguf.encode(text) == tok_dir.encode(text)
    assert tok_gguf.decode(tok_dir.encode(text)) == text
