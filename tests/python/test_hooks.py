"""generation_tokens_hook_func / generation_logits_hook_func: called as the reference calls them, seeing
what it sees, and changing the result as they change the reference's."""

import torch

import diffucoder
from conftest import reference_cases

import dream_ref as R

# 16 new tokens in 4 steps: k = 4 every step, so every step runs a forward (the engine skips the forward,
# and so the logits hook, on a step that commits nothing; the reference does not).
KW = dict(max_new_tokens=16, steps=4, alg="entropy", temperature=0.0, top_k=None)  # the reference has no top_k default


def prompts(tiny_gqa2):
    case = next(c for c in reference_cases("tiny-gqa2")["cases"] if c["name"].startswith("b3_"))
    ids, mask = R.left_pad(case["prompts"], reference_cases("tiny-gqa2")["pad_token_id"])
    return ids, mask


class Recorder:
    """Hooks that record their calls and, optionally, ban a token and force the last position."""

    def __init__(self, mask_id, ban=None, force=None):
        self.mask_id, self.ban, self.force = mask_id, ban, force
        self.tokens_calls, self.logits_calls = [], []

    def tokens(self, step, x, logits):
        self.tokens_calls.append((step, x.clone(), None if logits is None else self.masked_rows(x, logits)))
        if self.force is not None:
            x[:, -1] = self.force
        return x

    def logits(self, step, x, logits):
        if self.ban is not None:
            logits[:, :, self.ban] = float("-inf")
        self.logits_calls.append((step, x.clone(), self.masked_rows(x, logits)))
        return logits

    def masked_rows(self, x, logits):
        return logits[x == self.mask_id].clone()


def run_both(model_path, ids, mask, **hook_args):
    model = diffucoder.AutoModel.from_pretrained(model_path, torch_dtype=torch.float32, threads=2)
    ours = Recorder(model.config.mask_token_id, **hook_args)
    out = model.diffusion_generate(ids, attention_mask=mask, generation_tokens_hook_func=ours.tokens,
                                   generation_logits_hook_func=ours.logits, **KW)
    theirs = Recorder(model.config.mask_token_id, **hook_args)
    ref = R.diffusion_generate(R.load(model_path), ids.clone(), attention_mask=mask, generation_tokens_hook_func=theirs.tokens,
                               generation_logits_hook_func=theirs.logits, **KW)
    return out, ref, ours, theirs


def assert_same_calls(ours, theirs):
    assert [c[0] for c in ours] == [c[0] for c in theirs]
    for (step, x, rows), (_, rx, rrows) in zip(ours, theirs):
        assert x.tolist() == rx.tolist(), step
        if rrows is None:
            assert rows is None, step
        else:
            assert rows.shape == rrows.shape, step
            finite = torch.isfinite(rrows)
            assert torch.equal(finite, torch.isfinite(rows)), step
            assert torch.allclose(rows[finite], rrows[finite], atol=1e-4, rtol=1e-4), step


def test_hooks_see_what_the_reference_hooks_see(tiny_gqa2):
    ids, mask = prompts(tiny_gqa2)
    out, ref, ours, theirs = run_both(tiny_gqa2, ids, mask)
    assert out.tolist() == ref.sequences.tolist()
    assert [c[0] for c in ours.tokens_calls] == [None, 0, 1, 2, 3]
    assert [c[0] for c in ours.logits_calls] == [0, 1, 2, 3]
    assert_same_calls(ours.tokens_calls, theirs.tokens_calls)
    assert_same_calls(ours.logits_calls, theirs.logits_calls)


def test_hooks_change_what_the_reference_hooks_change(tiny_gqa2):
    ids, mask = prompts(tiny_gqa2)
    plain = diffucoder.AutoModel.from_pretrained(tiny_gqa2, torch_dtype=torch.float32, threads=2).diffusion_generate(
        ids, attention_mask=mask, **KW)
    banned = int(plain[0, -8])  # a token the plain run picks
    out, ref, ours, theirs = run_both(tiny_gqa2, ids, mask, ban=banned, force=5)
    assert out.tolist() == ref.sequences.tolist()
    assert (out[:, -1] == 5).all()
    assert not (out[:, ids.shape[1]:-1] == banned).any()
    assert out.tolist() != plain.tolist()
    assert_same_calls(ours.logits_calls, theirs.logits_calls)


def test_numpy_hooks(tiny_gqa2):
    """With numpy input the hooks get numpy arrays, and may return new ones."""
    import numpy as np

    model = diffucoder.AutoModel.from_pretrained(tiny_gqa2, threads=2)
    seen = []

    def tokens(step, x, logits):
        seen.append((type(x), None if logits is None else logits.shape))
        y = x.copy()
        y[:, 3] = 9
        return y

    out = model.diffusion_generate(np.array([[1, 2, 3]]), max_new_tokens=4, steps=4, temperature=0.0,
                                   alg="maskgit_plus", generation_tokens_hook_func=tokens)
    assert isinstance(out, np.ndarray) and out[0, 3] == 9
    assert seen[0] == (np.ndarray, None) and all(t is np.ndarray for t, _ in seen)
    assert seen[-1][1] == (1, 7, model.config.vocab_size)
