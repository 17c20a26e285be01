"""PyTorch reference for Dream-7B / DiffuCoder-7B, written from /work/shared/spec/dream-reference.md.

This is the model the C++ engine is tested against. It follows the spec's description of the Hugging
Face remote code (modeling_dream.py §2, generation_utils.py §3) line by line, with these deliberate
differences (all documented in README.md):

* Precision. The engine's reference precision is **float32**: weights are upcast from their stored dtype
  (f32 or bf16) to f32 and every operation runs in f32 (RMSNorm, RoPE tables and their application, the
  GEMMs, attention softmax, SiLU, residual adds, logits and all sampling math). The upstream reference
  runs in **bf16**: activations, residual stream and logits are bf16 (§2.7); RMSNorm casts the normalised
  activations to bf16 before the weight multiply (§2.2); RoPE cos/sin are cast to bf16 and applied with
  bf16 element-wise math (§2.3); everything in `sample_tokens` (division by T, sort, softmax, cumsum,
  probabilities, entropy terms) and the `full_conf` tensor are bf16 (§3.5). None of that is emulated
  here.
* No greedy fallback. Upstream validates the bf16 probabilities with `torch.distributions.Categorical`
  and, when the simplex check fails for any row, silently takes the argmax for the whole step (§3.5
  GOTCHA). Here T > 0 always samples (torch.multinomial on the f32 probabilities).
* Tie-breaking is explicit: among equal confidences the LOWEST position is selected first (stable
  sort on (-confidence, position)), and argmax over the vocabulary returns the lowest token id among
  equal maxima. Upstream leaves both to `torch.topk` / `torch.max`.
* Rows of the attention with no valid key (left-pad query rows) get a zero attention output (§2.5).
* `forward` accepts a 1-D padding mask [B, L] and builds the boolean pair mask M[b,i,j] = m[b,i] & m[b,j]
  itself (upstream only `_sample` builds it; a raw 2-D mask passed to the upstream model is unsupported).
  A 3-D [B,L,L] or 4-D [B,1,L,L] boolean mask is also accepted and used as is.
* Random draws (alg "origin", T > 0, alg_temp > 0) use a caller-supplied torch.Generator; they are not
  meant to reproduce upstream's random streams.

API:
    model = load(dir, dtype=torch.float32)        # model.config (dict), model.weights (name -> tensor)
    logits = forward(model, input_ids, attention_mask=None, position_ids=None)   # [B, L, V], unshifted
    out = diffusion_generate(model, prompts, max_new_tokens=..., steps=..., alg=..., ...)
    out.sequences  [B, max_length] (left pads included), out.history (list of [B, max_length] or None),
    out.transfer_counts (k per step), out.attention_mask, out.position_ids (as used by the loop or None)
"""

import json
import os
import sys
from collections import namedtuple

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np as st  # noqa: E402

# The values `diffusion_generate` effectively runs with upstream when the caller passes no
# generation_config and does not override them (spec §3.2 GOTCHA): legacy transformers generation
# defaults leak in through from_model_config. Provided for callers who want the README behaviour.
EFFECTIVE_UPSTREAM_DEFAULTS = dict(temperature=1.0, top_p=1.0, top_k=50, steps=512, eps=1e-3, alg="origin",
                                   alg_temp=None)


class DreamModel:
    def __init__(self, config, weights, stored_dtypes, path=None):
        self.config = config
        self.weights = weights
        self.stored_dtypes = stored_dtypes
        self.path = path
        self.vocab_size = config["vocab_size"]
        self.hidden = config["hidden_size"]
        self.n_layers = config["num_hidden_layers"]
        self.n_heads = config["num_attention_heads"]
        self.n_kv = config["num_key_value_heads"]
        self.head_dim = self.hidden // self.n_heads
        self.eps = float(config["rms_norm_eps"])
        self.theta = float(config["rope_theta"])
        self.mask_token_id = config.get("mask_token_id")
        self.pad_token_id = config.get("pad_token_id")
        self.eos_token_id = config.get("eos_token_id")
        self.bos_token_id = config.get("bos_token_id")

    def __call__(self, input_ids, attention_mask=None, position_ids=None):
        return forward(self, input_ids, attention_mask, position_ids)


def expected_shapes(cfg):
    V, H, I = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = H // nh
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        shapes.update({
            p + "self_attn.q_proj.weight": (nh * hd, H), p + "self_attn.q_proj.bias": (nh * hd,),
            p + "self_attn.k_proj.weight": (nkv * hd, H), p + "self_attn.k_proj.bias": (nkv * hd,),
            p + "self_attn.v_proj.weight": (nkv * hd, H), p + "self_attn.v_proj.bias": (nkv * hd,),
            p + "self_attn.o_proj.weight": (H, nh * hd),
            p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
        })
    return shapes


def load(path, dtype=torch.float32):
    """Loads config.json + model.safetensors (or the shards named by model.safetensors.index.json).

    Weights are upcast to `dtype` (float32 = the engine's reference precision; float64 for error studies).
    """
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("tie_word_embeddings"):
        raise ValueError("Dream checkpoints have untied embeddings")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights, stored = {}, {}
    for fn in files:
        header, _ = st.read_header(os.path.join(path, fn))
        tensors, _ = st.read_file(os.path.join(path, fn))
        for name, arr in tensors.items():
            if name in weights:
                raise ValueError("duplicate tensor %s" % name)
            weights[name] = torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)
            stored[name] = header[name]["dtype"]
    shapes = expected_shapes(cfg)
    missing = sorted(set(shapes) - set(weights))
    extra = sorted(set(weights) - set(shapes))
    if missing or extra:
        raise ValueError("checkpoint mismatch: missing %s extra %s" % (missing[:5], extra[:5]))
    for n, s in shapes.items():
        if tuple(weights[n].shape) != s:
            raise ValueError("%s has shape %s, expected %s" % (n, tuple(weights[n].shape), s))
    return DreamModel(cfg, weights, stored, path)


# --------------------------------------------------------------------------------------------------
# Forward pass (spec §2)


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * w


def rope_inv_freq(head_dim, theta, dtype=torch.float32):
    # inv_freq[i] = 1 / theta^((2i)/head_dim): integer arange cast to float, divided by head_dim (§2.3)
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim
    return 1.0 / (theta ** exponent)


def rope_cos_sin(position_ids, head_dim, theta, dtype=torch.float32):
    inv_freq = rope_inv_freq(head_dim, theta, dtype)  # [hd/2]
    freqs = position_ids.to(dtype)[..., None] * inv_freq  # [B, L, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [B, L, hd]
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def pair_mask(pad_mask):
    """1-D padding mask [B, L] (1 = real) -> boolean [B, L, L] with M[b,i,j] = m[b,i] & m[b,j]."""
    m = torch.as_tensor(pad_mask).to(torch.bool)
    return m[:, :, None] & m[:, None, :]


def _as_ids(x):
    return torch.as_tensor(x, dtype=torch.long)


def forward(model, input_ids, attention_mask=None, position_ids=None):
    """Unshifted logits [B, L, V] for every position (spec §2.1).

    attention_mask: None (full bidirectional attention), a [B, L] padding mask (1 = real token), or a
    boolean [B, L, L] / [B, 1, L, L] mask (True = may attend). position_ids: None (0..L-1) or [B, L].
    """
    W = model.weights
    dt = W["model.embed_tokens.weight"].dtype
    ids = _as_ids(input_ids)
    B, L = ids.shape
    nh, nkv, hd = model.n_heads, model.n_kv, model.head_dim
    if position_ids is None:
        pos = torch.arange(L, dtype=torch.long)[None, :].expand(B, L)
    else:
        pos = _as_ids(position_ids)
    M = None
    if attention_mask is not None:
        am = torch.as_tensor(attention_mask)
        if am.dim() == 2:
            M = pair_mask(am)
        elif am.dim() == 3:
            M = am.to(torch.bool)
        elif am.dim() == 4:
            M = am[:, 0].to(torch.bool)
        else:
            raise ValueError("attention_mask must be [B,L], [B,L,L] or [B,1,L,L]")
    cos, sin = rope_cos_sin(pos, hd, model.theta, dt)
    cos, sin = cos[:, None], sin[:, None]  # [B, 1, L, hd]
    rep = nh // nkv
    scale = 1.0 / float(hd) ** 0.5

    h = W["model.embed_tokens.weight"][ids]
    for i in range(model.n_layers):
        p = "model.layers.%d." % i
        a = rms_norm(h, W[p + "input_layernorm.weight"], model.eps)
        q = F.linear(a, W[p + "self_attn.q_proj.weight"], W[p + "self_attn.q_proj.bias"])
        k = F.linear(a, W[p + "self_attn.k_proj.weight"], W[p + "self_attn.k_proj.bias"])
        v = F.linear(a, W[p + "self_attn.v_proj.weight"], W[p + "self_attn.v_proj.bias"])
        q = q.view(B, L, nh, hd).transpose(1, 2)
        k = k.view(B, L, nkv, hd).transpose(1, 2)
        v = v.view(B, L, nkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA: query head h uses KV head h // (nh / nkv) (each KV head repeated consecutively)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, nh, L, L]
        if M is not None:
            valid_row = M.any(-1)  # [B, L]
            scores = scores.masked_fill(~M[:, None], float("-inf"))
            # rows without any valid key: no NaN, zero output (spec §2.5)
            scores = scores.masked_fill(~valid_row[:, None, :, None], 0.0)
            probs = torch.softmax(scores, dim=-1)
            o = torch.matmul(probs, v) * valid_row[:, None, :, None].to(dt)
        else:
            o = torch.matmul(torch.softmax(scores, dim=-1), v)
        o = o.transpose(1, 2).reshape(B, L, nh * hd)
        h = h + F.linear(o, W[p + "self_attn.o_proj.weight"])
        m = rms_norm(h, W[p + "post_attention_layernorm.weight"], model.eps)
        g = F.linear(m, W[p + "mlp.gate_proj.weight"])
        u = F.linear(m, W[p + "mlp.up_proj.weight"])
        h = h + F.linear(F.silu(g) * u, W[p + "mlp.down_proj.weight"])
    h = rms_norm(h, W["model.norm.weight"], model.eps)
    return F.linear(h, W["lm_head.weight"])


def shift_logits(logits):
    """§2.6: the distribution for position j is the model output at j-1; position 0 keeps its own."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


# --------------------------------------------------------------------------------------------------
# Sampling (spec §3.5)


def top_p_logits(logits, top_p):
    """Nucleus filter: the first token whose cumulative mass crosses top_p is kept, the top token always.

    Equal logits are ordered by the (stable) descending sort: lower token id first.
    """
    sorted_logits, sorted_indices = torch.sort(logits, dim=-1, descending=True, stable=True)
    cumulative_probs = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cumulative_probs > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_indices, remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def top_k_logits(logits, top_k):
    """Removes logits strictly below the k-th largest value (ties at the threshold are all kept)."""
    top_k = min(int(top_k), logits.size(-1))
    kth = torch.topk(logits, top_k, dim=-1)[0][..., -1, None]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def argmax_lowest(x):
    """(max value, lowest index attaining it) along the last axis."""
    mx = x.max(dim=-1, keepdim=True).values
    idx = torch.arange(x.shape[-1], dtype=torch.long).expand_as(x)
    first = torch.where(x == mx, idx, torch.full_like(idx, x.shape[-1])).min(dim=-1).values
    return mx.squeeze(-1), first


def filtered_probs(logits, temperature=0.0, top_p=None, top_k=None):
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = top_p_logits(logits, top_p)
    if top_k is not None:
        logits = top_k_logits(logits, top_k)
    return logits, torch.softmax(logits, dim=-1)


def sample_tokens(logits, temperature=0.0, top_p=None, top_k=None, margin_confidence=False, neg_entropy=False,
                  generator=None):
    """Returns (confidence [N], x0 [N]) for N rows of logits [N, V], in the spec §3.5 order."""
    _, probs = filtered_probs(logits, temperature, top_p, top_k)
    if temperature > 0:
        # upstream: Categorical(probs).sample() with a silent argmax fallback; no fallback here
        x0 = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        confidence = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        confidence, x0 = argmax_lowest(probs)
    if margin_confidence:
        # upstream sorts the whole row; the two largest values are the same
        top2 = torch.topk(probs, 2, dim=-1).values
        confidence = top2[:, 0] - top2[:, 1]
    if neg_entropy:
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


def select_most_confident(conf_row, k):
    """Indices of the k largest entries of conf_row; ties -> lowest index first (stable sort)."""
    order = torch.sort(conf_row, descending=True, stable=True).indices
    return order[:k]


# --------------------------------------------------------------------------------------------------
# Generation (spec §3)

GenerateOutput = namedtuple("GenerateOutput", "sequences history transfer_counts attention_mask position_ids")


def left_pad(prompts, pad_token_id):
    """List of unpadded id lists -> (ids [B, P], mask [B, P]) left-padded with pad_token_id."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for b, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError("empty prompt")
        ids[b, P - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[b, P - len(p):] = 1
    return ids, mask


def transfer_count(num_masked_total, batch, t, s, last):
    """k of §3.4 step 2: int(batch-average masked count (fp32) * (1 - s/t)), or all on the last step."""
    num_mask_token = torch.tensor(num_masked_total, dtype=torch.long) / batch  # fp32 tensor
    if last:
        return int(num_mask_token)
    return int(num_mask_token * (1 - s / t))


def schedule(steps, eps=1e-3, new_tokens=None):
    """timesteps = linspace(1, eps, steps+1) (fp32); with new_tokens also the k per step (no hooks)."""
    ts = torch.linspace(1, eps, steps + 1)
    if new_tokens is None:
        return ts
    ks, left = [], new_tokens
    for i in range(steps):
        k = transfer_count(left, 1, ts[i], ts[i + 1], i == steps - 1)
        ks.append(k)
        left -= k
    return ts, ks


def diffusion_generate(model, prompts, max_new_tokens=None, steps=512, eps=1e-3, alg="origin", temperature=0.0,
                       top_p=None, top_k=None, alg_temp=None, pad_token_id=None, mask_token_id=None,
                       attention_mask=None, max_length=None, num_return_sequences=1, output_history=False,
                       generation_tokens_hook_func=None, generation_logits_hook_func=None, generator=None,
                       step_callback=None):
    """`model.diffusion_generate` + `_sample` (spec §3) in f32.

    prompts: list of unpadded id lists (left-padded here with pad_token_id), or a [B, P] tensor of
    already padded ids together with `attention_mask` [B, P] (upstream calling convention).
    Returns GenerateOutput(sequences [B, max_length] incl. left pads, history (list of `steps` canvases
    after each step, or None), transfer_counts (k per step, None entries for alg origin),
    attention_mask [B, N] padding mask or None, position_ids [B, N] or None).

    step_callback(info: dict) is called once per step after selection with keys: step, x (canvas before
    the step), mask_index, logits (shifted, hooked), mask_logits, confidence, x0, k, full_confidence,
    transfer_index (None for origin), t, s.
    """
    pad_token_id = model.pad_token_id if pad_token_id is None else pad_token_id
    mask_token_id = model.mask_token_id if mask_token_id is None else mask_token_id
    if mask_token_id is None:
        raise ValueError("mask_token_id is required")
    if isinstance(prompts, torch.Tensor):
        input_ids = prompts.to(torch.long)
        pad_mask = None if attention_mask is None else torch.as_tensor(attention_mask).to(torch.long)
    else:
        input_ids, pad_mask = left_pad(prompts, pad_token_id)
    if num_return_sequences > 1:
        input_ids = input_ids.repeat_interleave(num_return_sequences, dim=0)
        if pad_mask is not None:
            pad_mask = pad_mask.repeat_interleave(num_return_sequences, dim=0)
    B, P = input_ids.shape
    if max_new_tokens is not None:
        max_length = P + max_new_tokens
    elif max_length is None:
        max_length = min(20 + P, model.config.get("max_position_embeddings", 1 << 30))
    if P >= max_length:
        raise ValueError("prompt length %d >= max_length %d" % (P, max_length))

    # §3.3 canvas
    x = F.pad(input_ids, (0, max_length - P), value=int(mask_token_id))
    tok_idx = None
    am = None
    pad_out = None
    if pad_mask is not None and bool((pad_mask == 0).any()):
        pad_out = F.pad(pad_mask, (0, max_length - P), value=1)
        tok_idx = pad_out.long().cumsum(-1) - 1
        tok_idx = tok_idx.masked_fill(pad_out == 0, 1)
        am = pair_mask(pad_out)  # [B, N, N]; upstream [B, 1, N, N]
    timesteps = torch.linspace(1, eps, steps + 1)
    if generation_tokens_hook_func is not None:
        x = generation_tokens_hook_func(None, x, None)
    history = [] if output_history else None
    counts = []
    for i in range(steps):
        x_before = x.clone()
        mask_index = x == mask_token_id
        logits = forward(model, x, am, tok_idx)
        logits = shift_logits(logits)
        if generation_logits_hook_func is not None:
            logits = generation_logits_hook_func(i, x, logits)
        mask_logits = logits[mask_index]
        t = timesteps[i]
        s = timesteps[i + 1]
        info = dict(step=i, x=x_before, mask_index=mask_index, logits=logits, mask_logits=mask_logits, t=t, s=s,
                    transfer_index=None, full_confidence=None)
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            x0 = torch.zeros(mask_logits.shape[0], dtype=torch.long) + int(mask_token_id)
            transfer = torch.rand(x0.shape[0], generator=generator) < p_transfer
            if bool(transfer.any()):
                _, x0[transfer] = sample_tokens(mask_logits[transfer], temperature=temperature, top_p=top_p,
                                                top_k=top_k, generator=generator)
            x[mask_index] = x0.clone()
            counts.append(None)
            info.update(x0=x0, confidence=None, k=None)
        else:
            if alg == "maskgit_plus":
                confidence, x0 = sample_tokens(mask_logits, temperature, top_p, top_k, generator=generator)
            elif alg == "topk_margin":
                confidence, x0 = sample_tokens(mask_logits, temperature, top_p, top_k, margin_confidence=True,
                                               generator=generator)
            elif alg == "entropy":
                confidence, x0 = sample_tokens(mask_logits, temperature, top_p, top_k, neg_entropy=True,
                                               generator=generator)
            else:
                raise RuntimeError("unknown alg %r" % alg)
            k = transfer_count(int(mask_index.sum()), B, t, s, i == steps - 1)
            counts.append(k)
            full_confidence = torch.full(x.shape, float("-inf"), dtype=logits.dtype)
            full_confidence[mask_index] = confidence
            transfer_index = None
            if k > 0:
                if alg_temp is None or alg_temp == 0:
                    transfer_index = torch.stack([select_most_confident(full_confidence[b], k) for b in range(B)])
                else:
                    w = torch.softmax(full_confidence / alg_temp, dim=-1)
                    transfer_index = torch.multinomial(w, num_samples=k, generator=generator)
                x_ = torch.full_like(x, int(mask_token_id))
                x_[mask_index] = x0.clone()
                rows = torch.arange(B).unsqueeze(1).expand_as(transfer_index)
                x[rows, transfer_index] = x_[rows, transfer_index]
            info.update(x0=x0, confidence=confidence, k=k, full_confidence=full_confidence,
                        transfer_index=transfer_index)
        if step_callback is not None:
            step_callback(info)
        if generation_tokens_hook_func is not None:
            x = generation_tokens_hook_func(i, x, logits)
        if history is not None:
            history.append(x.clone())
    return GenerateOutput(x, history, counts, pad_out, tok_idx)


# --------------------------------------------------------------------------------------------------
# Fast-dLLM block decoding, exact variant (spec §6 with cache "none": full recompute every step)

BlockOutput = namedtuple("BlockOutput", "sequences history counts blocks")


def block_plan(prompt_width, max_new_tokens, steps, block_length, parallel):
    """[(begin, end, n_steps)] per block: blocks of block_length (0 = one block) after the padded prompt;
    fixed steps are split evenly, the first `steps mod n_blocks` blocks get one more; with parallel decoding
    n_steps is the block length (a cap)."""
    G = max_new_tokens
    BL = block_length if block_length and block_length > 0 else G
    n_blocks = (G + BL - 1) // BL
    if not parallel and steps < n_blocks:
        raise ValueError("steps %d < %d blocks" % (steps, n_blocks))
    plan = []
    for b in range(n_blocks):
        lo = prompt_width + b * BL
        hi = min(lo + BL, prompt_width + G)
        n = (hi - lo) if parallel else steps // n_blocks + (1 if b < steps % n_blocks else 0)
        plan.append((lo, hi, n))
    return plan


def parallel_count(conf_sorted_desc, threshold=None, factor=None):
    """How many of a row's block confidences (sorted descending) to commit: threshold -> those >= threshold;
    factor -> the largest n with (n + 1) * (1 - c_n) < factor; at least 1."""
    n = 0
    if threshold is not None and threshold > 0:
        n = int((conf_sorted_desc >= threshold).sum())
    else:
        vals = conf_sorted_desc.tolist()
        while n < len(vals) and (n + 2) * (1.0 - vals[n]) < factor:
            n += 1
    return max(n, 1)


def block_generate(model, prompts, max_new_tokens, steps, block_length, eps=1e-3, alg="entropy", temperature=0.0,
                   top_p=None, top_k=None, alg_temp=None, threshold=None, factor=None, pad_token_id=None,
                   mask_token_id=None, generator=None, step_callback=None):
    """Block-wise decoding (Fast-dLLM) with a full forward every step, i.e. the engine's `cache none`.

    The generated region is decoded left to right in blocks (block_plan); a step's candidates are only the
    current block's masked positions. Fixed steps: inside a block of S steps the reference schedule runs on
    the block (timesteps linspace(1, eps, S + 1), k from the batch-average masked count of the block, all
    on the block's last step), selection as in diffusion_generate. threshold / factor (parallel decoding):
    confidence = probability of the token (maskgit_plus, whatever alg is); each row with masks in the block
    commits parallel_count() of its most confident block positions (ties -> lowest position); the block
    ends when no row has a mask in it. Returns BlockOutput(sequences [B, N], history (canvas after each
    step), counts (per step, per row committed count), blocks (the plan)).
    step_callback(info) gets the keys of diffusion_generate's callback plus `block`, `parallel_n` (per row
    n, parallel decoding only).
    """
    pad_token_id = model.pad_token_id if pad_token_id is None else pad_token_id
    mask_token_id = model.mask_token_id if mask_token_id is None else mask_token_id
    parallel = (threshold is not None and threshold > 0) or (factor is not None and factor > 0)
    input_ids, pad_mask = left_pad(prompts, pad_token_id)
    B, P = input_ids.shape
    N = P + max_new_tokens
    x = F.pad(input_ids, (0, max_new_tokens), value=int(mask_token_id))
    am, tok_idx = None, None
    if bool((pad_mask == 0).any()):
        pad_out = F.pad(pad_mask, (0, max_new_tokens), value=1)
        tok_idx = (pad_out.long().cumsum(-1) - 1).masked_fill(pad_out == 0, 1)
        am = pair_mask(pad_out)
    plan = block_plan(P, max_new_tokens, steps, block_length, parallel)
    history, counts = [], []
    step = 0
    for blk, (lo, hi, S) in enumerate(plan):
        ts = None if parallel else torch.linspace(1, eps, S + 1)
        in_block = torch.zeros((B, N), dtype=torch.bool)
        in_block[:, lo:hi] = True
        for i in range(S):
            x_before = x.clone()
            mask_index = (x == mask_token_id) & in_block
            if parallel and not bool(mask_index.any()):
                break
            logits = shift_logits(forward(model, x, am, tok_idx))
            mask_logits = logits[mask_index]
            info = dict(step=step, block=blk, x=x_before, mask_index=mask_index, logits=logits,
                        mask_logits=mask_logits, transfer_index=None, full_confidence=None)
            row_counts = [0] * B
            if parallel:
                confidence, x0 = sample_tokens(mask_logits, temperature, top_p, top_k, generator=generator)
                full_confidence = torch.full(x.shape, float("-inf"), dtype=logits.dtype)
                full_confidence[mask_index] = confidence
                x_ = torch.full_like(x, int(mask_token_id))
                x_[mask_index] = x0.clone()
                ns = []
                for b in range(B):
                    nb = int(mask_index[b].sum())
                    if nb == 0:
                        ns.append(0)
                        continue
                    c = torch.sort(full_confidence[b][mask_index[b]], descending=True).values
                    n = parallel_count(c, threshold, factor)
                    ns.append(n)
                    idx = select_most_confident(full_confidence[b], n)
                    x[b, idx] = x_[b, idx]
                    row_counts[b] = n
                info.update(x0=x0, confidence=confidence, k=None, full_confidence=full_confidence, parallel_n=ns)
            else:
                t, s = ts[i], ts[i + 1]
                if alg == "maskgit_plus":
                    confidence, x0 = sample_tokens(mask_logits, temperature, top_p, top_k, generator=generator)
                elif alg == "topk_margin":
                    confidence, x0 = sample_tokens(mask_logits, temperature, top_p, top_k, margin_confidence=True,
                                                   generator=generator)
                elif alg == "entropy":
                    confidence, x0 = sample_tokens(mask_logits, temperature, top_p, top_k, neg_entropy=True,
                                                   generator=generator)
                else:
                    raise RuntimeError("block_generate: unsupported alg %r" % alg)
                k = transfer_count(int(mask_index.sum()), B, t, s, i == S - 1)
                full_confidence = torch.full(x.shape, float("-inf"), dtype=logits.dtype)
                full_confidence[mask_index] = confidence
                transfer_index = None
                if k > 0:
                    if alg_temp is None or alg_temp == 0:
                        transfer_index = torch.stack([select_most_confident(full_confidence[b], k) for b in range(B)])
                    else:
                        w = torch.softmax(full_confidence / alg_temp, dim=-1)
                        transfer_index = torch.multinomial(w, num_samples=k, generator=generator)
                    x_ = torch.full_like(x, int(mask_token_id))
                    x_[mask_index] = x0.clone()
                    rows = torch.arange(B).unsqueeze(1).expand_as(transfer_index)
                    x[rows, transfer_index] = x_[rows, transfer_index]
                    row_counts = [k] * B
                info.update(x0=x0, confidence=confidence, k=k, full_confidence=full_confidence,
                            transfer_index=transfer_index, t=t, s=s)
            if step_callback is not None:
                step_callback(info)
            history.append(x.clone())
            counts.append(row_counts)
            step += 1
    return BlockOutput(x, history, counts, plan)
