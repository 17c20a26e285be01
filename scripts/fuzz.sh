#!/usr/bin/env bash
# Builds the libFuzzer targets (safetensors + config parsers, the GGUF reader, tokenizer encode, tokenizer.json structure,
# the OpenAI request parser) with clang and runs each for SECONDS (default 30), seeded from
# tests/fuzz/seeds/<target>/ when that exists. Usage: scripts/fuzz.sh [SECONDS | --build-only]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
command -v clang++ >/dev/null || { echo "fuzz: clang++ is needed (apt-get install clang)" >&2; exit 1; }
# (a fresh build directory with Ninja when it is installed, as scripts/test.sh does)
gen=(); [ ! -f build-fuzz/CMakeCache.txt ] && command -v ninja >/dev/null && gen=(-GNinja)
CC=clang CXX=clang++ cmake -S . -B build-fuzz "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDC_BUILD_FUZZERS=ON \
  -DDC_BUILD_TESTS=OFF >/dev/null
targets=(safetensors gguf tokenizer tokenizer_json openai_request)
# (the CPU seconds of this shell's finished children: cutime + cstime, in clock ticks)
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%d", ($16 + $17) / hz }' "/proc/$$/stat"; }
t0=$SECONDS c0=$(cpu_s)
cmake --build build-fuzz --target "${targets[@]/%/_fuzz}" -j"$(nproc)"
echo "fuzz: the build took $((SECONDS - t0)) s ($(($(cpu_s) - c0)) s of CPU)" >&2
[ "$seconds" = --build-only ] && exit 0
for f in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus-$f"
  seeds=(); [ -d "tests/fuzz/seeds/$f" ] && seeds=("tests/fuzz/seeds/$f")
  echo "fuzz: $f for ${seconds}s" >&2
  "build-fuzz/${f}_fuzz" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=4096 "build-fuzz/corpus-$f" \
    "${seeds[@]}" 2>"build-fuzz/$f.log" || { tail -40 "build-fuzz/$f.log"; exit 1; }
  tail -1 "build-fuzz/$f.log"
done
