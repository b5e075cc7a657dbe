#!/usr/bin/env bash
# ecache_study.sh — the expert cache's policy, measured with the protocol's own counts (backend-independent: the
# CPU backend runs the same moet_ecache as the CUDA backend): `moet perplexity --step 1` (a token a forward step, as
# decode routes) over dev.txt with 25/50/75% of the routed experts in slots, for each model given, in direct mode
# (--expert-home pinned: a miss read where it waits, fetched after the step) with the decayed-LFU victims and
# admission (a miss fetched only over a less used victim), the same without admission (MOET_ECACHE_ADMIT=0), plain
# LRU (MOET_ECACHE_LRU=1), and in replay mode (mapped homes). Prefetch off (the GPU has none yet), except in the
# policy lfu+admit+prefetch (MOET_EXPERT_PREFETCH=1: each MoE layer's output through the next layer's router, its
# top k fetched where that evicts only experts of earlier steps).
# Cost in direct mode: expert reads over the bus a token = (misses + fetches) / tokens; of them only the misses are
# read inside a step (a fetch, prefetch included, is a copy a GPU can overlap with compute).
# usage: bench/ecache_study.sh MOET_BIN OUT.json MODEL_DIR...   (DEV=../shared/data/dev.txt CTX=256 CHUNKS=4;
#        MODES="pinned:lfu+admit pinned:lfu+admit+prefetch" picks the home:policy pairs, the default all four above)
set -eu
MOET=$1; OUT=$2; shift 2
DEV=${DEV:-../shared/data/dev.txt}; CTX=${CTX:-256}; CHUNKS=${CHUNKS:-4}
COMMIT=$(git describe --always --dirty --abbrev=12)  # before this run writes its own output file
rows=()
for model in "$@"; do
  E=$(python3 -c "import json; c=json.load(open('$model/config.json')); print((c['num_hidden_layers'] - c.get('first_k_dense_replace', 0)) * c.get('num_experts', c.get('num_local_experts', c.get('n_routed_experts', 0))))")
  for pct in 25 50 75; do
    n=$((E * pct / 100))
    for mode in ${MODES:-pinned:lfu+admit pinned:lfu pinned:lru mapped:lru}; do
      set -- ${mode/:/ }
      pre=0; case $2 in *+prefetch) pre=1 ;; esac
      adm=0; case $2 in lfu+admit*) adm=1 ;; esac
      j=$(MOET_EXPERT_PREFETCH=$pre MOET_ECACHE_LRU=$([ $2 = lru ] && echo 1 || echo 0) \
          MOET_ECACHE_ADMIT=$adm "$MOET" perplexity -m "$model" -f "$DEV" \
          --ctx $CTX --chunks $CHUNKS --step 1 --expert-slots $n --expert-home $1 -t "${THREADS:-2}" --json 2>/dev/null)
      echo "$(basename "$model") $n slots ($pct%) $1 $2: $j" >&2
      rows+=("{\"model\": \"$(basename "$model")\", \"experts\": $E, \"slots\": $n, \"home\": \"$1\", \"policy\": \"$2\", \"result\": $j}")
    done
  done
done
{
  printf '{\n  "tool": "bench/ecache_study.sh",\n  "commit": "%s",\n  "date": "%s",\n  "machine": "%s, %s cores",\n' \
    "$COMMIT" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(uname -m)" "$(nproc)"
  printf '  "dev": "%s", "ctx": %s, "chunks": %s,\n  "runs": [\n' "$(basename "$DEV")" $CTX $CHUNKS
  for i in "${!rows[@]}"; do printf '    %s%s\n' "${rows[$i]}" "$([ $i -lt $((${#rows[@]} - 1)) ] && echo ,)"; done
  printf '  ]\n}\n'
} > "$OUT"
python3 - "$OUT" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("| model | slots | home | policy | hit rate | misses / token | fetches / token | bus reads / token | replays / token |")
print("|---|---|---|---|---|---|---|---|---|")
for r in d["runs"]:
    x = r["result"]; t = x["tokens"]
    print(f"| {r['model']} | {r['slots']} of {r['experts']} | {r['home']} | {r['policy'] if r['home'] == 'pinned' else 'LRU (replay)'} | "
          f"{1 - x['cache_misses'] / x['cache_uses']:.4f} | {x['cache_misses'] / t:.2f} | {x['cache_fetched'] / t:.2f} | "
          f"{(x['cache_misses'] + x['cache_fetched']) / t if r['home'] == 'pinned' else float('nan'):.2f} | {x['cache_replays'] / t:.2f} |")
PY
