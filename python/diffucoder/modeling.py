"""The model with the Hugging Face remote code's surface (AutoModel, diffusion_generate, forward), run by
the C++ engine. Names, arguments, defaults and return shapes follow Dream's generation_utils.py
(dream-reference.md §3); the differences are listed in the README's Python section."""

import json
import os
import queue
import re
import threading
from types import SimpleNamespace

import numpy as np

from . import _arrays, _checks
from ._checks import INT32_MAX, UINT64_MAX
from ._core import Model as _Model
from ._core import resolve_model_path as _resolve_model_path

# The reference's effective defaults (spec §3.2: from_model_config picks up transformers' legacy
# temperature 1.0 and top_k 50; max_length 20 means "20 new tokens").
GENERATION_DEFAULTS = dict(max_length=20, max_new_tokens=None, steps=512, eps=1e-3, alg="origin", alg_temp=None,
                           temperature=1.0, top_p=None, top_k=50, num_return_sequences=1,
                           return_dict_in_generate=False, output_history=False, mask_token_id=None,
                           pad_token_id=None, bos_token_id=None, eos_token_id=None)
# Extensions: Fast-dLLM block decoding (README), the seed, and stream=True for an iterator over steps.
EXTENSION_DEFAULTS = dict(block_length=0, cache="none", refresh_every=4, threshold=0.0, factor=0.0, fast=False,
                          seed=None)
_HOOKS = ("attention_mask", "generation_tokens_hook_func", "generation_logits_hook_func", "stream")


def _token_id_or_ids(name, value, vocab):
    """bos / eos ids: None, an id or a list of ids (Hugging Face allows several eos ids), each in [0, vocab)."""
    if isinstance(value, (list, tuple)):
        return [_checks.integer(f"{name}[{i}]", v, 0, vocab - 1) for i, v in enumerate(value)]
    return _checks.integer(name, value, 0, vocab - 1, none_ok=True)


def _setting_checks(vocab):
    """Per generation setting, its check: the value the engine gets, or TypeError / ValueError naming the
    setting and its range. Names (alg, cache) and combinations are the engine's to check."""
    c = _checks
    token = lambda name: lambda v: c.integer(name, v, 0, vocab - 1, none_ok=True)  # noqa: E731
    return {
        "max_length": lambda v: c.integer("max_length", v, 1, INT32_MAX, none_ok=True),
        "max_new_tokens": lambda v: c.integer("max_new_tokens", v, 1, INT32_MAX, none_ok=True),
        "steps": lambda v: c.integer("steps", v, 1, INT32_MAX),
        "eps": lambda v: c.real("eps", v, 0.0, 1.0, lo_open=True, hi_open=True),
        "alg": lambda v: c.string("alg", v),
        "alg_temp": lambda v: c.real("alg_temp", v, 0.0, none_ok=True),
        "temperature": lambda v: c.real("temperature", v, 0.0),
        "top_p": lambda v: c.real("top_p", v, 0.0, 1.0, lo_open=True, none_ok=True),
        "top_k": lambda v: c.integer("top_k", v, none_ok=True),  # <= 0 (or None) = off
        "num_return_sequences": lambda v: c.integer("num_return_sequences", v, 1, INT32_MAX),
        "return_dict_in_generate": lambda v: c.boolean("return_dict_in_generate", v),
        "output_history": lambda v: c.boolean("output_history", v),
        "mask_token_id": token("mask_token_id"),
        "pad_token_id": token("pad_token_id"),
        "bos_token_id": lambda v: _token_id_or_ids("bos_token_id", v, vocab),
        "eos_token_id": lambda v: _token_id_or_ids("eos_token_id", v, vocab),
        "block_length": lambda v: c.integer("block_length", v, 0, INT32_MAX),
        "cache": lambda v: c.string("cache", v),  # "none" | "prefix" | "dual" | "committed"
        "refresh_every": lambda v: c.integer("refresh_every", v, 1, INT32_MAX),
        "threshold": lambda v: c.real("threshold", v),
        "factor": lambda v: c.real("factor", v),
        "fast": lambda v: c.boolean("fast", v),
        "seed": lambda v: c.integer("seed", v, 0, UINT64_MAX, none_ok=True),
    }


def _checked_settings(settings, vocab):
    checks = _setting_checks(vocab)
    return {k: checks[k](v) for k, v in settings.items()}


class DreamModelOutput(dict):
    """sequences [rows, max_length] and history (a list of one canvas per step, or None); also a dict."""

    def __init__(self, **fields):
        super().__init__(**fields)

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key):
        if isinstance(key, int):
            return list(self.values())[key]
        return super().__getitem__(key)


def _precision(torch_dtype, precision):
    if precision is not None:
        return precision
    name = str(torch_dtype).replace("torch.", "") if torch_dtype is not None else "auto"
    if name in ("auto", "bfloat16", "float32"):
        return {"auto": "auto", "bfloat16": "bf16", "float32": "f32"}[name]
    raise ValueError(f"torch_dtype: {torch_dtype} is not supported; use torch.bfloat16 (bf16 activations), "
                     "torch.float32 (the exact f32 path) or leave it out (the checkpoint's)")


def _seed(seed):
    """An explicit seed, else one drawn from torch's global generator (so torch.manual_seed makes runs
    repeatable), else from numpy's."""
    if seed is not None:
        return int(seed)  # checked by _checked_settings
    if _arrays.torch is not None:
        return int(_arrays.torch.randint(0, 2**62, (1,)).item())
    return int(np.random.randint(0, 2**62))


class DreamModel:
    """A loaded checkpoint. Load with AutoModel.from_pretrained; .to() / .eval() are accepted no-ops."""

    def __init__(self, path, precision="auto", threads=0, weight_cache="", tokenizer_path="", device="cpu", lora=None,
                 lora_mode="merged", **generation):
        path = _checks.path("path", path)
        tokenizer_path = _checks.path("tokenizer_path", tokenizer_path)
        threads = _checks.integer("threads", threads, 0, INT32_MAX)
        precision = _checks.string("precision", precision)
        weight_cache = _checks.path("weight_cache", weight_cache)
        device = _checks.string("device", device)
        lora = "" if lora is None else _checks.path("lora", lora)
        lora_mode = _checks.string("lora_mode", lora_mode)
        if lora_mode not in ("merged", "unmerged"):
            raise ValueError(f"lora_mode: {lora_mode!r}: use 'merged' (into the weights at load) or 'unmerged' (the "
                             "adapter added by every forward, the base as it is; CPU only)")
        if not re.fullmatch(r"cpu|vulkan(:[0-9]{1,4})?", device):
            raise ValueError(f"device: {device!r}: use 'cpu', 'vulkan' (device 0) or 'vulkan:N' (N = an index of "
                             "`diffucoder devices`)")
        unknown = set(generation) - set(EXTENSION_DEFAULTS)
        if unknown:
            raise TypeError(f"from_pretrained() got an unexpected keyword argument '{sorted(unknown)[0]}'")
        self._core = _Model(path, tokenizer_path, threads, precision, weight_cache, device, lora, lora_mode)
        self.lora = lora or None
        self.lora_mode = lora_mode
        self.name_or_path = path
        info = self._core.info
        if path.endswith(".gguf"):  # a GGUF file: its metadata, as the engine read it
            cfg = {k: v for k, v in info.items() if k != "precision"}
        else:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
                cfg = json.load(f)  # the engine has just parsed it, so it is valid
        cfg.update({k: v for k, v in info.items() if k.endswith("_token_id")})
        self.config = SimpleNamespace(**cfg)
        self.precision = info["precision"]
        self._extension_defaults = dict(EXTENSION_DEFAULTS, **_checked_settings(generation, info["vocab_size"]))

    # ---- torch-module look-alikes ------------------------------------------------------------------
    def to(self, *args, **kwargs):
        return self

    def eval(self):
        return self

    def cpu(self):
        return self

    @property
    def device(self):
        return _arrays.torch.device("cpu") if _arrays.torch is not None else "cpu"

    # ---- forward -----------------------------------------------------------------------------------
    def __call__(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        return self.forward(input_ids, attention_mask, position_ids, **kwargs)

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        """DreamModelOutput(logits=[B, L, V] float32), UNSHIFTED, as the reference model returns them.
        attention_mask: None / "full" (no mask) or the [B, L] padding mask (1 real, 0 pad)."""
        unknown = set(kwargs) - {"use_cache", "return_dict", "num_logits_to_keep"}
        if unknown:
            raise TypeError(f"forward() got an unexpected keyword argument '{sorted(unknown)[0]}'")
        like_torch = _arrays.is_torch(input_ids)
        ids = self._token_ids(input_ids)
        if ids.ndim != 2:
            raise ValueError(f"input_ids: must be 2-D [batch, length], got shape {tuple(ids.shape)}")
        mask = None
        if attention_mask is not None and not isinstance(attention_mask, str):
            mask = _checks.mask_array("attention_mask", _arrays.to_numpy(attention_mask, "attention_mask"))
            if mask.ndim != 2:
                raise ValueError("attention_mask: pass the 2-D [batch, length] padding mask (1 real, 0 pad); the "
                                 f"engine builds the pair mask itself (got shape {tuple(mask.shape)})")
            mask = (mask != 0).astype(np.uint8)
        elif isinstance(attention_mask, str) and attention_mask != "full":
            raise ValueError(f"attention_mask: {attention_mask!r} is not 'full', None or a [batch, length] mask")
        pos = None
        if position_ids is not None:
            pos = _checks.int_array("position_ids", _arrays.to_numpy(position_ids, "position_ids"), 0, INT32_MAX,
                                    "position").astype(np.int32)
            if pos.ndim == 2 and pos.shape[0] == 1 and ids.shape[0] > 1:
                pos = np.repeat(pos, ids.shape[0], axis=0)
        logits = self._core.forward(ids, mask, pos)
        return DreamModelOutput(logits=_arrays.wrap(logits, like_torch))

    def _token_ids(self, input_ids, dtype=np.int32):
        """input_ids as integers in [0, vocab_size) (ValueError naming the first one outside), as `dtype`."""
        vocab = self._core.info["vocab_size"]
        ids = _checks.int_array("input_ids", _arrays.to_numpy(input_ids, "input_ids"), 0, vocab - 1, "token id",
                                f"the vocabulary [0, {vocab})")
        return ids.astype(dtype)

    # ---- generation --------------------------------------------------------------------------------
    def diffusion_generate(self, inputs=None, generation_config=None, **kwargs):
        """Masked-diffusion generation with Dream's diffusion_generate arguments (spec §3.1). Returns the
        sequences [rows, max_length] (prompt as given, then the generated canvas), or with
        return_dict_in_generate=True a DreamModelOutput(sequences, history). With stream=True, an
        iterator over the steps instead: (step, canvas) pairs, then the DreamModelOutput."""
        if inputs is None:
            inputs = kwargs.pop("input_ids", None)
        if inputs is None:
            raise TypeError("diffusion_generate() missing the input_ids argument")
        hooks = {k: kwargs.pop(k) for k in _HOOKS if k in kwargs}
        settings = dict(GENERATION_DEFAULTS)
        settings.update(self._extension_defaults)
        if generation_config is not None:
            if not isinstance(generation_config, dict) and not hasattr(generation_config, "__dict__"):
                raise TypeError("generation_config: expected a dict or a GenerationConfig, got "
                                f"{type(generation_config).__name__}")
            source = generation_config if isinstance(generation_config, dict) else vars(generation_config)
            settings.update({k: v for k, v in source.items() if k in settings})
        for key, value in kwargs.items():
            if key not in settings:
                raise TypeError(f"diffusion_generate() got an unexpected keyword argument '{key}'")
            settings[key] = value
        if "stream" in hooks:
            hooks["stream"] = _checks.boolean("stream", hooks["stream"])
        settings = _checked_settings(settings, self._core.info["vocab_size"])
        explicit_max_length = "max_length" in kwargs or (generation_config is not None and settings["max_length"] != 20)
        run = _Run(self, inputs, hooks, settings, explicit_max_length)
        if hooks.get("stream"):
            return run.stream()
        return run.result(run.execute())


class _Run:
    """One diffusion_generate call: the inputs as the engine takes them, the hooks, the output."""

    def __init__(self, model, inputs, hooks, settings, explicit_max_length):
        self.model = model
        self.like_torch = _arrays.is_torch(inputs)
        ids = model._token_ids(inputs, np.int64)
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"input_ids: must be 2-D [batch, length] with length >= 1, got shape {tuple(ids.shape)}")
        n, width = ids.shape
        mask = hooks.get("attention_mask")
        if mask is not None and not isinstance(mask, str):
            mask = _checks.mask_array("attention_mask", _arrays.to_numpy(mask, "attention_mask"))
            if mask.shape != ids.shape:
                raise ValueError(f"attention_mask: shape {tuple(mask.shape)} differs from input_ids {tuple(ids.shape)}")
        elif mask is not None and mask != "full":
            raise ValueError(f"attention_mask: {mask!r} is not 'full', None or a [batch, length] mask")
        else:
            mask = np.ones(ids.shape, dtype=bool)
        pads = np.where(mask.any(axis=1), np.argmax(mask, axis=1), width)
        for r in range(n):
            if not mask[r, pads[r]:].all() or pads[r] == width:
                raise ValueError(f"attention_mask: row {r} is not left-padded (zeros, then ones, at least one 1); "
                                 "diffusion generation needs padding_side='left'")
        if pads.min() > 0:
            raise ValueError("attention_mask: every row starts with padding; pad to the longest prompt "
                             "(padding=True), not beyond it")
        self.ids, self.mask, self.width = ids, mask, width
        self.prompts = [ids[r, pads[r]:].tolist() for r in range(n)]

        s = settings
        info = model._core.info
        max_length = s["max_length"]
        if s["max_new_tokens"] is not None:
            max_length = s["max_new_tokens"] + width
        elif not explicit_max_length and max_length == 20:
            max_length = min(20 + width, info["max_position_embeddings"])
        if max_length is None or max_length <= width:
            raise ValueError(f"max_length: {max_length} must exceed the input length {width} "
                             "(or pass max_new_tokens)")
        self.nrs = s["num_return_sequences"]
        self.history_on = bool(s["return_dict_in_generate"] and s["output_history"])
        self.return_dict = bool(s["return_dict_in_generate"])
        self.engine_settings = {
            "max_new_tokens": max_length - width, "steps": s["steps"], "eps": s["eps"], "alg": s["alg"],
            "alg_temp": 0.0 if s["alg_temp"] is None else s["alg_temp"], "temperature": s["temperature"],
            "top_p": 1.0 if s["top_p"] is None else s["top_p"], "top_k": 0 if s["top_k"] is None else s["top_k"],
            "num_return_sequences": self.nrs, "seed": _seed(s["seed"]), "output_history": self.history_on,
            "block_length": s["block_length"], "cache": s["cache"], "refresh_every": s["refresh_every"],
            "threshold": s["threshold"],
            "factor": s["factor"], "fast": s["fast"]}
        for key in ("mask_token_id", "pad_token_id"):
            if s[key] is not None:
                self.engine_settings[key] = s[key]
        self.tokens_hook = hooks.get("generation_tokens_hook_func")
        self.logits_hook = hooks.get("generation_logits_hook_func")
        for name, fn in (("generation_tokens_hook_func", self.tokens_hook),
                         ("generation_logits_hook_func", self.logits_hook)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name}: must be callable (step, x, logits) -> x / logits")
        self.step_logits = None  # the step's (hooked) logits for the tokens hook

    # The engine's hooks, in the reference's terms.
    def _x(self, canvas):
        return _arrays.wrap(canvas.astype(np.int64), self.like_torch)

    def _on_logits(self, step, canvas, indices, logits):
        rows, n_seq = canvas.shape
        full = np.zeros((rows * n_seq, logits.shape[1]), dtype=np.float32)
        full[indices] = logits
        value = _arrays.wrap(full.reshape(rows, n_seq, -1), self.like_torch)
        if self.logits_hook is not None:
            value = self.logits_hook(step, self._x(canvas), value)
            hooked = _arrays.to_numpy(value, "generation_logits_hook_func's result", np.float32)
            if hooked.shape != (rows, n_seq, logits.shape[1]):
                raise ValueError(f"generation_logits_hook_func: returned shape {tuple(hooked.shape)}, "
                                 f"expected {(rows, n_seq, logits.shape[1])}")
            logits[...] = hooked.reshape(rows * n_seq, -1)[indices]
        self.step_logits = value

    def _on_tokens(self, step, canvas):
        logits, self.step_logits = self.step_logits, None
        x = self.tokens_hook(None if step < 0 else step, self._x(canvas), None if step < 0 else logits)
        x = _arrays.to_numpy(x, "generation_tokens_hook_func's result", np.int64)
        if x.shape != canvas.shape:
            raise ValueError(f"generation_tokens_hook_func: returned shape {tuple(x.shape)}, expected {canvas.shape}")
        vocab = self.model.config.vocab_size
        if x.size and (x.min() < 0 or x.max() >= vocab):
            raise ValueError(f"generation_tokens_hook_func: returned a token id outside the vocabulary [0, {vocab})")
        canvas[...] = x

    def execute(self, on_step=None):
        need_logits = self.logits_hook is not None or self.tokens_hook is not None
        return self.model._core.generate(self.prompts, self.engine_settings, on_step,
                                         self._on_logits if need_logits else None,
                                         self._on_tokens if self.tokens_hook is not None else None)

    def _as_given(self, canvas):
        """The canvas with the caller's own ids at the padding positions (the engine pads with pad_token_id)."""
        canvas = canvas.astype(np.int64)
        pad = np.repeat(~self.mask, self.nrs, axis=0)
        prompt_part = canvas[:, :self.width]
        prompt_part[pad] = np.repeat(self.ids, self.nrs, axis=0)[pad]
        return canvas

    def result(self, out):
        sequences = _arrays.wrap(self._as_given(out["sequences"]), self.like_torch)
        if not self.return_dict:
            return sequences
        history = None
        if self.history_on:
            history = [_arrays.wrap(self._as_given(h), self.like_torch) for h in out["history"]]
        return DreamModelOutput(sequences=sequences, history=history)

    def stream(self):
        """Runs the generation on a worker thread; yields (step, canvas) after every step, then the result.
        Leaving the loop early (break, an exception, Ctrl-C) cancels the generation."""
        events, stop = queue.Queue(), threading.Event()

        def on_step(step, n_steps, canvas):
            events.put(("step", step, self._as_given(canvas)))
            return not stop.is_set()

        def work():
            try:
                events.put(("done", self.execute(on_step), None))
            except BaseException as e:  # handed to the consumer
                events.put(("error", e, None))

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        try:
            while True:
                kind, value, canvas = events.get()
                if kind == "step":
                    yield value, _arrays.wrap(canvas, self.like_torch)
                elif kind == "error":
                    raise value
                else:
                    yield self.result(value)
                    return
        finally:
            stop.set()
            worker.join()


class AutoModel:
    """`AutoModel.from_pretrained(dir, FILE.gguf or "ORG/NAME" in Hugging Face's local cache, torch_dtype=..., ...)`: a DreamModel.
    Engine options: threads (0 = all cores), precision ("auto" | "f32" | "bf16"; overrides torch_dtype),
    weight_cache ("" beside the model, "off", or a directory), device ("cpu", "vulkan" or "vulkan:N": the
    forward on a Vulkan device, every cache mode), lora (a PEFT LoRA adapter directory, docs/lora.md) and
    lora_mode ("merged": into the weights at load; "unmerged": the base as it is, the adapter added by every
    forward, CPU only); generation defaults for every call:
    block_length, cache, refresh_every, threshold, factor, fast, seed."""

    @staticmethod
    def from_pretrained(path, *args, torch_dtype=None, trust_remote_code=None, device_map=None, precision=None,
                        threads=0, weight_cache="", device="cpu", lora=None, lora_mode="merged", **kwargs):
        path = _resolve_model_path(_checks.path("path", path))  # "ORG/NAME": Hugging Face's local cache
        if not os.path.isdir(path) and not (path.endswith(".gguf") and os.path.isfile(path)):
            raise FileNotFoundError(f"{path}: not a checkpoint directory (config.json, *.safetensors) or a .gguf file")
        if args:
            raise TypeError("from_pretrained() takes the path and keyword arguments only")
        if device_map not in (None, "cpu", "auto"):
            raise ValueError(f"device_map: {device_map!r}: None, 'cpu' or 'auto' (a Vulkan GPU: device='vulkan')")
        threads = _checks.integer("threads", threads, 0, INT32_MAX)  # 0 = all cores
        return DreamModel(path, precision=_precision(torch_dtype, precision), threads=threads,
                          weight_cache=weight_cache, device=device, lora=lora, lora_mode=lora_mode, **kwargs)
