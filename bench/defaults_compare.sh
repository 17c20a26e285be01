#!/usr/bin/env bash
# What a user gets without flags (BENCHMARKS.md "Defaults and start-up"), side by side in one run:
#  1. qwen2.5-0.5b shape, the issue's setting (prompt 23, 64 new, 64 steps, maskgit_plus, T 0.4, 2 threads):
#     the default (bf16 compute for bf16 weights) against `--precision f32` (the old default), interleaved,
#     and the PyTorch reference in bf16 (its fastest) on the same shape, first steps only;
#  2. the same shape end to end at 256 new / 256 steps (entropy): the default against `--fast`;
#  3. with a DiffuCoder-7B-shaped checkpoint in the Hugging Face layout (bench/make_shape_checkpoint.py),
#     files in the page cache: time to the first step at the first start (packs, writes the packed-weight
#     cache) and at the second (maps it).
# Usage: bench/defaults_compare.sh OUT_DIR [CKPT_7B_DIR]     (BUILD=build, THREADS=2)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/defaults_compare.sh OUT_DIR [CKPT_7B_DIR]}
ckpt=${2:-}
bin=${BUILD:-build}/diffucoder
threads=${THREADS:-2}
mkdir -p "$out"
run() { local name=$1; shift; echo "== $name: $*" >&2; "$@" > "$out/$name.json"; }

small=(bench --shape qwen2.5-0.5b --prompt-len 23 --new-tokens 64 --steps 64 --alg maskgit_plus --temperature 0.4
       --threads "$threads" --no-peak --json)
for rep in 1 2; do
  run "small-default-$rep" "$bin" "${small[@]}"
  run "small-f32-$rep" "$bin" "${small[@]}" --precision f32
done
run small-torch-bf16 /usr/bin/python3 bench/torch_reference.py --shape qwen2.5-0.5b --prompt-len 23 --new-tokens 64 \
    --steps 64 --alg maskgit_plus --dtype bfloat16 --threads "$threads" --max-steps 4 --json

e2e=(bench --shape qwen2.5-0.5b --prompt-len 64 --new-tokens 256 --steps 256 --alg entropy --threads "$threads" --no-peak --json)
run e2e-default "$bin" "${e2e[@]}"
run e2e-fast "$bin" "${e2e[@]}" --fast

if [ -n "$ckpt" ]; then
  rm -f "$ckpt"/diffucoder-packed.*
  cat "$ckpt"/*.safetensors > /dev/null  # the files in the page cache
  big=(bench --model "$ckpt" --prompt-len 7 --new-tokens 64 --steps 64 --alg entropy --threads "$threads" --max-steps 3 --no-peak --json)
  run big-first-start "$bin" "${big[@]}"
  run big-second-start "$bin" "${big[@]}"
  run big-third-start "$bin" "${big[@]}"
fi

/usr/bin/python3 - "$out" <<'EOF'
import json, os, sys
d = sys.argv[1]
def load(n):
    p = os.path.join(d, n + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
print("| run | precision | decoding | ms/step (median) | end to end (s) | tokens/s | time to first step (ms) |")
print("|---|---|---|---|---|---|---|")
for n in ["small-default-1", "small-f32-1", "small-default-2", "small-f32-2", "small-torch-bf16", "e2e-default",
          "e2e-fast", "big-first-start", "big-second-start", "big-third-start"]:
    j = load(n)
    if j is None:
        continue
    ms = j["ms_per_step"]["median"] if isinstance(j.get("ms_per_step"), dict) else j.get("ms_per_step_median", 0)
    dec = "%s / block %s / threshold %s" % (j.get("cache", "none"), j.get("block_length", 0), j.get("threshold", 0))
    print("| %s | %s | %s | %.1f | %.2f | %.2f | %s |" % (n, j.get("precision", j.get("dtype", "")), dec, ms,
          j.get("total_ms", 0) / 1e3, j.get("tokens_per_second", 0),
          "%.0f" % j["time_to_first_forward_ms"] if "time_to_first_forward_ms" in j else ""))
EOF
