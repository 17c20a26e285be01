"""from_pretrained("ORG/NAME") finds the checkpoint in Hugging Face's local cache (io/hub_cache.h through
diffucoder._core.resolve_model_path), without any network: a cache laid out here in the hub's exact layout
from the tiny-vocab fixture (blobs/ of the fixture's files, snapshots/<commit>/ of relative symlinks into
../../blobs, refs/main), selected by HF_HUB_CACHE or HF_HOME; a missing name raises FileNotFoundError naming
the paths looked at and the download command."""

import os

import numpy as np
import pytest

import diffucoder

COMMIT = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")


def make_cache(cache, fixture):
    repo = os.path.join(cache, "models--test-org--tiny-vocab")
    snap = os.path.join(repo, "snapshots", COMMIT)
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(snap)
    os.makedirs(os.path.join(repo, "refs"))
    for i, name in enumerate(FILES):
        blob = f"blob{i}"
        os.symlink(os.path.abspath(os.path.join(fixture, name)), os.path.join(repo, "blobs", blob))
        os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snap, name))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(COMMIT)
    return repo


def test_from_pretrained_finds_the_model_in_hf_hub_cache(tmp_path, monkeypatch, tiny_vocab):
    make_cache(str(tmp_path), tiny_vocab)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    model = diffucoder.AutoModel.from_pretrained("test-org/tiny-vocab", threads=1, weight_cache="off")
    local = diffucoder.AutoModel.from_pretrained(tiny_vocab, threads=1, weight_cache="off")
    assert model._core.info == local._core.info
    ids = np.array([[1, 2, 3, 4]], dtype=np.int64)
    np.testing.assert_array_equal(np.asarray(model(ids).logits), np.asarray(local(ids).logits))
    tok = diffucoder.AutoTokenizer.from_pretrained("test-org/tiny-vocab")
    assert tok.encode("def f(x):") == diffucoder.AutoTokenizer.from_pretrained(tiny_vocab).encode("def f(x):")


def test_hf_home_hub_is_used_without_hf_hub_cache(tmp_path, monkeypatch, tiny_vocab):
    make_cache(str(tmp_path / "hub"), tiny_vocab)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    path = diffucoder._core.resolve_model_path("test-org/tiny-vocab")
    assert path == os.path.join(str(tmp_path), "hub", "models--test-org--tiny-vocab", "snapshots", COMMIT)


def test_missing_model_names_the_paths_and_the_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError) as e:
        diffucoder.AutoModel.from_pretrained("test-org/not-downloaded")
    message = str(e.value)
    assert os.path.join(str(tmp_path), "models--test-org--not-downloaded", "refs", "main") in message
    assert "hf download test-org/not-downloaded" in message
    with pytest.raises(FileNotFoundError):
        diffucoder.AutoTokenizer.from_pretrained("test-org/not-downloaded")
    with pytest.raises(ValueError):  # a hostile name never becomes a path
        diffucoder.AutoModel.from_pretrained("test-org/..x")
