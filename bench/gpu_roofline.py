#!/usr/bin/env python3
"""Bytes moved, FLOPs and the roofline floor of one DiffuCoder-7B denoising step per cache mode, on a few
GPUs from their memory bandwidth and bf16 tensor peak (BENCHMARKS.md "Vulkan backend"). A model, not a
measurement: no GPU was available when it was written.
Usage: bench/gpu_roofline.py [--prompt P] [--new G] [--block B] [--weights bf16|q8|q4] [--shape S]
       [--gpu NAME --json]   (one GPU's floors as JSON: what bench/gpu_session.sh reads)
       [--fusions]           (the activation bytes a step no longer moves since the GEMM epilogues and rope_kv)"""
import argparse
import json

# name: (layers, hidden, FFN, query heads, KV heads, head_dim, vocabulary), as src/model/synthetic.cc's shapes.
SHAPES = {
    'diffucoder-7b': (28, 3584, 18944, 28, 4, 128, 152064),
    'tiny': (2, 64, 128, 4, 2, 16, 4096),
}
# Bytes per weight: bf16; q8 (int8 codes, an f32 scale per row: negligible); q4 (nibbles, f16 scale and min per
# 128-column group: bench's default --group-size).
WEIGHT_BYTES = {'bf16': 2.0, 'q8': 1.0, 'q4': 0.5 + 4 / 128}
# name: (memory bandwidth bytes/s, dense bf16 tensor peak with f32 accumulation FLOP/s), vendor data sheets
GPUS = {
    'H100 SXM (H800: same HBM3 and tensor peak)': (3.35e12, 989e12),
    'H200': (4.8e12, 989e12),
    'RTX 4090': (1.008e12, 165e12),
    'RX 7900 XTX': (0.96e12, 123e12),
}


def rows_of(prompt, new, block, mode):
    """(rows the forward computes, masked rows needing the lm_head, keys per query) of a mean step."""
    L = prompt + new
    n_blocks = new // block
    # About half the candidates are masked on average over a block's or the canvas's steps.
    if mode == 'none':  # every step a full forward over the canvas (the reference)
        return L, new / 2, L
    if mode == 'prefix':  # [block_begin - 1, L), mean over the blocks
        return sum(L - (prompt + b * block) + 1 for b in range(n_blocks)) / n_blocks, block / 2, L
    return block + 1, block / 2, L  # dual: [block_begin - 1, block_end)


def step(prompt, new, block, mode, shape='diffucoder-7b', weights='bf16'):
    """(rows computed, masked rows whose logits are needed, keys per query, bytes, FLOPs) of a mean step."""
    n_layer, d_model, n_ff, n_head, n_head_kv, head_dim, n_vocab = SHAPES[shape]
    W, masked, L = rows_of(prompt, new, block, mode)
    per_layer_params = 2 * d_model * n_head * head_dim + 2 * d_model * n_head_kv * head_dim + 3 * d_model * n_ff
    layer_params = n_layer * per_layer_params
    head_params = n_vocab * d_model
    flops = 2 * layer_params * W + 2 * head_params * masked + n_layer * 4 * W * L * n_head * head_dim
    weight_bytes = (layer_params + head_params) * WEIGHT_BYTES[weights]  # every matrix read once per forward
    kv = n_layer * 2 * L * n_head_kv * head_dim * 4  # the f32 K/V read by attention (written once per refresh)
    activations = n_layer * W * (6 * d_model + 3 * n_ff) * 4 + masked * n_vocab * 4  # f32 in and out of each op
    return W, masked, L, weight_bytes + kv + activations, flops


def fusion_saving(prompt, new, block, mode, shape='diffucoder-7b'):
    """(f32 bytes, dispatches) per step that the fusions of issue 35 save: the residual add in the o and down
    GEMMs' epilogue (the product no longer written and read back: 2 · hidden floats per row each), SwiGLU in the
    up GEMM's epilogue (up no longer written, read, and the gate read once instead of twice: 2 · FFN), and RoPE +
    the KV-cache store in one pass (k read once instead of twice in the cached modes' kUse steps: KV width)."""
    n_layer, d_model, n_ff, n_head, n_head_kv, head_dim, n_vocab = SHAPES[shape]
    W = rows_of(prompt, new, block, mode)[0]
    kv_width = n_head_kv * head_dim if mode != 'none' else 0
    per_row = 4 * d_model + 2 * n_ff + kv_width
    dispatches = 2 + 1 + (3 if mode != 'none' else 1)  # two adds, the SwiGLU pass, 2 RoPE (+ 2 KV copies) -> 1
    return n_layer * W * per_row * 4, n_layer * dispatches


def gpu_named(name):
    hits = [g for g in GPUS if name.lower() in g.lower() or g.split()[0].lower() in name.lower()]
    if not hits:
        raise SystemExit(f'gpu_roofline: no data sheet for GPU {name!r}; known: {", ".join(GPUS)}')
    return hits[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--prompt', type=int, default=100)
    ap.add_argument('--new', type=int, default=256)
    ap.add_argument('--block', type=int, default=32)
    ap.add_argument('--shape', default='diffucoder-7b', choices=sorted(SHAPES))
    ap.add_argument('--weights', default='bf16', choices=sorted(WEIGHT_BYTES))
    ap.add_argument('--gpu', help='one GPU of the table (a substring of its name, e.g. H100, H200)')
    ap.add_argument('--json', action='store_true', help='with --gpu: the floors per cache mode as JSON')
    ap.add_argument('--fusions', action='store_true', help='the bytes and dispatches the fusions save per step')
    a = ap.parse_args()
    modes = ('none', 'prefix', 'dual')
    if a.json:
        gpu = gpu_named(a.gpu or 'H100')
        bw, peak = GPUS[gpu]
        out = {'gpu': gpu, 'bandwidth_bytes_per_s': bw, 'tensor_peak_flops': peak, 'shape': a.shape, 'weights': a.weights}
        for mode in modes:
            W, masked, L, bytes_, flops = step(a.prompt, a.new, a.block, mode, a.shape, a.weights)
            out[mode] = {'rows': W, 'bytes': bytes_, 'flops': flops, 'memory_floor_ms': bytes_ / bw * 1e3,
                         'compute_floor_ms': flops / peak * 1e3, 'floor_ms': max(bytes_ / bw, flops / peak) * 1e3}
        print(json.dumps(out, indent=2))
        return
    print(f'{a.shape}, {a.weights} weights, 1 row, prompt {a.prompt} + {a.new} new tokens, blocks of {a.block}')
    if a.fusions:
        print('| cache | rows computed | MB of f32 activations saved per step | dispatches saved per step |')
        print('|---|---|---|---|')
        for mode in modes:
            saved, dispatches = fusion_saving(a.prompt, a.new, a.block, mode, a.shape)
            print(f'| {mode} | {rows_of(a.prompt, a.new, a.block, mode)[0]:.0f} | {saved / 1e6:.1f} | {dispatches} |')
        return
    gpus = {g: GPUS[g] for g in ([gpu_named(a.gpu)] if a.gpu else GPUS)}
    print('| cache | rows computed | keys | GB moved | GFLOP | ' + ' | '.join(f'{g} floor ms' for g in gpus) + ' |')
    print('|---|---|---|---|---|' + '---|' * len(gpus))
    for mode in modes:
        W, masked, L, bytes_, flops = step(a.prompt, a.new, a.block, mode, a.shape, a.weights)
        floors = []
        for bw, peak in gpus.values():
            t_mem, t_flop = bytes_ / bw * 1e3, flops / peak * 1e3
            floors.append(f'{max(t_mem, t_flop):.1f} ({"memory" if t_mem >= t_flop else "compute"})')
        print(f'| {mode} | {W:.0f} | {L} | {bytes_ / 1e9:.2f} | {flops / 1e9:.0f} | ' + ' | '.join(floors) + ' |')


if __name__ == '__main__':
    main()
