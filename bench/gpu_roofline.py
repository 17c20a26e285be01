#!/usr/bin/env python3
"""Bytes moved, FLOPs and the roofline floor of one DiffuCoder-7B denoising step per cache mode, on a few
GPUs from their memory bandwidth and bf16 tensor peak (BENCHMARKS.md "Vulkan backend"). A model, not a
measurement: no GPU was available when it was written. Usage: bench/gpu_roofline.py [--prompt P] [--new G]"""
import argparse

# DiffuCoder-7B / Dream-7B (Qwen2.5-7B shape), bf16 weights.
N_LAYER, D_MODEL, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM, N_VOCAB = 28, 3584, 18944, 28, 4, 128, 152064
WEIGHT_BYTES = 2
# name: (memory bandwidth bytes/s, dense bf16 tensor peak with f32 accumulation FLOP/s), vendor data sheets
GPUS = {
    'H100 SXM (H800: same HBM3 and tensor peak)': (3.35e12, 989e12),
    'RTX 4090': (1.008e12, 165e12),
    'RX 7900 XTX': (0.96e12, 123e12),
}


def step(prompt, new, block, mode):
    """(rows computed, masked rows whose logits are needed, keys per query, bytes, FLOPs) of a mean step."""
    L = prompt + new
    n_blocks = new // block
    # Rows the forward computes (W) and the masked rows needing the lm_head (about half the candidates
    # on average over a block's or the canvas's steps).
    if mode == 'none':  # every step a full forward over the canvas (the reference)
        W, masked = L, new / 2
    elif mode == 'prefix':  # [block_begin - 1, L), mean over the blocks
        W = sum(L - (prompt + b * block) + 1 for b in range(n_blocks)) / n_blocks
        masked = block / 2
    else:  # dual: [block_begin - 1, block_end)
        W, masked = block + 1, block / 2
    per_layer_params = 2 * D_MODEL * D_MODEL + 2 * D_MODEL * N_HEAD_KV * HEAD_DIM + 3 * D_MODEL * N_FF
    layer_params = N_LAYER * per_layer_params
    head_params = N_VOCAB * D_MODEL
    flops = 2 * layer_params * W + 2 * head_params * masked + N_LAYER * 4 * W * L * N_HEAD * HEAD_DIM
    weights = (layer_params + head_params) * WEIGHT_BYTES  # every matrix read once per forward
    kv = N_LAYER * 2 * L * N_HEAD_KV * HEAD_DIM * 4  # the f32 K/V read by attention (written once per refresh)
    activations = N_LAYER * W * (6 * D_MODEL + 3 * N_FF) * 4 + masked * N_VOCAB * 4  # f32 in and out of each op
    return W, masked, L, weights + kv + activations, flops


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--prompt', type=int, default=100)
    ap.add_argument('--new', type=int, default=256)
    ap.add_argument('--block', type=int, default=32)
    a = ap.parse_args()
    print(f'DiffuCoder-7B, bf16 weights, 1 row, prompt {a.prompt} + {a.new} new tokens, blocks of {a.block}')
    print('| cache | rows computed | keys | GB moved | GFLOP | ' + ' | '.join(f'{g} floor ms' for g in GPUS) + ' |')
    print('|---|---|---|---|---|' + '---|' * len(GPUS))
    for mode in ('none', 'prefix', 'dual'):
        W, masked, L, bytes_, flops = step(a.prompt, a.new, a.block, mode)
        floors = []
        for bw, peak in GPUS.values():
            t_mem, t_flop = bytes_ / bw * 1e3, flops / peak * 1e3
            floors.append(f'{max(t_mem, t_flop):.1f} ({"memory" if t_mem >= t_flop else "compute"})')
        print(f'| {mode} | {W:.0f} | {L} | {bytes_ / 1e9:.2f} | {flops / 1e9:.0f} | ' + ' | '.join(floors) + ' |')


if __name__ == '__main__':
    main()
