#!/usr/bin/env python3
"""Writes a random bf16 checkpoint of a real model's shape in the exact Hugging Face layout, streamed.

For load-time benchmarks (BENCHMARKS.md "Start-up"): make_tiny.py holds every tensor in memory (30 GB
in f32 at 7B); this writes shard by shard, tensor by tensor, from one reused block of random bf16
values, so it needs ~100 MB of memory. The values are noise (std 0.02); only sizes and layout matter.

    /usr/bin/python3 bench/make_shape_checkpoint.py --shape diffucoder-7b --out DIR [--shards 5] [--layers N]

--layers N keeps the shape's matrices but only N layers (the 7B's matrices at a size that fits beside the
other work: BENCHMARKS.md "GGUF blocks run as they are").
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import make_tiny as MT  # noqa: E402  (config / generation_config / shard split of the fixtures)

SHAPES = {  # as src/model/synthetic.cc
    "diffucoder-7b": dict(vocab=152064, hidden=3584, ff=18944, layers=28, heads=28, kv_heads=4),
    "qwen2.5-0.5b": dict(vocab=151936, hidden=896, ff=4864, layers=24, heads=14, kv_heads=2),
}


def tensor_shapes(vocab, hidden, ff, layers, heads, kv_heads):
    d = hidden // heads
    t = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = "model.layers.%d." % i
        t += [(p + "self_attn.q_proj.weight", (heads * d, hidden)), (p + "self_attn.q_proj.bias", (heads * d,)),
              (p + "self_attn.k_proj.weight", (kv_heads * d, hidden)), (p + "self_attn.k_proj.bias", (kv_heads * d,)),
              (p + "self_attn.v_proj.weight", (kv_heads * d, hidden)), (p + "self_attn.v_proj.bias", (kv_heads * d,)),
              (p + "self_attn.o_proj.weight", (hidden, heads * d)), (p + "mlp.gate_proj.weight", (ff, hidden)),
              (p + "mlp.up_proj.weight", (ff, hidden)), (p + "mlp.down_proj.weight", (hidden, ff)),
              (p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
    t += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shards", type=int, default=5)
    ap.add_argument("--layers", type=int, default=0, help="only this many layers (default: the shape's)")
    a = ap.parse_args()
    s = dict(SHAPES[a.shape])
    if a.layers < 0 or a.layers > s["layers"]:
        ap.error("--layers must be in [1, %d]" % s["layers"])
    if a.layers:
        s["layers"] = a.layers
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(7))
    block = (rng.standard_normal(size=1 << 25, dtype=np.float32) * np.float32(0.02))
    block = (block.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # bf16 bits (truncated), 64 MiB
    shapes = tensor_shapes(**s)
    names = [n for n, _ in shapes]
    sizes = [2 * int(np.prod(sh)) for _, sh in shapes]
    by_name = dict(shapes)
    groups = MT.split_shards(names, sizes, a.shards)
    weight_map, cursor = {}, 0
    for i, group in enumerate(groups):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, a.shards)
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for n in group:
            nbytes = 2 * int(np.prod(by_name[n]))
            header[n] = {"dtype": "BF16", "shape": list(by_name[n]), "data_offsets": [off, off + nbytes]}
            off += nbytes
            weight_map[n] = fn
        hjson = json.dumps(header, separators=(",", ":")).encode()
        hjson += b" " * ((8 - len(hjson) % 8) % 8)
        tmp = os.path.join(a.out, fn + ".tmp")
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hjson)) + hjson)
            left = off
            while left > 0:  # the random block, cycled
                start = cursor % len(block)
                chunk = block[start:start + min(left, len(block) - start)]
                f.write(chunk)
                left -= len(chunk)
                cursor += len(chunk)
        os.replace(tmp, os.path.join(a.out, fn))
        print("wrote %s (%.2f GB)" % (fn, off / 1e9), file=sys.stderr)
    index = {"metadata": {"total_size": int(sum(sizes))}, "weight_map": weight_map}
    MT.write_text_atomic(os.path.join(a.out, "model.safetensors.index.json"), MT.hf_json(index))
    ids = MT.default_ids(s["vocab"])
    MT.write_text_atomic(os.path.join(a.out, "generation_config.json"), MT.hf_json(MT.generation_config_dict(**ids)))
    cfg = MT.config_dict(s["vocab"], s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["ff"], "bf16", **ids)
    MT.write_text_atomic(os.path.join(a.out, "config.json"), MT.hf_json(cfg))


if __name__ == "__main__":
    main()
