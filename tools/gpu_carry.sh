#!/usr/bin/env bash
# gpu_carry.sh — gathers what a device-machine run needs into .carry/ (git-ignored): the built binaries, the
# shared libraries they link that the GPU image lacks, and the reference fixture from ../shared.
set -eu
build=${1:-build}
rm -rf .carry/bin .carry/lib && mkdir -p .carry/bin .carry/lib .carry/shared
cp "$build/moet" "$build/tests/test_ops" "$build/tests/test_cuda" "$build/tests/test_logits" .carry/bin/
for l in libjansson.so.4 libpcre2-8.so.0 libutf8proc.so.2; do cp -L "/lib/x86_64-linux-gnu/$l" .carry/lib/; done
cp ../shared/models/moe-mini-a/reference_fp32.safetensors .carry/shared/
du -sh .carry
