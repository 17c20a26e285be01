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


def test_misspelt_cpu_level_fails_the_load(tiny_gqa2, monkeypatch):
    # DC_CPU_LEVEL caps the kernels; a misspelt one must not silently run the baseline kernels
    monkeypatch.setenv("DC_CPU_LEVEL", "avx9000")
    with pytest.raises(ValueError, match="DC_CPU_LEVEL=avx9000"):
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=2)


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
    with pytest.raises(ValueError, match="device: 'gpu'"):
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, device="gpu")
    with pytest.raises(ValueError, match="threads"):
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=-1)
    with pytest.raises(TypeError, match="attn_implementation"):
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="vocab_size"):  # a tokenizer that does not belong to the model
        diffucoder.AutoModel.from_pretrained(tiny_gqa2, tokenizer_path=os.path.join(tiny_vocab, "tokenizer.json"))


NAN, INF = float("nan"), float("inf")

# Issue 41, probe finding 11: every argument of the public API, checked with its name and range. One row
# per case: (the argument, its value, the exception, a fragment the message must hold besides the name).
GENERATE_CASES = [
    ("max_new_tokens", -1, ValueError, "[1, 2147483647]"),  # complained about max_length
    ("max_new_tokens", 0, ValueError, "[1, 2147483647]"),
    ("max_new_tokens", "4", TypeError, "expected an int"),  # a raw str + int TypeError
    ("max_new_tokens", 4.0, TypeError, "expected an int"),
    ("max_new_tokens", 10**20, ValueError, "[1, 2147483647]"),
    ("max_length", "9", TypeError, "expected an int"),
    ("max_length", 10**20, ValueError, "[1, 2147483647]"),
    ("max_length", 3, ValueError, "must exceed the input length 3"),
    ("steps", 0, ValueError, "[1, 2147483647]"),
    ("steps", 2**31, ValueError, "[1, 2147483647]"),
    ("steps", "ten", TypeError, "expected an int"),
    ("steps", 2.0, TypeError, "expected an int"),
    ("eps", NAN, ValueError, "(0, 1)"),
    ("eps", INF, ValueError, "(0, 1)"),
    ("eps", 1.0, ValueError, "(0, 1)"),
    ("eps", "small", TypeError, "expected a float"),
    ("alg", 5, TypeError, "expected a str"),
    ("alg", "greedy", ValueError, "entropy"),
    ("alg_temp", NAN, ValueError, "finite"),
    ("alg_temp", INF, ValueError, "finite"),
    ("alg_temp", -1.0, ValueError, ">= 0"),
    ("alg_temp", "warm", TypeError, "expected a float"),
    ("temperature", NAN, ValueError, "finite"),
    ("temperature", INF, ValueError, "finite"),
    ("temperature", 1e39, ValueError, "finite"),  # finite as a double, inf as the engine's float32
    ("temperature", -1.0, ValueError, ">= 0"),
    ("temperature", "hot", TypeError, "expected a float"),
    ("top_p", NAN, ValueError, "(0, 1]"),
    ("top_p", 0.0, ValueError, "(0, 1]"),
    ("top_p", 1.5, ValueError, "(0, 1]"),
    ("top_p", "all", TypeError, "expected a float"),
    ("top_k", 10**20, ValueError, "9223372036854775807]"),
    ("top_k", 2.5, TypeError, "expected an int"),
    ("num_return_sequences", 0, ValueError, "[1, 2147483647]"),
    ("num_return_sequences", 10**10, ValueError, "[1, 2147483647]"),
    ("num_return_sequences", 2.0, TypeError, "expected an int"),
    ("return_dict_in_generate", "yes", TypeError, "expected a bool"),
    ("output_history", "yes", TypeError, "expected a bool"),
    ("mask_token_id", 10**10, ValueError, "[0, 383]"),
    ("mask_token_id", -5, ValueError, "[0, 383]"),
    ("mask_token_id", 384, ValueError, "[0, 383]"),
    ("mask_token_id", "1", TypeError, "expected an int"),
    ("pad_token_id", -1, ValueError, "[0, 383]"),
    ("pad_token_id", 1.0, TypeError, "expected an int"),
    ("bos_token_id", -3, ValueError, "[0, 383]"),
    ("eos_token_id", "x", TypeError, "expected an int"),
    ("eos_token_id", [1, 400], ValueError, "eos_token_id[1]"),
    ("block_length", -1, ValueError, "[0, 2147483647]"),
    ("block_length", 2**40, ValueError, "[0, 2147483647]"),
    ("block_length", 1.5, TypeError, "expected an int"),
    ("cache", 5, TypeError, "expected a str"),
    ("cache", "lru", ValueError, "dual, committed"),
    ("refresh_every", 0, ValueError, "[1, 2147483647]"),
    ("refresh_every", 2.0, TypeError, "expected an int"),
    ("threshold", NAN, ValueError, "finite"),
    ("threshold", "high", TypeError, "expected a float"),
    ("factor", INF, ValueError, "finite"),
    ("fast", "yes", TypeError, "expected a bool"),
    ("seed", -3, ValueError, "[0, 18446744073709551615]"),
    ("seed", 2**64, ValueError, "[0, 18446744073709551615]"),
    ("seed", True, TypeError, "expected an int"),
    ("seed", 1.5, TypeError, "expected an int"),
    ("stream", "yes", TypeError, "expected a bool"),
    ("generation_tokens_hook_func", 5, TypeError, "callable"),
    ("generation_logits_hook_func", 5, TypeError, "callable"),
    ("attention_mask", [[1, 0, 1]], ValueError, "left-padded"),
    ("attention_mask", [[1, 1]], ValueError, "differs from input_ids"),
    ("attention_mask", [[2, 1, 1]], ValueError, "[0, 1]"),
    ("attention_mask", [[NAN, 1.0, 1.0]], ValueError, "not 0 or 1"),
    ("attention_mask", "causal", ValueError, "'full'"),
    ("generation_config", 5, TypeError, "a dict or a GenerationConfig"),
    ("beams", 4, TypeError, "unexpected keyword argument"),
]


def case_id(case):
    return f"{case[0]}={case[1]!r}"[:40]


def assert_names(excinfo, name, fragment):
    message = str(excinfo.value)
    assert message.startswith(name), f"the message does not start with {name!r}: {message}"
    assert fragment in message, f"{fragment!r} not in: {message}"


@pytest.mark.parametrize("name, value, error, fragment", GENERATE_CASES, ids=[case_id(c) for c in GENERATE_CASES])
def test_generate_argument_errors(model, name, value, error, fragment):
    kwargs = {"steps": 2, name: value}
    if name not in ("max_new_tokens", "max_length"):
        kwargs["max_new_tokens"] = 4
    with pytest.raises(error) as excinfo:
        model.diffusion_generate(torch.tensor([[1, 2, 3]]), **kwargs)
    if name == "beams":
        name = "diffusion_generate()"
    assert_names(excinfo, name, fragment)


INPUT_ID_CASES = [  # input_ids of diffusion_generate and of forward
    ([[1, 10**10]], ValueError, "outside the vocabulary [0, 384)"),  # a raw pybind11 error in generate
    ([[1, -1]], ValueError, "outside the vocabulary [0, 384)"),
    ([[1, 384]], ValueError, "outside the vocabulary [0, 384)"),
    ([[1, 10**20]], ValueError, "[0, 383]"),
    ([["a", "b"]], TypeError, "expected integers"),
    ([[1.5, 2.0]], TypeError, "expected integers"),
    ([[[1, 2]]], ValueError, "2-D"),
]


@pytest.mark.parametrize("value, error, fragment", INPUT_ID_CASES, ids=[repr(c[0])[:30] for c in INPUT_ID_CASES])
def test_input_ids_errors(model, value, error, fragment):
    with pytest.raises(error) as excinfo:
        model.diffusion_generate(value, max_new_tokens=2, steps=1)
    assert_names(excinfo, "input_ids", fragment)
    with pytest.raises(error) as excinfo:
        model(value)
    assert_names(excinfo, "input_ids", fragment)


FORWARD_CASES = [
    ("position_ids", [[0, 1, 10**12]], ValueError, "[0, 2147483647]"),  # wrapped to a negative number
    ("position_ids", [[0, 1, -1]], ValueError, "[0, 2147483647]"),
    ("position_ids", [[0, 1, 2.5]], TypeError, "expected integers"),
    ("position_ids", [[0, 1]], ValueError, "shape of input_ids"),
    ("attention_mask", [[1, 1, 2]], ValueError, "[0, 1]"),
    ("attention_mask", [[1.0, 0.5, 1.0]], ValueError, "not 0 or 1"),
    ("attention_mask", "bad", ValueError, "'full'"),
    ("attention_mask", np.ones((1, 1, 3, 3)), ValueError, "2-D"),
    ("output_attentions", True, TypeError, "unexpected keyword argument"),
]


@pytest.mark.parametrize("name, value, error, fragment", FORWARD_CASES, ids=[case_id(c) for c in FORWARD_CASES])
def test_forward_argument_errors(model, name, value, error, fragment):
    with pytest.raises(error) as excinfo:
        model(torch.tensor([[1, 2, 3]]), **{name: value})
    assert_names(excinfo, "forward()" if name == "output_attentions" else name, fragment)


@pytest.fixture(scope="module")
def tokenizer(tiny_vocab):
    return diffucoder.AutoTokenizer.from_pretrained(tiny_vocab)


USER = {"role": "user", "content": "hi"}
TOKENIZER_CASES = [  # (method, args, kwargs, error, the argument named, fragment)
    ("decode", ([-1, 5],), {}, ValueError, "token_ids", "[0, 2147483647]"),  # decoded silently
    ("decode", ([10**10],), {}, ValueError, "token_ids", "[0, 2147483647]"),  # a raw pybind11 error
    ("decode", ("abc",), {}, TypeError, "token_ids", "expected integers"),
    ("decode", ([1.5],), {}, TypeError, "token_ids", "expected integers"),
    ("decode", ([[1], [2]],), {}, ValueError, "token_ids", "batch_decode"),
    ("decode", ([1],), {"skip_special_tokens": "yes"}, TypeError, "skip_special_tokens", "expected a bool"),
    ("batch_decode", ([[1, 2], [3, -1]],), {}, ValueError, "sequences[1]", "[0, 2147483647]"),
    ("batch_decode", (5,), {}, TypeError, "sequences", "a list of sequences"),
    ("convert_ids_to_tokens", (-1,), {}, ValueError, "ids", "[0, 2147483647]"),
    ("convert_ids_to_tokens", (10**10,), {}, ValueError, "ids", "[0, 2147483647]"),
    ("convert_ids_to_tokens", ([1, -1],), {}, ValueError, "ids", "[0, 2147483647]"),
    ("convert_tokens_to_ids", (5,), {}, TypeError, "tokens", "a str or a list of str"),
    ("convert_tokens_to_ids", ([5],), {}, TypeError, "tokens[0]", "expected a str"),
    ("encode", (5,), {}, TypeError, "text", "expected a string"),
    ("encode", ("x",), {"add_special_tokens": "no"}, TypeError, "add_special_tokens", "expected a bool"),
    ("encode", ("x",), {"return_tensors": "tf"}, ValueError, "return_tensors", "'pt'"),
    ("__call__", (5,), {}, TypeError, "text", "a string or a list of strings"),
    ("__call__", ([],), {}, ValueError, "text", "empty"),
    ("__call__", (["a", "bb"],), {"padding": "max_length", "max_length": -1}, ValueError, "max_length", "[1, "),
    ("__call__", (["a", "bb"],), {"padding": "max_length", "max_length": "9"}, TypeError, "max_length",
     "expected an int"),
    ("__call__", (["a", "bb"],), {"padding": "max_length", "max_length": 10**12}, ValueError, "max_length",
     "1048576"),  # a MemoryError
    ("__call__", (["a"],), {"padding": "sideways"}, ValueError, "padding", "'longest'"),
    ("__call__", (["a"],), {"padding_side": "top"}, ValueError, "padding_side", "'left'"),
    ("__call__", (["a"],), {"return_attention_mask": "yes"}, TypeError, "return_attention_mask", "expected a bool"),
    ("__call__", (["a"],), {"truncation": True}, ValueError, "truncation", "not supported"),
    ("__call__", (["a"],), {"return_tensors": "jax"}, ValueError, "return_tensors", "'pt'"),
    ("apply_chat_template", (None,), {}, TypeError, "conversation", "a list of messages"),
    ("apply_chat_template", ("hello",), {}, TypeError, "conversation", "a list of messages"),
    ("apply_chat_template", ([],), {}, ValueError, "conversation", "no messages"),
    ("apply_chat_template", ([[USER], []],), {}, ValueError, "conversation[1]", "no messages"),
    ("apply_chat_template", ([5],), {}, TypeError, "conversation", "message 0"),
    ("apply_chat_template", ([{"role": "robot", "content": "x"}],), {}, ValueError, "conversation", "robot"),
    ("apply_chat_template", ([USER],), {"add_generation_prompt": "x"}, TypeError, "add_generation_prompt",
     "expected a bool"),  # a raw pybind11 error
    ("apply_chat_template", ([USER],), {"tokenize": "x"}, TypeError, "tokenize", "expected a bool"),
    ("apply_chat_template", ([USER],), {"return_dict": 1}, TypeError, "return_dict", "expected a bool"),
]


@pytest.mark.parametrize("method, args, kwargs, error, name, fragment", TOKENIZER_CASES,
                         ids=[f"{c[0]}-{c[4]}-{repr(c[1])[:20]}" for c in TOKENIZER_CASES])
def test_tokenizer_argument_errors(tokenizer, method, args, kwargs, error, name, fragment):
    with pytest.raises(error) as excinfo:
        getattr(tokenizer, method)(*args, **kwargs)
    assert_names(excinfo, name, fragment)


FROM_PRETRAINED_CASES = [  # (keyword, value, error, fragment); "path" is the positional path
    ("path", 5, TypeError, "expected a path"),
    ("threads", "2", TypeError, "expected an int"),
    ("threads", -1, ValueError, "[0, 2147483647]"),
    ("threads", 10**12, ValueError, "[0, 2147483647]"),  # a raw pybind11 error
    ("precision", 5, TypeError, "expected a str"),
    ("precision", "f64", ValueError, "f64"),
    ("weight_cache", 5, TypeError, "expected a path"),
    ("device", 5, TypeError, "expected a str"),
    ("device", "gpu", ValueError, "gpu"),
    ("tokenizer_path", 5, TypeError, "expected a path"),
    ("torch_dtype", torch.float16, ValueError, "torch.bfloat16"),
    ("device_map", "cuda", ValueError, "'cpu'"),
    ("seed", -1, ValueError, "[0, 18446744073709551615]"),
    ("block_length", -3, ValueError, "[0, 2147483647]"),
    ("threshold", NAN, ValueError, "finite"),
    ("cache", 5, TypeError, "expected a str"),
    ("fast", "yes", TypeError, "expected a bool"),
    ("attn_implementation", "sdpa", TypeError, "attn_implementation"),
]


@pytest.mark.parametrize("name, value, error, fragment", FROM_PRETRAINED_CASES,
                         ids=[case_id(c) for c in FROM_PRETRAINED_CASES])
def test_from_pretrained_argument_errors(tiny_gqa2, name, value, error, fragment):
    with pytest.raises(error) as excinfo:
        if name == "path":
            diffucoder.AutoModel.from_pretrained(value)
        else:
            diffucoder.AutoModel.from_pretrained(tiny_gqa2, **{"threads": 1, name: value})
    assert_names(excinfo, "from_pretrained()" if name == "attn_implementation" else name, fragment)


def test_tokenizer_from_pretrained_path_type():
    with pytest.raises(TypeError) as excinfo:
        diffucoder.AutoTokenizer.from_pretrained(5)
    assert_names(excinfo, "path", "expected a path")


def test_the_binding_names_settings_out_of_its_range(model):
    """Behind the package's checks, the extension module itself refuses an int its C++ field cannot hold
    with a ValueError naming the setting and the range (not pybind11's "incompatible function arguments")."""
    for key, value, fragment in (("steps", 2**40, "[-2147483648, 2147483647]"),
                                 ("seed", -1, "[0, 18446744073709551615]"),
                                 ("mask_token_id", 2**31, "[-2147483648, 2147483647]")):
        with pytest.raises(ValueError) as excinfo:
            model._core.generate([[1, 2]], {"max_new_tokens": 2, key: value})
        assert_names(excinfo, key, fragment)
    with pytest.raises(TypeError) as excinfo:
        model._core.generate([[1, 2]], {"max_new_tokens": "2"})
    assert_names(excinfo, "max_new_tokens", "expected an int")


def test_values_at_the_edges_are_accepted(model, tokenizer):
    """The checks refuse only what is out of range: numpy ints, None for the optional settings, the largest
    seed, several eos ids, bool and float 0 / 1 masks, an id past the tokenizer's vocabulary (decodes to
    nothing, as in Hugging Face's tokenizers) all pass."""
    out = model.diffusion_generate(torch.tensor([[1, 2, 3]]), max_new_tokens=np.int64(2), steps=np.int32(1),
                                   top_k=None, top_p=None, alg_temp=None, seed=2**64 - 1, eos_token_id=[1, 2],
                                   attention_mask=torch.ones(1, 3, dtype=torch.bool), temperature=0)
    assert out.shape == (1, 5)
    logits = model(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[0.0, 1.0, 1.0]]),
                   position_ids=np.array([[0, 1, 2**31 - 1]])).logits
    assert logits.shape == (1, 3, 384) and torch.isfinite(logits).all()
    assert tokenizer.decode([len(tokenizer) + 5]) == ""
    assert tokenizer.convert_ids_to_tokens(len(tokenizer) + 5) is None


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
