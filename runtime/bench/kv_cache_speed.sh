#!/usr/bin/env bash
# Decode speed at depth 4,096 (or DEPTHS) with each K/V cache type against f16 (or the first of
# CONFIGS), CPU backend, 2 threads, and the bytes each cache takes at 4,096 positions:
# docs/kv-cache-formats.md's speed and memory tables.
#
#   runtime/bench/kv_cache_speed.sh            # SmolLM2-135M and the reference DIFF model
#   ROUNDS=3 runtime/bench/kv_cache_speed.sh   # rounds of the alternation (default 2)
#   DEPTHS="512 4096" CONFIGS="f16 f16,q8c q8r" runtime/bench/kv_cache_speed.sh
#                                              # other depths (default 4096) and cache pairs
#                                              # (comma-separated "K V"; the first is the base)
#   MODELS=diff-ref runtime/bench/kv_cache_speed.sh
#                                              # chosen models (smollm2 diff-ref)
#
# `duet bench -c DEPTH+32 -d DEPTH -p 0 -n 32 -r 3 -t 2 --device cpu` per cache type; the types
# alternate within each round so they share the machine's noise; the table gives the
# median over rounds of each run's median tokens/s and the ratio to the first pair. The cache bytes
# come from `duet bench -c 4096` (everything included: scales, offsets, the f16 window).
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh

duet=$(bench_duet kv-speed)
smol=$(bench_smollm2)
[ -s "$BENCH/diff-ref.f16.gguf" ] || "$duet" convert models/diff-ref --type f16 -o "$BENCH/diff-ref.f16.gguf" -q
rounds=${ROUNDS:-2}
IFS=, read -r -a configs <<<"${CONFIGS:-f16 f16,q8 q8,q8c q8r,q6c q6r,q4 q4,q4c q4r}"
read -r -a depths <<<"${DEPTHS:-4096}"

tps() { # model k v depth -> median t/s of one `duet bench` run
  "$duet" bench -m "$1" -c $(($4 + 32)) -d "$4" -p 0 -n 32 -r 3 -t 2 --device cpu --cache-type-k "$2" --cache-type-v "$3" 2>/dev/null \
    | bench_duet_cell "t/s" "^tg32"
}
kv_bytes() { # model k v -> "MiB (ratio× f16, bits a value)" at 4,096 positions
  "$duet" bench -m "$1" -c 4096 -p 1 -n 0 -r 1 -t 2 --device cpu --cache-type-k "$2" --cache-type-v "$3" 2>/dev/null \
    | bench_duet_cell "KV cache" "^pp1$" | sed 's/^[^,]*, //'
}

echo "Machine: $(bench_machine). duet $(bench_duet_label)."
echo
echo "| model | K / V cache | KV cache at 4,096 positions | depth | tg32 (t/s) | vs ${configs[0]/ / \/ } |"
echo "|---|---|---|---|---|---|"
declare -A model_files=([smollm2]="$smol" [diff-ref]="$BENCH/diff-ref.f16.gguf")
for name in ${MODELS:-smollm2 diff-ref}; do
  model=${model_files[$name]:?unknown model $name (smollm2 diff-ref)}
  declare -A runs=()
  for ((r = 0; r < rounds; r++)); do
    for d in "${depths[@]}"; do
      for c in "${configs[@]}"; do
        set -- $c
        runs[$c $d]="${runs[$c $d]:-} $(tps "$model" "$1" "$2" "$d")"
      done
    done
  done
  for c in "${configs[@]}"; do
    set -- $c
    bytes=$(kv_bytes "$model" "$1" "$2")
    for d in "${depths[@]}"; do
      base=$(echo "${runs[${configs[0]} $d]}" | bench_median)
      m=$(echo "${runs[$c $d]}" | bench_median)
      ratio=$(awk -v a="$m" -v b="$base" 'BEGIN { printf "%.2f×", a / b }')
      echo "| $(basename "$model" .gguf) | $1 / $2 | $bytes | $d | $m (runs:${runs[$c $d]}) | $ratio |"
    done
  done
  unset runs
done
