#!/usr/bin/env bash
# test.sh — build and run every test: the release build with -Werror (with the CUDA backend when nvcc is there:
# compiled for sm_90a, sm_120a and sm_80; its GPU tests skip without a GPU), then the same tests under ASan+UBSan
# (CPU only), then bounded fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
j=$(nproc)
# the server tests' client: the official openai npm package, pinned by tests/server/package-lock.json
(cd tests/server && npm ci --no-audit --no-fund --loglevel=error)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMOET_WERROR=ON >/dev/null
cmake --build build -j"$j"
ctest --test-dir build --output-on-failure -j"$j"
# the kernel timeline (src/backend/cuda/trace.cuh) is compiled out of the build above: compile it once (sm_90a) so
# its code cannot rot between the sessions that run it on a GPU (tools/gpu_trace.sh)
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  cmake -S . -B build-trace -DCMAKE_BUILD_TYPE=Release -DMOET_WERROR=ON -DMOET_CUDA_TRACE=ON \
    -DMOET_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" >/dev/null
  cmake --build build-trace -j"$j" --target moet_lib
fi
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOET_SANITIZE=ON -DMOET_WERROR=ON -DMOET_CUDA=OFF >/dev/null
cmake --build build-asan -j"$j"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$j"
# Parser fuzzing, bounded: each libFuzzer target runs from the committed seed corpus for FUZZ_SECONDS.
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOET_FUZZ=ON -DMOET_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$j" --target fuzz_safetensors fuzz_tokenizer fuzz_gguf fuzz_jinja fuzz_request fuzz_config
for t in safetensors tokenizer gguf jinja request config; do
  mkdir -p "build-fuzz/corpus-$t"
  "build-fuzz/fuzz/fuzz_$t" -max_total_time="${FUZZ_SECONDS:-30}" -max_len=4096 -print_final_stats=1 \
    "build-fuzz/corpus-$t" "fuzz/corpus/$t" 2>&1 | tail -4
done
