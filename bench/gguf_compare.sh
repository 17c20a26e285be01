#!/usr/bin/env bash
# The GGUF numbers of BENCHMARKS.md ("GGUF") for one checkpoint directory (a random one of a real shape,
# bench/make_shape_checkpoint.py): our q8 / q4 conversions and a GGUF of every type our converter writes
# (F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K), each timed with `diffucoder bench` (prompt 64, 256 new tokens,
# entropy, batch 1, full recompute, bf16 matmul precision, a few timed steps, peak RSS by /usr/bin/time),
# then the logit error of each against the directory (build/bench/logit_error). One converted model on
# disk at a time (each is deleted after its runs), so the disk holds the directory plus one model.
# Usage: bench/gguf_compare.sh CHECKPOINT_DIR OUT_DIR
# Env: STEPS (timed steps, default 4), TYPES (default "bf16-dir q8 q4 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k"),
# THREADS (default 0: all), LOCK (a file to flock around each run, e.g. /work/notes/bigmem.lock for 7B),
# BIN (the diffucoder binary, default build/diffucoder: give a copy when rebuilding meanwhile), PEER (another
# diffucoder binary, e.g. main's: each model is also timed with it right after, into TYPE.peer.json / .time).
# LOGIT_ERROR (the logit_error binary, default build/bench/logit_error).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$1
out=$2
mkdir -p "$out"
bin=${BIN:-build/diffucoder}
threads=${THREADS:-0}
locked() { if [[ -n "${LOCK:-}" ]]; then flock "$LOCK" "$@"; else "$@"; fi; }
# timed BINARY MODEL PREFIX: the bench run, its JSON to PREFIX.json and /usr/bin/time's report to PREFIX.time.
timed() {
  locked /usr/bin/time -v -o "$3.time" "$1" bench --model "$2" --prompt-len 64 --new-tokens 256 --steps 256 \
    --alg entropy --precision bf16 --max-steps "${STEPS:-4}" --no-peak --weight-cache off --threads "$threads" \
    --json > "$3.json"
}
for type in ${TYPES:-bf16-dir q8 q4 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k}; do
  case $type in
    bf16-dir) model=$src ;;
    q8|q4) model=$out/model-$type; locked $bin convert --model "$src" --out "$model" --weights $type --force --quiet \
             --threads "$threads" ;;
    *) model=$out/model-$type.gguf; locked $bin convert --model "$src" --out "$model" --weights $type --force --quiet \
         --threads "$threads" ;;
  esac
  echo "== $type ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  timed "$bin" "$model" "$out/$type"
  if [[ -n "${PEER:-}" ]]; then
    echo "== $type, peer $PEER ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    timed "$PEER" "$model" "$out/$type.peer"
  fi
  if [[ $type != bf16-dir ]]; then
    locked "${LOGIT_ERROR:-build/bench/logit_error}" --reference "$src" --model "$model" --threads "$threads" > "$out/$type.error.json"
    rm -rf "$model"
  fi
done
