#!/usr/bin/env bash
# Training throughput, C++ against the PyTorch reference in one run: `diffucoder bench --train` and
# bench/torch_train_reference.py back to back (never at the same time) on one shape, then the ratios.
# Usage: bench/train_compare.sh [OUT_DIR]   (default bench-results/train; needs Debian's torch)
# Env: BIN (default build/diffucoder), SHAPE (qwen2.5-0.5b), SEQ (256), BATCH (1), STEPS (3 timed + 1
# warm-up), THREADS (2), TORCH_RUNS ("bfloat16:masked float32:masked": lm_head on the loss rows, the same
# work as ours; add bfloat16:all / float32:all for the upstream code as written, which runs lm_head on
# every position and is labelled so).
# BASE_BIN (unset): another build of diffucoder (e.g. the parent commit's) run in bf16 mode first, as
# `dc-base-bf16`, so that a change is measured side by side with its baseline in the same run.
# Ours runs in both modes: bf16 mixed precision (the training default) and f32.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/train}
mkdir -p "$out"
bin=${BIN:-build/diffucoder}
common=(--shape "${SHAPE:-qwen2.5-0.5b}" --seq-len "${SEQ:-256}" --prompt-len 64 --batch "${BATCH:-1}"
        --steps "${STEPS:-3}" --threads "${THREADS:-2}" --mask-ratio 0.5)

run() {  # name, args...: JSON to $out/name.json, stderr to $out/name.log, the load average before it
  local name=$1; shift
  echo "== $name: $*   [$(uptime | sed 's/.*load average/load average/')]" >&2
  echo "$(date -Is) $(uptime)" > "$out/$name.load"
  "$@" > "$out/$name.json" 2> "$out/$name.log"
}

rm -f "$out"/*.json
if [[ -n "${BASE_BIN:-}" ]]; then run dc-base-bf16 "$BASE_BIN" bench --train "${common[@]}" --precision bf16 --json; fi
run dc-bf16 "$bin" bench --train "${common[@]}" --precision bf16 --json
run dc-f32 "$bin" bench --train "${common[@]}" --precision f32 --json
for variant in ${TORCH_RUNS:-bfloat16:masked float32:masked}; do
  dtype=${variant%%:*} logits=${variant##*:}
  run "torch-$dtype-$logits" /usr/bin/python3 bench/torch_train_reference.py "${common[@]}" --dtype "$dtype" \
    --logits "$logits" --json
done

/usr/bin/python3 - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
R = {os.path.basename(f)[:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, "*.json")))}
print("| run | s/step median (min) | fwd+bwd s | optimizer s | tokens/s | fwd+bwd GFLOP/s (fwd / bwd) | of bf16 peak | peak RSS GB | losses |")
print("|---|---|---|---|---|---|---|---|---|")
for k, j in R.items():
    s = j["seconds_per_step"]
    split = f" ({j['forward_gflops_median']:.0f} / {j['backward_gflops_median']:.0f})" if "forward_gflops_median" in j else ""
    label = k + (" (upstream as written: lm_head on every position)" if k.endswith("-all") else "")
    print(f"| {label} | {s['median']:.2f} ({s['min']:.2f}) | {j['fwd_bwd_s_median']:.2f} | {j['optimizer_s_median']:.2f} | "
          f"{j['tokens_per_second']:.1f} | {j['fwd_bwd_gflops_median']:.0f}{split} | "
          + (f"{100 * j['fraction_of_peak']:.0f} % of {j['peak_gemm_gflops']:.0f}" if j.get("peak_gemm_gflops") else "") +
          f" | {j['peak_rss_bytes']/1e9:.2f} | "
          + ", ".join(f"{x:.3f}" for x in j["losses"]) + " |")
torch_runs = {k: j["tokens_per_second"] for k, j in R.items() if k.startswith("torch") and k.endswith("-masked")}
print()
for mine in ("dc-base-bf16", "dc-bf16", "dc-f32"):
    if mine not in R:
        continue
    dc = R[mine]["tokens_per_second"]
    for k, v in torch_runs.items():
        print(f"{mine} / {k} (same work): {dc / v:.2f}x")
EOF
