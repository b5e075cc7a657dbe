# gpu_setup.sh — sourced by a device-call script with a name: unpacks .carry's binaries (tools/gpu_carry.sh), sets
# the library path and MOET_COMMIT, makes $R = /tmp/res/NAME for the logs, defines pk (all of /tmp/res into
# $OUT/res.tar.xz: a call returns only a few files, and a call cut short keeps what pk packed) and prints the GPU.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
[ -f .carry/bin.tar.xz ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
R=/tmp/res/$1; mkdir -p "$R"
pk() { tar -C /tmp -cJf "$out/res.tar.xz" res; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
