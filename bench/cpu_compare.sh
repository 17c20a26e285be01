#!/usr/bin/env bash
# The CPU numbers of BENCHMARKS.md in one run: the PyTorch reference and `diffucoder bench` side by side
# on the qwen2.5-0.5b shape (full recompute and the dual cache, f32 and bf16 matmul precision, token drift
# of the cache against full recompute), then the diffucoder-7b shape in bf16 / q8 / q4 with each cache mode
# (committed at its default --refresh-every 4).
# Usage: bench/cpu_compare.sh [OUT_DIR]   (default bench-results/; needs build/diffucoder and Debian torch)
# Env: TORCH_STEPS (reference steps timed, default 8), BIG_STEPS (7B steps timed, default 6), SKIP_7B=1,
# SKIP_SMALL=1 (only the 7B runs).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}
mkdir -p "$out"
bin=build/diffucoder
small=(--shape qwen2.5-0.5b --prompt-len 64 --new-tokens 256 --steps 256 --alg entropy)

run() {  # name, args...: JSON to $out/name.json, the table line to stdout
  local name=$1; shift
  echo "== $name: $*" >&2
  "$@" > "$out/$name.json"
}

if [[ "${SKIP_SMALL:-0}" != 1 ]]; then
  # PyTorch reference: every step costs one full forward, so a few steps extrapolate exactly.
  for dtype in float32 bfloat16; do
    run torch-$dtype /usr/bin/python3 bench/torch_reference.py --shape qwen2.5-0.5b --prompt-len 64 \
      --new-tokens 256 --steps 256 --alg entropy --dtype $dtype --max-steps "${TORCH_STEPS:-8}" --json
  done
  for precision in f32 bf16; do
    run dc-none-$precision $bin bench "${small[@]}" --precision $precision --json
    run dc-dual-$precision $bin bench "${small[@]}" --precision $precision --cache dual --block-length 32 --json
    run dc-prefix-$precision $bin bench "${small[@]}" --precision $precision --cache prefix --block-length 32 --json
  done
fi

if [[ "${SKIP_7B:-0}" != 1 ]]; then
  big=(--shape diffucoder-7b --prompt-len 64 --new-tokens 256 --steps 256 --alg entropy --precision bf16
       --max-steps "${BIG_STEPS:-6}" --no-peak)
  for weights in bf16 q8 q4; do
    for cache in none prefix dual committed; do
      blk=(); [[ $cache != none ]] && blk=(--block-length 32)
      run 7b-$weights-$cache $bin bench "${big[@]}" --weights $weights --cache $cache "${blk[@]}" --json
    done
  done
fi

/usr/bin/python3 - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
R = {os.path.basename(f)[:-5]: json.load(open(f)) for f in glob.glob(os.path.join(out, "*.json"))}
def drift(a, b):
    x, y = R[a]["generated"], R[b]["generated"]
    n = sum(len(r) for r in x)
    return sum(p != q for r, s in zip(x, y) for p, q in zip(r, s)) / n if n else float("nan")
print("| run | ms/step median (p10-p90) | rows/step | end to end s | tokens/s | GFLOP/s | % of peak | peak RSS GB |")
print("|---|---|---|---|---|---|---|---|")
for k in sorted(R):
    j = R[k]
    if k.startswith("torch"):
        print(f"| {k} | {j['ms_per_step_median']:.1f} | | {j['total_ms']/1e3:.1f} (extrapolated) | "
              f"{j['tokens_per_second']:.2f} | | | {j.get('peak_rss_bytes', 0)/1e9:.2f} |")
        continue
    m = j["ms_per_step"]
    print(f"| {k} | {m['median']:.1f} ({m['p10']:.1f}-{m['p90']:.1f}) | {j['rows_per_step']:.1f} | {j['total_ms']/1e3:.1f}"
          f"{' (extrapolated)' if j['total_extrapolated'] else ''} | {j['tokens_per_second']:.2f} | "
          f"{j['achieved_gflops']:.0f} | {100*j['fraction_of_peak']:.0f} | {j['peak_rss_bytes']/1e9:.2f} |")
for p in ("f32", "bf16") if any(k.startswith("torch") for k in R) else ():
    best_torch = min(R[k]["total_ms"] for k in R if k.startswith("torch"))
    none, dual, prefix = R[f"dc-none-{p}"], R[f"dc-dual-{p}"], R[f"dc-prefix-{p}"]
    print(f"\nprecision {p}: full recompute {best_torch/none['total_ms']:.2f}x faster than the fastest torch run; "
          f"dual {none['total_ms']/dual['total_ms']:.2f}x and prefix {none['total_ms']/prefix['total_ms']:.2f}x "
          f"faster than full recompute; tokens differing from --cache none: dual {100*drift(f'dc-dual-{p}', f'dc-none-{p}'):.1f}%, "
          f"prefix {100*drift(f'dc-prefix-{p}', f'dc-none-{p}'):.1f}%")
if all(f"7b-{w}-dual" in R for w in ("bf16", "q8", "q4")):
    ms = {w: R[f"7b-{w}-dual"]["ms_per_step"]["median"] for w in ("bf16", "q8", "q4")}
    print(f"\n7B --cache dual median ms/step: bf16 {ms['bf16']:.0f}, q8 {ms['q8']:.0f}, q4 {ms['q4']:.0f}; "
          f"q8 {ms['bf16']/ms['q8']:.2f}x bf16, q4 {ms['q8']/ms['q4']:.2f}x q8")
EOF
