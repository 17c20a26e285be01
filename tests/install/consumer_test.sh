#!/bin/sh
# The public API from outside the tree: `cmake --install` the build into a temporary prefix, build
# tests/install/main.cc against it twice — as a CMake project (find_package(diffucoder CONFIG)) and with
# pkg-config alone — and check that both generate what the installed CLI generates on the same checkpoint.
# Usage: consumer_test.sh BUILD_DIR MODEL_DIR CXX_COMPILER
set -eu
build=$1 model=$2 cxx=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dc_install_XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
n_new=6

cmake --install "$build" --prefix "$prefix" > "$work/install.log" || { cat "$work/install.log"; exit 1; }
test -f "$prefix/include/diffucoder/diffucoder.h"
test -f "$prefix/include/diffucoder/batch.h"
# the installed headers are the public two: no internal header may be needed to compile against them
test "$(find "$prefix/include" -type f | wc -l)" -eq 2 || { echo "more than the public headers installed"; exit 1; }

generator=
if command -v ninja > /dev/null; then generator="-G Ninja"; fi
# shellcheck disable=SC2086
cmake -S "$here" -B "$work/cmake" $generator -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/cmake" > "$work/build.log" || { cat "$work/build.log"; exit 1; }

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# shellcheck disable=SC2046
"$cxx" -std=c++20 -O1 -o "$work/consumer_pc" "$here/main.cc" $(pkg-config --cflags --libs diffucoder)

want=$("$prefix/bin/diffucoder" generate --model "$model" --prompt-ids 1,2,3 --max-new-tokens $n_new \
  --temperature 0 --alg entropy --precision f32 --weight-cache off --threads 2 --json --quiet |
  sed -n 's/.*"token_ids":\[\([0-9,]*\)\].*/ids: \1/p')
test -n "$want" || { echo "the installed CLI printed no token_ids"; exit 1; }
for consumer in "$work/cmake/consumer" "$work/consumer_pc"; do
  got=$("$consumer" "$model" $n_new)
  if [ "$got" != "$want" ]; then
    echo "$consumer: '$got', the CLI: '$want'"
    exit 1
  fi
done
echo "installed library OK (CMake package and pkg-config): $want"
