#!/usr/bin/env python3
"""The target table of issue 35 from one bench/gpu_session.sh call: reads OUT/{roofline_bf16,roofline_q4,
bench_dual,bench_none,bench_q4,torch,serve_dual,serve_fast}.json and OUT/{gpu,tests}.txt, writes OUT/table.md
(and prints it).
A missing or failed run leaves its row open ("not measured"); a shape other than diffucoder-7b is a plumbing
check whose rows are never called met. Usage: bench/gpu_table.py OUT"""
import json
import os
import sys


def load(out, name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def text(out, name):
    try:
        with open(os.path.join(out, name)) as f:
            return f.read().strip()
    except OSError:
        return ''


def median(bench):
    return bench['ms_per_step']['median'] if bench and bench.get('steps_run', 0) > 0 else None


def serve_levels(serve):
    """{streams: server_load's summary} of a serve_streams.sh run's levels that ran without a failed request."""
    return {l['clients']: l for l in (serve or {}).get('levels', [])
            if l.get('rc') == 0 and l.get('failed') == 0 and l.get('tokens_per_second', 0) > 0}


def verdict(ok, real):
    if ok is None:
        return 'open (not measured)'
    if not real:
        return 'open (plumbing run)'
    return 'met' if ok else 'NOT met'


def main():
    out = sys.argv[1]
    roof, roof_q4 = load(out, 'roofline_bf16.json'), load(out, 'roofline_q4.json')
    dual, none, q4, torch = load(out, 'bench_dual.json'), load(out, 'bench_none.json'), load(out, 'bench_q4.json'), load(out, 'torch.json')
    shape = (roof or {}).get('shape', '?')
    real = shape == 'diffucoder-7b'
    gpu = (roof or {}).get('gpu', '?')
    lines = [f'# Issue 35 targets: one gpu_session.sh call ({shape} shape)', '',
             'Device: ' + (text(out, 'gpu.txt').replace('\n', '; ') or 'unknown'),
             f'Floors: bench/gpu_roofline.py for {gpu} (data sheet bandwidth and dense bf16 tensor peak; the GPU from '
             "nvidia-smi's name, the H100's data sheet when it is not one the script knows)."]
    if not real:
        lines.append('**Plumbing run** (not the 7B shape): the numbers check the script, they measure nothing.')
    lines += ['', '| row | ours ms/step | floor ms | PyTorch reference ms/step | measured | target | verdict |',
              '|---|---|---|---|---|---|---|']
    fmt = lambda v: f'{v:.4g}' if v is not None else '—'
    label = '7B' if real else shape
    # 1. bf16 dual-cache step against its bandwidth floor.
    ours, floor = median(dual), roof and roof['dual']['floor_ms']
    ratio = ours / floor if ours and floor else None
    lines.append(f'| {label} bf16 dual-cache step | {fmt(ours)} | {fmt(floor)} | — (no cache in the reference) | '
                 f'{fmt(ratio)}x the floor | <= 1.3x the floor | {verdict(None if ratio is None else ratio <= 1.3, real)} |')
    # 2. bf16 uncached step: share of the matrix units' peak and speed-up over the reference.
    ours, ref = median(none), torch and torch.get('ms_per_step_median')
    share = roof['none']['flops'] / (ours * 1e-3) / roof['tensor_peak_flops'] if ours and roof else None
    speedup = ref / ours if ours and ref else None
    ok = None if share is None or speedup is None else share >= 0.5 and speedup >= 1.8
    lines.append(f'| {label} bf16 uncached step | {fmt(ours)} | {fmt(roof and roof["none"]["floor_ms"])} | {fmt(ref)} | '
                 f'{"—" if share is None else f"{100 * share:.0f} %"} of the tensor peak, '
                 f'{"—" if speedup is None else f"{speedup:.2f}x"} the reference | >= 50 % of the peak and >= 1.8x the reference | '
                 f'{verdict(ok, real)} |')
    # 3. q4 dual-cache step against its bandwidth floor.
    ours, floor = median(q4), roof_q4 and roof_q4['dual']['floor_ms']
    ratio = ours / floor if ours and floor else None
    lines.append(f'| {label} q4 dual-cache step | {fmt(ours)} | {fmt(floor)} | — | {fmt(ratio)}x the floor | <= 1.5x the floor | '
                 f'{verdict(None if ratio is None else ratio <= 1.5, real)} |')
    # 4. serving: generated tokens/s of 16 concurrent dual-cache streams against one stream's.
    serve = {mode: load(out, f'serve_{mode}.json') for mode in ('dual', 'fast')}
    levels = serve_levels(serve['dual'])
    ratio = levels[16]['tokens_per_second'] / levels[1]['tokens_per_second'] if 1 in levels and 16 in levels else None
    lines.append(f'| serving 16 concurrent streams, {label} bf16 dual | '
                 f'{fmt(levels[16]["tokens_per_second"]) if 16 in levels else "—"} tokens/s | — | — | '
                 f'{fmt(ratio)}x one stream | >= 8x the tokens/s of one stream | '
                 f'{verdict(None if ratio is None else ratio >= 8, real)} |')
    lines += ['', '| run | submits / step | dispatches / step | host ms collecting / step | rc |', '|---|---|---|---|---|']
    for name, b in (('dual', dual), ('none', none), ('q4', q4)):
        w = (b or {}).get('device_work_per_step') or {}
        rc = text(out, f'bench_{name}.rc') or '—'
        lines.append(f'| {name} | {w.get("submits", "—")} | {w.get("dispatches_run", "—")} | '
                     f'{fmt(w.get("collect_ms"))} | {rc} |')
    lines += ['', '| serve --device vulkan | streams | tokens/s | requests | failed | p50 ms | p99 ms | rc |',
              '|---|---|---|---|---|---|---|---|']
    for mode, run in serve.items():
        for l in (run or {}).get('levels', []) or [{}]:
            lines.append(f'| {mode} | {l.get("clients", "—")} | {fmt(l.get("tokens_per_second"))} | '
                         f'{l.get("requests", "—")} | {l.get("failed", "—")} | {fmt(l.get("latency_ms_p50"))} | '
                         f'{fmt(l.get("latency_ms_p99"))} | {l.get("rc", "not run")} |')
    tests = text(out, 'tests.txt')
    lines += ['', 'Tests: ' + (tests.replace('\n', '; ') if tests else 'not run'),
              'Per-shader GPU time (DC_VULKAN_PROFILE=1): OUT/bench_{dual,none,q4}.err; the servers\' logs: '
              'OUT/serve_{dual,fast}.err.']
    table = '\n'.join(lines) + '\n'
    with open(os.path.join(out, 'table.md'), 'w') as f:
        f.write(table)
    print(table, end='')


if __name__ == '__main__':
    main()
