#!/usr/bin/env bash
# gpu_ab.sh — decode speed A/B on the device machine: `moet bench --synthetic SHAPE` under each environment setting
# of ENVS (';'-separated, each a space-separated list of VAR=VALUE; `default`: none; `base`: the baseline build
# that BASE_BUILD= put in .carry/base.tar.xz, tools/gpu_carry.sh), ROUNDS rounds alternating so that drift falls on
# every setting alike. One line a run to $OUT/ab.txt:
#   shape <tab> setting <tab> round <tab> the bench's tg line
# e.g. ENVS="MOET_MOE_OVL=0;default" SHAPES="qwen3-30b-a3b qwen3-235b-a22b" ROUNDS=2 TG=64 bash tools/gpu_ab.sh
# (ARGS adds bench options; PP>0 times a prompt too; each run's JSON beside ab.txt.) Binaries: .carry (gpu_carry.sh).
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
[ -f .carry/bin.tar.xz ] && [ ! -x .carry/bin/moet ] && tar -C .carry -xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .carry/commit ] && export MOET_COMMIT=$(cat .carry/commit)
[ -f .carry/base.tar.xz ] && mkdir -p .carry/base && tar -C .carry/base -xJf .carry/base.tar.xz
IFS=';' read -r -a sets <<< "${ENVS:-}"
[ ${#sets[@]} -eq 0 ] && sets=("")  # `default` names the empty setting (bash drops a trailing empty one)
for r in $(seq 1 "${ROUNDS:-2}"); do
  for shape in ${SHAPES:-qwen3-30b-a3b}; do
    for s in "${sets[@]}"; do
      [ "$s" = default ] && s=
      tag=$(echo "${s:-default}" | sed 's/MOET_//g; s/ /,/g')
      bin=.carry/bin/moet lib=
      cm=${MOET_COMMIT:-}
      [ "$s" = base ] && s= bin=.carry/base/bin/moet lib=$PWD/.carry/base/lib: cm=$(cat .carry/base.commit 2>/dev/null || echo base)
      line=$(LD_LIBRARY_PATH=$lib$LD_LIBRARY_PATH MOET_COMMIT=$cm env $s $bin bench --synthetic "$shape" --device cuda -p "${PP:-0}" -n "${TG:-64}" ${ARGS:-} \
             --json "$out/bench-$shape-$tag-r$r.json" 2>/dev/null |
             grep -E " (tg|pp)[0-9]" | tr -s ' ' | tr '\n' ' ')
      printf '%s\t%s\t%s\t%s\n' "$shape" "$tag" "$r" "$line" | tee -a "$out/ab.txt"
    done
  done
done
