"""The tokenizer with the Hugging Face surface the DiffuCoder / Dream examples use (AutoTokenizer)."""

import json
import os

import numpy as np

from . import _arrays, _checks
from ._checks import INT32_MAX
from ._core import Tokenizer as _Tokenizer
from ._core import resolve_model_path as _resolve_model_path
from ._core import apply_chat_template as _chat

_SPECIAL = ("bos_token", "eos_token", "pad_token", "mask_token")
MAX_PADDED_LENGTH = 1 << 20  # padding="max_length" pads to at most this many tokens (more than any context)


class BatchEncoding(dict):
    """A dict of input_ids / attention_mask that also reads as attributes (inputs.input_ids)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _read_json(path):
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        try:
            value = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    return value if isinstance(value, dict) else {}


def _token_text(value):
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class DreamTokenizer:
    """Loads `tokenizer.json` and the special tokens of tokenizer_config.json (else config.json's ids)."""

    def __init__(self, core, config, tokenizer_config):
        self._core = core
        self.padding_side = tokenizer_config.get("padding_side", "left")
        for name in _SPECIAL:
            text = _token_text(tokenizer_config.get(name))
            if text is None and isinstance(config.get(name + "_id"), int):
                text = core.id_to_token(config[name + "_id"])
            if text is None and name == "mask_token" and core.token_to_id("<|mask|>") is not None:
                text = "<|mask|>"
            if text is None and name in ("eos_token", "pad_token") and core.token_to_id("<|endoftext|>") is not None:
                text = "<|endoftext|>"
            setattr(self, name, text)

    @classmethod
    def from_pretrained(cls, path, *args, trust_remote_code=None, **kwargs):
        """`path`: a checkpoint directory holding tokenizer.json, the tokenizer.json file itself, or a
        dream FILE.gguf (its tokenizer.ggml metadata), or a repo id "ORG/NAME" in Hugging Face's local cache."""
        path = _resolve_model_path(_checks.path("path", path))
        if path.endswith(".gguf"):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path}: no such file")
            return cls(_Tokenizer(path), {}, {})
        directory, file = (path, os.path.join(path, "tokenizer.json")) if os.path.isdir(path) else (os.path.dirname(path), path)
        if not os.path.isfile(file):
            raise FileNotFoundError(f"{file}: no such file (AutoTokenizer.from_pretrained needs a tokenizer.json)")
        core = _Tokenizer(file)
        return cls(core, _read_json(os.path.join(directory, "config.json")),
                   _read_json(os.path.join(directory, "tokenizer_config.json")))

    # ---- ids of the special tokens -----------------------------------------------------------------
    def _id(self, token):
        return None if token is None else self._core.token_to_id(token)

    bos_token_id = property(lambda self: self._id(self.bos_token))
    eos_token_id = property(lambda self: self._id(self.eos_token))
    pad_token_id = property(lambda self: self._id(self.pad_token))
    mask_token_id = property(lambda self: self._id(self.mask_token))

    def __len__(self):
        return len(self._core)

    @property
    def vocab_size(self):
        return len(self._core)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._core.token_to_id(tokens)
        if not isinstance(tokens, (list, tuple)):
            raise TypeError(f"tokens: expected a str or a list of str, got {type(tokens).__name__}")
        return [self._core.token_to_id(_checks.string(f"tokens[{i}]", t)) for i, t in enumerate(tokens)]

    def convert_ids_to_tokens(self, ids):
        """The token of each id (None for an id the vocabulary does not hold, as Hugging Face's)."""
        if isinstance(ids, (int, np.integer)) and not isinstance(ids, (bool, np.bool_)):
            return self._core.id_to_token(_checks.integer("ids", ids, 0, INT32_MAX))
        ids = _checks.int_array("ids", _arrays.to_numpy(ids, "ids"), 0, INT32_MAX, "token id")
        if ids.ndim != 1:
            raise ValueError(f"ids: expected an id or one sequence of ids, got shape {tuple(ids.shape)}")
        return [self._core.id_to_token(int(i)) for i in ids]

    # ---- encoding ----------------------------------------------------------------------------------
    def encode(self, text, add_special_tokens=True, return_tensors=None, **kwargs):
        """Token ids of `text` (no BOS / EOS are ever added: the Dream tokenizer adds none)."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a string, got {type(text).__name__}")
        _checks.boolean("add_special_tokens", add_special_tokens)
        ids = self._core.encode(text)
        if return_tensors is None:
            return ids
        return _arrays.wrap(np.asarray([ids], dtype=np.int64), _arrays.want_torch(return_tensors))

    def __call__(self, text, return_tensors=None, padding=False, padding_side=None, add_special_tokens=True,
                 truncation=None, max_length=None, return_attention_mask=True, **kwargs):
        """input_ids and attention_mask of a text or a list of texts, padded as asked (HF's rules)."""
        if isinstance(text, str):
            single, texts = True, [text]
        elif isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
            single, texts = False, list(text)
        else:
            raise TypeError("text: expected a string or a list of strings")
        if not texts:
            raise ValueError("text: an empty list (no texts)")
        if truncation:
            raise ValueError("truncation: not supported (prompts are never cut); leave it out")
        _checks.boolean("add_special_tokens", add_special_tokens)
        _checks.boolean("return_attention_mask", return_attention_mask)
        max_length = _checks.integer("max_length", max_length, 1, MAX_PADDED_LENGTH, none_ok=True)
        side = _checks.string("padding_side", padding_side or self.padding_side, ("left", "right"))
        ids = self._core.encode_batch(texts)
        width = max(len(i) for i in ids)
        if isinstance(padding, (bool, str)) and padding in (True, "longest"):
            target = width
        elif padding == "max_length":
            if max_length is None or max_length < width:
                raise ValueError(f"max_length: padding='max_length' needs max_length in [{width} (the longest text), "
                                 f"{MAX_PADDED_LENGTH}], got {max_length}")
            target = max_length
        elif padding is None or (isinstance(padding, (bool, str)) and padding in (False, "do_not_pad")):
            target = None
        else:
            raise ValueError(f"padding: {padding!r} is not True, False, 'longest', 'max_length' or 'do_not_pad'")
        masks = [[1] * len(i) for i in ids]
        if target is not None:
            if self.pad_token_id is None:
                raise ValueError("padding: the tokenizer has no pad_token")
            for k, row in enumerate(ids):
                pad = target - len(row)
                if side == "left":
                    ids[k], masks[k] = [self.pad_token_id] * pad + row, [0] * pad + masks[k]
                else:
                    ids[k], masks[k] = row + [self.pad_token_id] * pad, masks[k] + [0] * pad
        out = BatchEncoding(input_ids=ids[0] if single else ids)
        if return_attention_mask:
            out["attention_mask"] = masks[0] if single else masks
        if return_tensors is not None:
            like_torch = _arrays.want_torch(return_tensors)
            if len({len(i) for i in ids}) > 1:
                raise ValueError("return_tensors: the texts have different lengths; pass padding=True")
            for key in list(out):
                out[key] = _arrays.wrap(np.asarray(ids if key == "input_ids" else masks, dtype=np.int64), like_torch)
        return out

    # ---- decoding ----------------------------------------------------------------------------------
    def decode(self, token_ids, skip_special_tokens=False, **kwargs):
        """The text of one sequence of ids (a list, a 1-D tensor or array, or one id). Ids must be in
        [0, 2**31 - 1]; one the vocabulary does not hold decodes to nothing, as in Hugging Face's tokenizers
        (a model's vocabulary may be padded past the tokenizer's)."""
        return self._decode(token_ids, skip_special_tokens, "token_ids")

    def _decode(self, token_ids, skip_special_tokens, name):
        skip = _checks.boolean("skip_special_tokens", skip_special_tokens)
        ids = _checks.int_array(name, _arrays.to_numpy(token_ids, name), 0, INT32_MAX, "token id")
        if ids.ndim > 1:
            raise ValueError(f"{name}: expected one sequence, got shape {tuple(ids.shape)}; use batch_decode")
        return self._core.decode([int(i) for i in ids.reshape(-1)], skip)

    def batch_decode(self, sequences, skip_special_tokens=False, **kwargs):
        if isinstance(sequences, (str, bytes)) or not hasattr(sequences, "__iter__"):
            raise TypeError(f"sequences: expected a list of sequences or a 2-D tensor, got {type(sequences).__name__}")
        return [self._decode(s, skip_special_tokens, f"sequences[{i}]") for i, s in enumerate(sequences)]

    # ---- chat --------------------------------------------------------------------------------------
    def apply_chat_template(self, conversation, tokenize=True, add_generation_prompt=False, return_tensors=None,
                            return_dict=False, padding=False, **kwargs):
        """Qwen2.5's ChatML layout (the default system message first when none is given)."""
        if not isinstance(conversation, (list, tuple)):
            raise TypeError("conversation: expected a list of messages ({'role': ..., 'content': ...}) or a list "
                            f"of such lists, got {type(conversation).__name__}")
        for name, value in (("tokenize", tokenize), ("add_generation_prompt", add_generation_prompt),
                            ("return_dict", return_dict)):
            _checks.boolean(name, value)
        batched = bool(conversation) and isinstance(conversation[0], (list, tuple))
        convs = conversation if batched else [conversation]
        if not convs:
            raise ValueError("conversation: an empty batch (no conversations)")
        texts = []
        for k, c in enumerate(convs):
            where = f"conversation[{k}]" if batched else "conversation"
            if not isinstance(c, (list, tuple)):
                raise TypeError(f"{where}: expected a list of messages, got {type(c).__name__}")
            if not c:
                raise ValueError(f"{where}: no messages")
            messages = []
            for i, m in enumerate(c):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise TypeError(f"{where}: message {i} must be a dict with string 'role' and 'content'")
                messages.append((m["role"], m["content"]))
            try:
                texts.append(_chat(messages, add_generation_prompt))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        if not tokenize:
            return texts if batched else texts[0]
        enc = self(texts if batched else texts[0], return_tensors=return_tensors, padding=padding)
        return enc if return_dict else enc["input_ids"]


class AutoTokenizer:
    """`AutoTokenizer.from_pretrained(dir)`: the tokenizer of a DiffuCoder / Dream checkpoint."""

    @staticmethod
    def from_pretrained(path, *args, **kwargs):
        return DreamTokenizer.from_pretrained(path, *args, **kwargs)
