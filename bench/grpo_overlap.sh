#!/usr/bin/env bash
# One Coupled-GRPO round of `diffucoder grpo` with the rewards overlapped (the default) against
# --no-overlap-rewards, alternating in one machine state: the round's wall time (its two steps' "seconds") and
# its parts from metrics.jsonl. Usage:
#   bench/grpo_overlap.sh BIN MODEL_DIR DATA.jsonl [RUNS (5)] [extra grpo flags...]
# e.g. on the GRPO learning test's SFT checkpoint (build/tests/grpo_learning, made by
# `ctest -R GrpoLearningTest.SftCheckpoint`):
#   bench/grpo_overlap.sh build/diffucoder build/tests/grpo_learning/sft/checkpoint-000150 \
#     build/tests/grpo_learning/train.jsonl 5 --generation-batch-size 8
set -euo pipefail
bin=$1 model=$2 data=$3 runs=${4:-5}
shift $(( $# < 4 ? $# : 4 ))
out=$(mktemp -d /tmp/grpo_overlap.XXXXXX)
trap 'rm -rf "$out"' EXIT
for ((i = 0; i < runs; ++i)); do
  for mode in overlapped sequential; do
    flag=""
    [[ $mode == sequential ]] && flag=--no-overlap-rewards
    rm -rf "$out/run"
    "$bin" grpo --model "$model" --data "$data" --out "$out/run" --num-generations 8 --prompts-per-round 3 --steps 2 \
      --max-completion-length 20 --diffusion-steps 10 --lr 1e-3 --lr-schedule constant --warmup-ratio 0 \
      --weight-decay 0 --max-grad-norm 1 --precision f32 --threads 2 --quiet --exit-after-step 2 $flag "$@" \
      > /dev/null 2> "$out/log" || true
    if [[ $(wc -l < "$out/run/metrics.jsonl" 2>/dev/null || echo 0) != 2 ]]; then cat "$out/log" >&2; exit 1; fi
    /usr/bin/python3 - "$out/run/metrics.jsonl" "$mode" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
r = m[0]
print(f"{sys.argv[2]:<10} round {sum(x['seconds'] for x in m):6.2f} s  rollout {r['rollout_seconds']:5.2f}  "
      f"(generate {r['generate_seconds']:5.2f})  log-probs+wait {r['score_seconds']:5.2f}  rewards {r['reward_seconds']:5.2f} "
      f"(waited {r['reward_wait_seconds']:5.2f})  steps {sum(x['train_seconds'] for x in m):5.2f}  "
      f"reward_mean {r['reward_mean']:.4f}")
PY
  done
done
