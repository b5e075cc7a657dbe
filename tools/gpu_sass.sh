#!/usr/bin/env bash
# gpu_sass.sh PATTERN [LIB] — the SASS of the kernels whose mangled names match PATTERN (an awk regex), from the
# carried libmoet.so, into $OUT/sass-*.txt.xz. The development machine's toolkit has no cuobjdump; the device
# machine's has. E.g. tools/gpu_sass.sh 'k_tc_router(_split)?ILi1E' (where the router's weight loads sit against its
# PDL wait, ACQBULK).
set -u
pat=$1; lib=${2:-.carry/lib/libmoet.so}; out=${OUT:-gpu-out}; mkdir -p "$out"
command -v cuobjdump > /dev/null || { echo "gpu_sass: no cuobjdump here"; exit 0; }
# libmoet.so travels inside .carry/bin.tar.xz (tools/gpu_carry.sh): unpack it if no script has yet
[ -f "$lib" ] || { [ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz; }
name=$(echo "$pat" | tr -c 'A-Za-z0-9_\n' '_' | cut -c1-40)
cuobjdump -sass "$lib" | awk -v pat="$pat" '/Function : /{p = ($0 ~ pat)} p' | xz > "$out/sass-$name.txt.xz"
xz -dc "$out/sass-$name.txt.xz" | grep -c . | sed "s/^/gpu_sass: $name lines: /"
