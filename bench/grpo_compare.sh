#!/usr/bin/env bash
# One Coupled-GRPO round, `diffucoder grpo` against the PyTorch reference (bench/torch_grpo_reference.py)
# in one run, back to back (never at the same time), on a random checkpoint of a real shape: rollout /
# rewards / old + reference log-probs / each optimizer step (loss + backward + clip + AdamW), peak memory.
# Usage: bench/grpo_compare.sh [OUT_DIR]   (default bench-results/grpo; needs Debian's torch; several GB:
#        run it under `flock /work/notes/bigmem.lock` on a shared machine)
# Env: BIN (build/diffucoder), SHAPE (qwen2.5-0.5b), G (10), NEW (256 new tokens), K (decoding steps run;
# default 256 = the recipe; fewer decode the same 256 tokens in K steps and both sides' rollout time is
# multiplied by 256 / K), ACC (grad accumulation, 2 = the recipe), THREADS (2), TOKENIZER (the tiny-vocab
# fixture's DiffuCoder tokenizer.json), SIDES ("dc torch": which sides run; the table reads both sides'
# results from OUT_DIR, so one side can be re-run alone, e.g. after it was killed).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/grpo}
mkdir -p "$out"
bin=${BIN:-build/diffucoder}
shape=${SHAPE:-qwen2.5-0.5b} G=${G:-10} new=${NEW:-256} k=${K:-256} acc=${ACC:-2} threads=${THREADS:-2}
tokenizer=${TOKENIZER:-build/fixtures/tiny-vocab/tokenizer.json}

model="$out/model-$shape"
if [[ ! -f "$model/config.json" ]]; then
  /usr/bin/python3 bench/make_shape_checkpoint.py --shape "$shape" --out "$model" --shards 1
fi
cp "$tokenizer" "$model/tokenizer.json"
question="Write a Python function add_lists(a, b) that returns the element-wise sums of two equal-length lists of integers, raising ValueError when their lengths differ."
printf '{"prompt": "%s", "tests": ["assert add_lists([1], [2]) == [3]", "assert add_lists([], []) == []"]}\n' \
  "$question" > "$out/data.jsonl"

prompt_ids=$("$bin" tokenize --model "$model" --text "$(printf '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$question")")

if [[ " ${SIDES:-dc torch} " == *" dc "* ]]; then
echo "== diffucoder grpo [$(uptime | sed 's/.*load average/load average/')]" >&2
rm -rf "$out/dc-run"
# Two optimizer steps = one round; --exit-after-step 2 ends the process right after the second step's
# metrics line, before the final checkpoint (GBs of disk writes that are no part of a step). The rewards are
# scored before the log-probs (--no-overlap-rewards), so that each part's seconds are its own.
/usr/bin/time -v "$bin" grpo --model "$model" --data "$out/data.jsonl" --out "$out/dc-run" --num-generations "$G" \
  --max-completion-length "$new" --diffusion-steps "$k" --grad-accum "$acc" --steps 2 --threads "$threads" \
  --no-overlap-rewards --exit-after-step 2 2> "$out/dc.log" || true
if [[ $(wc -l < "$out/dc-run/metrics.jsonl" 2>/dev/null || echo 0) != 2 ]]; then
  echo "diffucoder grpo did not finish its two steps (killed? out of memory?):" >&2; tail -n 30 "$out/dc.log" >&2; exit 1
fi
fi

if [[ " ${SIDES:-dc torch} " == *" torch "* ]]; then
echo "== PyTorch reference [$(uptime | sed 's/.*load average/load average/')]" >&2
/usr/bin/time -v /usr/bin/python3 bench/torch_grpo_reference.py --shape "$shape" --tokenizer "$tokenizer" \
  --prompt-ids "$prompt_ids" --group "$G" --new-tokens "$new" --steps "$k" --grad-accum "$acc" --threads "$threads" \
  --json > "$out/torch.json" 2> "$out/torch.log"
fi

/usr/bin/python3 - "$out" "$k" "$new" <<'EOF'
import json, re, sys
out, k, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = [json.loads(l) for l in open(f"{out}/dc-run/metrics.jsonl")]
log = open(f"{out}/dc.log").read()
peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log).group(1)) * 1024
scale = 256 / k
dc = dict(rollout=m[0]["generate_seconds"] * scale, rewards=m[0]["reward_seconds"], logps=m[0]["score_seconds"],
          steps=[x["train_seconds"] for x in m], peak=peak)
tj = json.load(open(f"{out}/torch.json"))
pt = dict(rollout=tj["rollout_s"], rewards=tj["rewards_s"], logps=tj["logps_s"], steps=tj["train_step_s"],
          peak=tj["peak_rss_bytes"])
print(f"one round: G = {tj['group']}, prompt {tj['prompt_len']} + {new} new tokens, {k} of 256 decoding steps run "
      f"(rollout x {scale:g}), grad accumulation {tj['grad_accum']}, {tj['num_iterations']} optimizer steps; "
      f"ours bf16 mixed precision, PyTorch {tj['dtype']} autocast")
print("| side | rollout s (256 steps) | rewards s | old + ref log-probs s | optimizer steps s | round s | per optimizer step s | peak RSS GB |")
print("|---|---|---|---|---|---|---|---|")
for name, r in (("diffucoder grpo", dc), ("PyTorch reference", pt)):
    total = r["rollout"] + r["rewards"] + r["logps"] + sum(r["steps"])
    r["total"] = total
    print(f"| {name} | {r['rollout']:.1f} | {r['rewards']:.3f} | {r['logps']:.1f} | "
          + " + ".join(f"{s:.1f}" for s in r["steps"]) + f" | {total:.1f} | {total / len(r['steps']):.1f} | {r['peak'] / 1e9:.2f} |")
print()
print(f"speed-up per round (and so per optimizer step): {pt['total'] / dc['total']:.2f}x; rollout {pt['rollout'] / dc['rollout']:.2f}x, "
      f"log-probs {pt['logps'] / dc['logps']:.2f}x, optimizer steps {sum(pt['steps']) / sum(dc['steps']):.2f}x")
print(f"mean reward: ours {m[0]['reward_mean']:.3f}, PyTorch {tj['reward_mean']:.3f} (random weights: no completion has the format)")
EOF
