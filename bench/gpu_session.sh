#!/usr/bin/env bash
# One GPU session in one command (BENCHMARKS.md "Vulkan backend on an NVIDIA H100"): the Vulkan kernel and
# model tests on the GPU, `bench --device vulkan` on the 7B shape in each cache mode, and the PyTorch
# reference (tests/reference/dream_ref.py, full recompute every step, bf16) on the same GPU through CUDA.
#
# Usage: bench/gpu_session.sh KIT OUT [STAGES]
#   KIT: a folder with bin/{diffucoder,test_ops_vulkan,test_model_vulkan}, lib/ (their shared libraries when the
#        GPU machine lacks them) and fixtures/ (the small test checkpoints); OUT: where the logs go.
#   STAGES: a comma list of tests,tiny,torch,dual,prefix,none (default: all).
# A KIT from a Release build: cp build/diffucoder build/tests/test_{ops,model}_vulkan KIT/bin; copy what `ldd`
# lists for them but glibc and libstdc++ into KIT/lib; copy build/fixtures' manifest.json, .complete and the
# small tiny-* checkpoints into KIT/fixtures. The GPU machine needs a Vulkan loader (libvulkan.so.1) and its
# GPU's Vulkan driver; the torch stage needs PyTorch with CUDA. NVIDIA's driver (libGLX_nvidia.so.0) also needs
# glvnd's libGLdispatch.so.0 and libGLX.so.0: without them the loader answers VK_ERROR_INCOMPATIBLE_DRIVER, so
# copy them and libvulkan.so.1 into KIT/lib where the machine lacks them, and name the driver's JSON in
# VK_DRIVER_FILES (the workplace's H100: /usr/share/vulkan/icd.d/nvidia_icd.json).
# Knobs: PROMPT (128), NEW (256), BLOCK (32), MAX_STEPS (64: cached modes), MAX_STEPS_NONE (16), PRECISION
# (bench's --precision: f32 keeps the device off its matrix units).
set -u
KIT=$(cd "$1" && pwd); OUT=$2; STAGES=${3:-tests,tiny,torch,dual,prefix,none}
PROMPT=${PROMPT:-128} NEW=${NEW:-256} BLOCK=${BLOCK:-32} MAX_STEPS=${MAX_STEPS:-64} MAX_STEPS_NONE=${MAX_STEPS_NONE:-16}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$KIT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
stage() { echo "=== $1 ($(date -u +%T))"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"
"$KIT/bin/diffucoder" devices 2>&1 | tee -a "$OUT/gpu.txt"

if has tests; then
  # The tests read their fixtures from the build folder they were compiled in.
  fixtures=$(strings "$KIT/bin/test_model_vulkan" | grep -m1 -o '/[^ ]*/build/fixtures' || true)
  [[ -n $fixtures && ! -e $fixtures ]] && mkdir -p "$(dirname "$fixtures")" && ln -s "$KIT/fixtures" "$fixtures"
  stage "test_ops_vulkan"
  timeout 180 "$KIT/bin/test_ops_vulkan" > "$OUT/test_ops_vulkan.log" 2>&1; echo "rc=$?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/test_ops_vulkan.log" | head -20
  stage "test_model_vulkan"
  timeout 240 "$KIT/bin/test_model_vulkan" > "$OUT/test_model_vulkan.log" 2>&1; echo "rc=$?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/test_model_vulkan.log" | head -20
fi
if has tiny; then
  stage "bench tiny"
  timeout 60 "$KIT/bin/diffucoder" bench --shape tiny --device vulkan --prompt-len 16 --new-tokens 64 --steps 64 \
    --cache dual --block-length 32 --no-peak 2>&1 | tail -25
fi
if has torch; then
  stage "PyTorch reference, 7B shape, bf16 on CUDA"
  PYTHONUNBUFFERED=1 timeout 240 python3 bench/torch_reference.py --shape diffucoder-7b --dtype bfloat16 --device cuda \
    --prompt-len "$PROMPT" --new-tokens "$NEW" --steps "$NEW" --max-steps "$MAX_STEPS_NONE" --json \
    > "$OUT/torch_7b.json" 2> "$OUT/torch_7b.err"; echo "rc=$?"
  cat "$OUT/torch_7b.json"
fi
for cache in dual prefix none; do
  has $cache || continue
  steps=$MAX_STEPS; [[ $cache == none ]] && steps=$MAX_STEPS_NONE
  block=(--block-length "$BLOCK"); [[ $cache == none ]] && block=()
  stage "bench 7B --cache $cache"
  # DC_VULKAN_PROFILE: the GPU time of every shader (2: and grid), printed when the device closes.
  DC_VULKAN_PROFILE=${DC_VULKAN_PROFILE:-1} timeout 240 "$KIT/bin/diffucoder" bench --shape diffucoder-7b --device vulkan --prompt-len "$PROMPT" \
    --new-tokens "$NEW" --steps "$NEW" --max-steps "$steps" --cache $cache "${block[@]}" --no-peak --threads "$(nproc)" \
    ${PRECISION:+--precision $PRECISION} > "$OUT/bench_7b_$cache.txt" 2>&1; echo "rc=$?"
  grep -v "^bench: step" "$OUT/bench_7b_$cache.txt"
done
stage done
