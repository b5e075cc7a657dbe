#!/usr/bin/env bash
# test.sh — build and run every test: the release build with -Werror, then the same tests under ASan+UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
j=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMOET_WERROR=ON >/dev/null
cmake --build build -j"$j"
ctest --test-dir build --output-on-failure -j"$j"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOET_SANITIZE=ON -DMOET_WERROR=ON >/dev/null
cmake --build build-asan -j"$j"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$j"
