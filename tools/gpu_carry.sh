#!/usr/bin/env bash
# gpu_carry.sh — gathers what a device-machine run needs into .carry/ (git-ignored): the built binaries, the
# shared libraries they link that the GPU image lacks, and the reference fixture from ../shared.
set -eu
build=${1:-build}  # e.g. build-sm90: -DMOET_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" (smaller upload),
                   # and -DMOET_SHARED_LIB=ON (smaller still: libmoet.so once, not in every binary)
rm -rf .carry/bin .carry/lib && mkdir -p .carry/bin .carry/lib
# BINS="moet test_ops" ships only those (the working tree and .carry must fit the call's 64 MiB; they are close)
for b in ${BINS:-moet test_ops test_cuda test_logits test_batch test_kv test_ecache test_arch}; do
  if [ -f "$build/$b" ]; then cp "$build/$b" .carry/bin/; else cp "$build/tests/$b" .carry/bin/; fi
done
# the libraries the GPU image (Ubuntu 24.04) lacks; it has gnutls and the rest of libmicrohttpd's chain, no Node.js
for l in libjansson.so.4 libpcre2-8.so.0 libutf8proc.so.2 libmicrohttpd.so.12; do cp -L "/lib/x86_64-linux-gnu/$l" .carry/lib/; done
# a build with -DMOET_SHARED_LIB=ON: the binaries share libmoet.so (one copy of the device code, so all eight fit)
[ -f "$build/libmoet.so" ] && cp -L "$build/libmoet.so" .carry/lib/
# moe-mini-a's reference, window 0 of 4 (the CPU tests in CI compare all four): the working tree and .carry must fit
# the device call's 64 MiB, and the fixtures grow
# the fixtures grow: since stop 30 it travels only with SHARED=1 (and then not with all eight binaries)
rm -rf .carry/shared
if [ "${SHARED:-0}" = 1 ]; then
  mkdir -p .carry/shared
  python3 tools/st_trim.py ../shared/models/moe-mini-a/reference_fp32.safetensors .carry/shared/reference_fp32.safetensors 1
fi
strip --strip-unneeded .carry/bin/* .carry/lib/*  # host symbols only; the device code (.nv_fatbin) stays
rm -rf .carry/node_modules
# QPACK=FILE: a W2 pack (e.g. moe-mini-c's, from `moet quantize`) xz'd, and the first 400 KB of ../shared/data/dev.txt,
# for tools/gpu_prefill.sh's perplexity and KLD on the GPU (../shared does not travel)
rm -rf .carry/q
if [ -n "${QPACK:-}" ]; then
  mkdir -p .carry/q
  xz -T2 -6 -c "$QPACK" > .carry/q/pack.gguf.xz
  qd="${QPACK%.gguf}.delta.gguf" # its delta pack where there is one (tools/gpu_delta_pick.sh)
  [ -f "$qd" ] && xz -T2 -6 -c "$qd" > .carry/q/pack.delta.gguf.xz
  head -c 400000 ../shared/data/dev.txt > .carry/q/text.txt
fi
# seven statically linked binaries are ~140 MB, past the device call's 64 MiB working tree: ship them xz'd;
# gpu_check.sh unpacks them
# -9e: a 64 MiB dictionary spans the binaries, which share their ~18 MB of device code (16 MB at -6, 2.8 MB here)
# (libmoet.so of a MOET_SHARED_LIB build travels in the same archive: the scripts' unpacking puts it in .carry/lib)
so=; [ -f .carry/lib/libmoet.so ] && so=lib/libmoet.so
tar -C .carry -cf - bin $so | xz -9e > .carry/bin.tar.xz && rm -rf .carry/bin ${so:+.carry/$so}
# Other shared-library builds' moet and libmoet.so beside these, one archive each: TRACE_BUILD (a -DMOET_CUDA_TRACE=ON
# build, .carry/tr.tar.xz: tools/gpu_trace.sh runs it) and BASE_BUILD (the build to compare with, e.g. the last
# commit's in a git worktree, .carry/base.tar.xz: tools/gpu_ab.sh's setting `base` runs it), so that one call times
# the new build against the old and draws the timeline (machines differ by ~5%: never compare across calls)
pack_extra() {  # NAME BUILD
  rm -rf ".carry/$1" && mkdir -p ".carry/$1/bin" ".carry/$1/lib"
  cp "$2/moet" ".carry/$1/bin/" && cp -L "$2/libmoet.so" ".carry/$1/lib/"
  strip --strip-unneeded ".carry/$1"/bin/* ".carry/$1"/lib/*
  tar -C ".carry/$1" -cf - bin lib | xz -9e > ".carry/$1.tar.xz" && rm -rf ".carry/$1"
}
rm -f .carry/tr.tar.xz .carry/base.tar.xz
[ -n "${TRACE_BUILD:-}" ] && pack_extra tr "$TRACE_BUILD"
[ -n "${BASE_BUILD:-}" ] && pack_extra base "$BASE_BUILD"
rm -f .carry/base.commit  # the base build's commit, from the git tree its build folder sits in (gpu_ab.sh's JSONs)
[ -n "${BASE_BUILD:-}" ] && git -C "$(dirname "$BASE_BUILD")" describe --always --abbrev=12 > .carry/base.commit 2>/dev/null
git describe --always --dirty --abbrev=12 > .carry/commit  # what the binaries were built from (bench JSONs)
du -sh .carry
# the device call takes the working tree (tracked and untracked-not-ignored files) and .carry up to 64 MiB; calls
# of 66.64 MB went through, 66.69 MB did not (stop 31): say so here rather than after a refused call
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
car=$(du -sb .carry | cut -f1)
awk -v t="$tree" -v c="$car" 'BEGIN {
  printf "gpu_carry: tree %.2f MB + .carry %.2f MB = %.2f MB (the device call takes ~66.6 MB)\n", t / 1e6, c / 1e6, (t + c) / 1e6
  if (t + c > 66.6e6) print "gpu_carry: too big: ship fewer BINS, or move aside for the call a tracked file it does not need (e.g. tests/fixtures/dev_ids.u16, 0.9 MB, used by a CPU test only)" }'
