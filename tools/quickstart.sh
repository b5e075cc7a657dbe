#!/usr/bin/env bash
# quickstart.sh — install what is missing, build, and generate text from the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
./build/moet run -p "${1:-=head1 NAME}" -n "${2:-64}"
