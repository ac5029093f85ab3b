#!/usr/bin/env bash
# Decode and prefill speed of the three attention variants at one shape, same run: a
# random-weight Llama (TinyLlama-1.1B shape: 32 query heads, 4 KV heads), the DiffLlama of
# the same shape and the DIFF V2 with the same query and KV heads (h = 16 pairs, so 2h = 32
# query heads; converter/bench/make_random_llama.py --diff / --v2). `duet bench -p 128 -n 32
# -r 5 -t 2 --device cpu` with duet's default arithmetic, the models alternating within each
# round so that they share the machine's noise; medians over rounds of each run's median
# tokens/s and ratios to the Llama.
#
#   runtime/bench/arch_speed.sh               # Q4_0 and Q8_0, 2 rounds (~10 GB under
#                                             # target/bench on first run, ~15 min on 2 cores)
#   TYPES="q4_k_m" ROUNDS=3 runtime/bench/arch_speed.sh
#   DEPTH=1024 runtime/bench/arch_speed.sh    # decode after 1,024 cached tokens instead
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh

duet=$(bench_duet arch-speed)
rounds=${ROUNDS:-2}
types=(${TYPES:-q4_0 q8_0})
depth=${DEPTH:-0}

declare -A flag=([llama]="" [diff]="--diff" [v2]="--v2")
declare -A dir=([llama]=random-llama-1.1b [diff]=random-diffllama-1.1b [v2]=random-diffllama-v2-1.1b)
archs=(llama diff v2)
for a in "${archs[@]}"; do
  base=$BENCH/${dir[$a]}
  if [ ! -s "$base.f16.gguf" ]; then
    [ -f "$base/config.json" ] || bench_random_llama "$base" --dtype f16 ${flag[$a]} >&2
    "$duet" convert "$base" --type f16 -o "$base.f16.gguf" -q
    rm -rf "$base"
  fi
  for t in "${types[@]}"; do
    [ -s "$base.$t.gguf" ] || "$duet" convert "$base.f16.gguf" --type "$t" -o "$base.$t.gguf" -q
  done
done

# -> "pp tg GB/s" medians (t/s) of one run
duet_run() {
  local extra=()
  [ "$depth" = 0 ] || extra=(--depth "$depth")
  "$duet" bench -m "$1" -p 128 -n 32 -r 5 -t 2 --device cpu "${extra[@]}" 2>/dev/null | bench_duet_parse
}

echo "Machine: $(bench_machine). duet $(git rev-parse --short HEAD); duet bench -p 128 -n 32 -r 5 -t 2 --device cpu (default arithmetic), decode depth $depth, $rounds rounds."
echo
echo "| type | Llama pp128 | DiffLlama pp128 | ratio | DIFF V2 pp128 | ratio | Llama tg32 | DiffLlama tg32 | ratio | DIFF V2 tg32 | ratio |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for t in "${types[@]}"; do
  declare -A pp=() tg=()
  for ((r = 0; r < rounds; r++)); do
    for a in "${archs[@]}"; do
      read -r p g _ < <(duet_run "$BENCH/${dir[$a]}.$t.gguf")
      pp[$a]="${pp[$a]:-} $p"
      tg[$a]="${tg[$a]:-} $g"
    done
  done
  for a in "${archs[@]}"; do
    pp[$a]=$(echo "${pp[$a]}" | bench_median)
    tg[$a]=$(echo "${tg[$a]}" | bench_median)
  done
  echo "| $t | ${pp[llama]} | ${pp[diff]} | $(bench_ratio "${pp[diff]}" "${pp[llama]}") | ${pp[v2]} | $(bench_ratio "${pp[v2]}" "${pp[llama]}") | ${tg[llama]} | ${tg[diff]} | $(bench_ratio "${tg[diff]}" "${tg[llama]}") | ${tg[v2]} | $(bench_ratio "${tg[v2]}" "${tg[llama]}") |"
  unset pp tg
done
