#!/usr/bin/env bash
# One GPU session in one command (issue 35 item 6; BENCHMARKS.md "Vulkan backend on an NVIDIA H100"): the
# Vulkan kernel and model tests on the GPU, `bench --device vulkan` on the 7B shape for every row of the issue's
# target table (bf16 dual-cache step, bf16 uncached step, q4 dual-cache step; each with the per-shader GPU
# profile, DC_VULKAN_PROFILE=1), the PyTorch reference (tests/reference/dream_ref.py, full recompute every step,
# bf16 on CUDA) on the same GPU, the bandwidth floors of bench/gpu_roofline.py for that GPU, and one markdown
# table of them all (bench/gpu_table.py: OUT/table.md), and the serving row: `serve --device vulkan` under 1, 4,
# 16 and 64 concurrent streams (bench/serve_streams.sh: generated tokens/s over all requests, p50 / p99 latency)
# with dual-cache requests and with --fast, on a random checkpoint of the shape (bench/make_shape_checkpoint.py,
# written once to SERVE_MODEL_DIR) with the real vocabulary's tokenizer (fixtures/tiny-vocab's).
#
# Usage: bench/gpu_session.sh KIT OUT [STAGES]
#   KIT: a folder with bin/{diffucoder,server_load,test_ops_vulkan,test_model_vulkan}, lib/ (their shared
#        libraries when the GPU machine lacks them) and fixtures/ (the small test checkpoints) — or a build folder
#        (build/diffucoder, build/bench/server_load, build/tests/test_*_vulkan); OUT: where the logs, the JSON and
#        table.md go.
#   STAGES: a comma list of tests,torch,dual,none,q4,serve,prefix (default: all but prefix, which no row needs).
# Before the window opens: `SHAPE=tiny bench/gpu_session.sh build /tmp/gpu_dry` runs the same plumbing on any
# Vulkan device (lavapipe) in a few minutes — the tiny shape, short runs, the reference on the CPU without CUDA —
# and writes a table marked as a plumbing run.
# A KIT from a Release build: cp build/diffucoder build/tests/test_{ops,model}_vulkan KIT/bin; copy what `ldd`
# lists for them but glibc and libstdc++ into KIT/lib; copy build/fixtures' manifest.json, .complete and the
# small tiny-* checkpoints into KIT/fixtures (tiny-vocab's tokenizer.json is the serve stage's; its checkpoint
# writer needs numpy). The GPU machine needs a Vulkan loader (libvulkan.so.1) and its
# GPU's Vulkan driver; the torch stage needs PyTorch with CUDA. NVIDIA's driver (libGLX_nvidia.so.0) also needs
# glvnd's libGLdispatch.so.0 and libGLX.so.0: without them the loader answers VK_ERROR_INCOMPATIBLE_DRIVER, so
# copy them and libvulkan.so.1 into KIT/lib where the machine lacks them, and name the driver's JSON in
# VK_DRIVER_FILES (the workplace's H100: /usr/share/vulkan/icd.d/nvidia_icd.json).
# Knobs: SHAPE (diffucoder-7b), PROMPT (128), NEW (256), BLOCK (32), MAX_STEPS (64: cached modes),
# MAX_STEPS_NONE (16), PRECISION (bench's --precision: f32 keeps the device off its matrix units), GPU (the
# roofline's data sheet: from nvidia-smi's name, H100 when unknown), PYTHON (python3); the serve stage's
# SERVE_NEW (32 new tokens a request, one block), SERVE_LEVELS ("1 4 16 64"; a plumbing run "1 4"),
# SERVE_SECONDS (10 a level; each level also waits for its last answers, bounded by serve_streams.sh's
# LEVEL_LIMIT), SERVE_MODEL_DIR (where the shape's random checkpoint is written, ~15 GB at 7B:
# ${TMPDIR:-/tmp}/dc_serve_SHAPE, reused when there). At 7B the stage costs the checkpoint's writing and two
# loads plus ~2 minutes of load (one dual request alone is SERVE_NEW steps of ~20 ms; its streams do not share
# forwards: each has its own KV cache).
set -u
KIT=$(cd "$1" && pwd); OUT=$2; STAGES=${3:-tests,torch,dual,none,q4,serve}
SHAPE=${SHAPE:-diffucoder-7b} PYTHON=${PYTHON:-python3}
if [[ $SHAPE == diffucoder-7b ]]; then
  PROMPT=${PROMPT:-128} NEW=${NEW:-256} BLOCK=${BLOCK:-32} MAX_STEPS=${MAX_STEPS:-64} MAX_STEPS_NONE=${MAX_STEPS_NONE:-16} T=240
  SERVE_NEW=${SERVE_NEW:-32} SERVE_SECONDS=${SERVE_SECONDS:-10} SERVE_LEVELS=${SERVE_LEVELS:-1 4 16 64}
else  # a plumbing run: short (lavapipe steps the real vocabulary's head in ~1 s: 2 tokens, up to 4 streams)
  PROMPT=${PROMPT:-16} NEW=${NEW:-32} BLOCK=${BLOCK:-16} MAX_STEPS=${MAX_STEPS:-8} MAX_STEPS_NONE=${MAX_STEPS_NONE:-4} T=120
  SERVE_NEW=${SERVE_NEW:-2} SERVE_SECONDS=${SERVE_SECONDS:-1} SERVE_LEVELS=${SERVE_LEVELS:-1 4}
fi
SERVE_MODEL_DIR=${SERVE_MODEL_DIR:-${TMPDIR:-/tmp}/dc_serve_$SHAPE}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$KIT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
stage() { echo "=== $1 ($(date -u +%T))"; }
bin() {  # a kit's bin/NAME, or a build folder's NAME / tests/NAME
  local p
  for p in "$KIT/bin/$1" "$KIT/$1" "$KIT/tests/$1" "$KIT/bench/$1"; do [[ -x $p ]] && { echo "$p"; return; }; done
  echo "$KIT/bin/$1"
}
DC=$(bin diffucoder)

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null ||
  echo "no nvidia-smi"; } | tee "$OUT/gpu.txt"
"$DC" devices 2>&1 | grep -m1 "vulkan:0" | tee -a "$OUT/gpu.txt"
gpu_name=$(head -1 "$OUT/gpu.txt")
GPU=${GPU:-$([[ $gpu_name == *H200* ]] && echo H200 || echo H100)}
for w in bf16 q4; do
  "$PYTHON" "$HERE/gpu_roofline.py" --shape "$SHAPE" --prompt "$PROMPT" --new "$NEW" --block "$BLOCK" --weights $w \
    --gpu "$GPU" --json > "$OUT/roofline_$w.json" || echo "roofline $w failed"
done

if has tests; then
  # The tests read their fixtures from the build folder they were compiled in.
  fixtures=$(strings "$(bin test_model_vulkan)" | grep -m1 -o '/[^ ]*/build/fixtures' || true)
  [[ -n $fixtures && ! -e $fixtures && -d $KIT/fixtures ]] && mkdir -p "$(dirname "$fixtures")" && ln -s "$KIT/fixtures" "$fixtures"
  : > "$OUT/tests.txt"
  for t in test_ops_vulkan test_model_vulkan; do
    stage "$t"
    timeout 240 "$(bin $t)" > "$OUT/$t.log" 2>&1; rc=$?
    echo "$t: rc=$rc, $(grep -E -m1 '^\[  PASSED  \]' "$OUT/$t.log" || echo 'not all passed'), $(grep -c '^\[  FAILED  \]' "$OUT/$t.log") failed lines" |
      tee -a "$OUT/tests.txt"
    grep -E "^\[  FAILED  \]" "$OUT/$t.log" | head -10
  done
fi
if has torch; then
  stage "PyTorch reference, $SHAPE, bf16"
  device=$("$PYTHON" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo none)
  if [[ $device == cuda || ($device == cpu && $SHAPE != diffucoder-7b) ]]; then
    PYTHONUNBUFFERED=1 timeout $T "$PYTHON" "$HERE/torch_reference.py" --shape "$SHAPE" --dtype bfloat16 --device "$device" \
      --prompt-len "$PROMPT" --new-tokens "$NEW" --steps "$NEW" --max-steps "$MAX_STEPS_NONE" --json \
      > "$OUT/torch.json" 2> "$OUT/torch.err"; echo "rc=$?"
  else
    echo "no PyTorch with CUDA ($device): the reference is not run" | tee "$OUT/torch.err"
  fi
fi
# bench NAME CACHE MAX_STEPS [ARGS...]: one row's run, its JSON in OUT/bench_NAME.json and its per-shader GPU
# profile (printed when the device closes) with the progress lines in OUT/bench_NAME.err.
bench() {
  local name=$1 cache=$2 steps=$3; shift 3
  local block=(--block-length "$BLOCK"); [[ $cache == none ]] && block=()
  stage "bench $SHAPE $name (--cache $cache $*)"
  DC_VULKAN_PROFILE=${DC_VULKAN_PROFILE:-1} timeout $T "$DC" bench --shape "$SHAPE" --device vulkan --prompt-len "$PROMPT" \
    --new-tokens "$NEW" --steps "$NEW" --max-steps "$steps" --cache "$cache" "${block[@]}" --no-peak --json \
    --threads "$(nproc)" ${PRECISION:+--precision $PRECISION} "$@" > "$OUT/bench_$name.json" 2> "$OUT/bench_$name.err"
  echo $? > "$OUT/bench_$name.rc"
  echo "rc=$(cat "$OUT/bench_$name.rc")"
  grep -A40 "^DC_VULKAN_PROFILE" "$OUT/bench_$name.err" | head -25
}
has dual && bench dual dual "$MAX_STEPS"
has none && bench none none "$MAX_STEPS_NONE"
has q4 && bench q4 dual "$MAX_STEPS" --weights q4
has prefix && bench prefix prefix "$MAX_STEPS"
# serve_model DIR: the shape's checkpoint with the real vocabulary's tokenizer: at 7B a random one of its shape
# (written once), for a plumbing run tiny-vocab read as 2 heads of 16 (a head size the device's attention takes).
serve_model() {
  local dir=$1 vocab=$KIT/fixtures/tiny-vocab
  [[ -s $dir/config.json && -s $dir/tokenizer.json ]] && return 0
  mkdir -p "$dir"
  if [[ $SHAPE == diffucoder-7b ]]; then
    "$PYTHON" "$HERE/make_shape_checkpoint.py" --shape "$SHAPE" --out "$dir" > /dev/null || return 1
  else
    ln -sf "$vocab"/model.safetensors "$vocab"/generation_config.json "$dir"/ &&
      "$PYTHON" -c 'import json, sys; c = json.load(open(sys.argv[1])); c.update(num_attention_heads=2, num_key_value_heads=1); json.dump(c, open(sys.argv[2], "w"))' \
        "$vocab/config.json" "$dir/config.json" || return 1
  fi
  cp "$vocab/tokenizer.json" "$dir/"
}
if has serve; then
  stage "serve $SHAPE: checkpoint in $SERVE_MODEL_DIR"
  if serve_model "$SERVE_MODEL_DIR"; then
    for mode in dual fast; do
      stage "serve $SHAPE $mode: streams $SERVE_LEVELS"
      request="{\"max_tokens\": $SERVE_NEW, \"steps\": $SERVE_NEW, \"temperature\": 0"
      flags="--device vulkan --threads $(nproc) ${PRECISION:+--precision $PRECISION}"
      [[ $mode == dual ]] && request+=", \"cache\": \"dual\", \"block_length\": $((BLOCK < SERVE_NEW ? BLOCK : SERVE_NEW))"
      [[ $mode == fast ]] && flags+=" --fast"
      SERVE_FLAGS=$flags REQUEST="$request}" LEVELS=$SERVE_LEVELS SECONDS=$SERVE_SECONDS \
        "$HERE/serve_streams.sh" "$DC" "$(bin server_load)" "$SERVE_MODEL_DIR" "$OUT/serve_$mode.json" 2> "$OUT/serve_$mode.err"
      echo "rc=$?"; grep "^streams" "$OUT/serve_$mode.err"
    done
  else
    echo "no checkpoint for the serve stage" | tee "$OUT/serve_dual.err"
  fi
fi
stage "table"
"$PYTHON" "$HERE/gpu_table.py" "$OUT"
stage done
