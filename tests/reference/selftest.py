#!/usr/bin/python3
"""Cheap self-checks of the reference (a few seconds): /usr/bin/python3 tests/reference/selftest.py

1. safetensors round trip; bf16 rounding equals torch's float32 -> bfloat16 conversion (RNE).
2. dream_ref.forward equals an independent float64 numpy implementation written with explicit loops
   over heads (GQA mapping, rotate-half RoPE, pair mask, zero output for rows without keys).
3. left-padded rows equal the same prompt run alone (positions from cumsum, pads at position 1).
4. transfer schedules listed in the spec (§3.4): 256/256, 512/512, 256/128, 256/64.
5. sample_tokens filters on hand-made rows (top-p keeps the crossing token, top-k keeps ties).
6. one T = 0 generation replayed step by step from its history: every step commits exactly k tokens,
   at the k most confident masked positions, with the argmax token of the shifted logits.
"""

import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dream_ref as R  # noqa: E402
import make_tiny as MT  # noqa: E402
import safetensors_np as st  # noqa: E402


def naive_forward(model, ids, pad_mask=None, pos=None):
    W = {k: v.double().numpy() for k, v in model.weights.items()}
    ids = np.asarray(ids)
    B, L = ids.shape
    nh, nkv, hd, eps = model.n_heads, model.n_kv, model.head_dim, model.eps
    pos = np.tile(np.arange(L), (B, 1)) if pos is None else np.asarray(pos)
    m = np.ones((B, L), bool) if pad_mask is None else np.asarray(pad_mask).astype(bool)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x, p):  # x [hd]
        half = hd // 2
        out = np.empty_like(x)
        for i in range(half):
            f = p / model.theta ** (2.0 * i / hd)
            c, s = np.cos(f), np.sin(f)
            out[i] = x[i] * c - x[i + half] * s
            out[i + half] = x[i + half] * c + x[i] * s
        return out

    logits = np.zeros((B, L, model.vocab_size))
    for b in range(B):
        h = W["model.embed_tokens.weight"][ids[b]].copy()
        for layer in range(model.n_layers):
            p = "model.layers.%d." % layer
            a = norm(h, W[p + "input_layernorm.weight"])
            q = a @ W[p + "self_attn.q_proj.weight"].T + W[p + "self_attn.q_proj.bias"]
            k = a @ W[p + "self_attn.k_proj.weight"].T + W[p + "self_attn.k_proj.bias"]
            v = a @ W[p + "self_attn.v_proj.weight"].T + W[p + "self_attn.v_proj.bias"]
            o = np.zeros((L, nh * hd))
            for head in range(nh):
                kvh = head // (nh // nkv)
                for i in range(L):
                    if not m[b, i]:
                        continue  # no valid key for a pad query: zero output
                    qi = rope(q[i, head * hd:(head + 1) * hd], pos[b, i])
                    sc = np.full(L, -np.inf)
                    for j in range(L):
                        if m[b, j]:
                            kj = rope(k[j, kvh * hd:(kvh + 1) * hd], pos[b, j])
                            sc[j] = qi @ kj / np.sqrt(hd)
                    pr = np.exp(sc - sc.max())
                    pr /= pr.sum()
                    o[i, head * hd:(head + 1) * hd] = pr @ v[:, kvh * hd:(kvh + 1) * hd]
            h = h + o @ W[p + "self_attn.o_proj.weight"].T
            x = norm(h, W[p + "post_attention_layernorm.weight"])
            g = x @ W[p + "mlp.gate_proj.weight"].T
            u = x @ W[p + "mlp.up_proj.weight"].T
            h = h + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
        logits[b] = norm(h, W["model.norm.weight"]) @ W["lm_head.weight"].T
    return logits


def main():
    tmp = tempfile.mkdtemp(prefix="dream_ref_selftest.")
    try:
        # 1. safetensors + bf16
        x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 10
        assert (st.round_to_bf16(x) == torch.from_numpy(x).bfloat16().float().numpy()).all()
        st.write_file(os.path.join(tmp, "t.safetensors"), {"a": x[:6].reshape(2, 3), "b": st.BF16(st.f32_to_bf16_bits(x))})
        t, _ = st.read_file(os.path.join(tmp, "t.safetensors"))
        assert (t["a"] == x[:6].reshape(2, 3)).all() and (t["b"] == st.round_to_bf16(x)).all()

        # 2. + 3. forward vs naive numpy, padded vs solo
        for name in ("tiny-gqa2", "tiny-gqa4-bf16"):
            p = dict(MT.PRESETS[name])
            MT.make_tiny(os.path.join(tmp, name), **p)
            model = R.load(os.path.join(tmp, name))
            if p["dtype"] == "bf16":
                assert set(model.stored_dtypes.values()) == {"BF16"}
            rng = np.random.default_rng(1)
            prompts = [list(rng.integers(0, 380, n)) for n in (7, 3, 5)]
            ids, pm = R.left_pad(prompts, model.pad_token_id)
            ids = torch.nn.functional.pad(ids, (0, 3), value=model.mask_token_id)
            pm = torch.nn.functional.pad(pm, (0, 3), value=1)
            pos = (pm.cumsum(-1) - 1).masked_fill(pm == 0, 1)
            ref = R.forward(model, ids, pm, pos).double().numpy()
            nv = naive_forward(model, ids.numpy(), pm.numpy(), pos.numpy())
            d = np.abs(ref - nv).max()
            assert d < 1e-4, (name, "naive", d)
            for b, pr in enumerate(prompts):
                s = ids.shape[1] - 3 - len(pr)
                solo = R.forward(model, ids[b:b + 1, s:]).double().numpy()
                assert np.abs(ref[b, s:] - solo[0]).max() < 1e-5, (name, "solo", b)
            print("forward %-15s max |ref - naive f64| = %.2e" % (name, d))

        # 4. schedules from the spec
        def summary(n, s):
            _, ks = R.schedule(s, 1e-3, n)
            assert sum(ks) == n
            return ks[0], sorted(set(ks[1:-1])), ks[-1]
        assert summary(256, 256) == (0, [1], 2)
        assert summary(512, 512) == (0, [1], 2)
        assert summary(256, 128) == (1, [2], 3)
        assert summary(256, 64) == (3, [4], 5)

        # 5. filters
        lg = torch.tensor([[2.0, 1.0, 1.0, 0.0, -1.0]])
        fmin = torch.finfo(torch.float32).min
        assert (R.top_k_logits(lg, 2) > fmin).tolist() == [[True, True, True, False, False]]
        assert (R.top_p_logits(lg, 0.5) > fmin).tolist() == [[True, False, False, False, False]]
        assert (R.top_p_logits(lg, 0.6) > fmin).tolist() == [[True, True, False, False, False]]
        assert R.select_most_confident(torch.tensor([0.1, 0.5, float("-inf"), 0.5, 0.5]), 2).tolist() == [1, 3]

        # 6. replay a generation
        model = R.load(os.path.join(tmp, "tiny-gqa2"))
        prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
        out = R.diffusion_generate(model, prompts, max_new_tokens=10, steps=10, alg="maskgit_plus",
                                   temperature=0.0, output_history=True)
        assert out.transfer_counts == [0, 1, 1, 1, 1, 1, 1, 1, 1, 2], out.transfer_counts
        prev = torch.cat([R.left_pad(prompts, model.pad_token_id)[0],
                          torch.full((2, 10), model.mask_token_id)], 1)
        for i, cur in enumerate(out.history):
            lg = R.shift_logits(R.forward(model, prev, out.attention_mask, out.position_ids))
            probs = torch.softmax(lg, -1)
            for b in range(2):
                changed = (cur[b] != prev[b]).nonzero().flatten().tolist()
                assert len(changed) == out.transfer_counts[i]
                masked = (prev[b] == model.mask_token_id).nonzero().flatten().tolist()
                conf = {j: float(probs[b, j].max()) for j in masked}
                best = sorted(masked, key=lambda j: (-conf[j], j))[:len(changed)]
                assert sorted(best) == changed, (i, b)
                for j in changed:
                    assert int(cur[b, j]) == int(probs[b, j].argmax())
            prev = cur
        assert torch.equal(out.history[-1], out.sequences)
        print("selftest OK")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
