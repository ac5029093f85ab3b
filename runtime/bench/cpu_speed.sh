#!/usr/bin/env bash
# duet's CPU speed beside llama.cpp's on the same GGUF files, same run: the speed
# table of docs/benchmarks.md. `duet bench` and `llama-bench`, both `-p 128 -n 32 -r 5 -t 2`, the two programs
# alternating within each round so they share the machine's noise; the table gives the
# median over rounds of each run's median tokens/s and duet/llama.cpp ratios, for duet's
# default arithmetic (two-level Q8 activations) and for `--cpu-acts auto` (two levels in
# decode, ggml's single Q8 in prompts). The
# machine's memory read bandwidth (`duet bench --bandwidth`, best of 5 × 1 GiB on 2 threads,
# median of 3) heads the table, and each decode is also given as the rate at which it streams
# the model's weights and as a share of the bandwidth measured once in each of that model's
# rounds (median; the cell names it).
#
#   runtime/bench/cpu_speed.sh                # SmolLM2-135M-Instruct Q4_1
#   MODELS=all runtime/bench/cpu_speed.sh     # also a random-weight 1.1B Llama (TinyLlama
#                                             # shape, converter/bench/make_random_llama.py,
#                                             # needs numpy) in Q4_0, Q4_K_M, Q6_K and Q8_0:
#                                             # ~6 GB under target/bench, ~30 min on 2 cores
#   ROUNDS=3 runtime/bench/cpu_speed.sh       # rounds (default 2)
#   SIMD=avx2 runtime/bench/cpu_speed.sh      # both programs limited to AVX2/FMA/F16C
#
# llama.cpp is built from the PyPI sdist of llama-cpp-python (runtime/bench/common.sh) with
# GGML_NATIVE, so it uses whatever SIMD this CPU has, and its weight repacking. With
# SIMD=avx2 it is built without GGML_NATIVE, with AVX2/FMA/F16C/BMI2 only (no AVX-512, no
# AVX-VNNI), and duet runs with DUET_GEMM=avx2 DUET_ATTN_SIMD=avx2: the kernels an AVX2-only
# CPU gets (the avx2 set, its tuning variants timed at load as there), compared on this machine. It stands in for such a CPU in compute (prompts); its
# memory bandwidth is still this machine's, so decode ratios are not an AVX2 VM's.
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh

duet=$(bench_duet cpu-speed)
case ${SIMD:-native} in
  native) bin=$(bench_llama_cpp llama-bench) ;;
  avx2)
    bin=$(bench_llama_cpp_avx2 llama-bench)
    export DUET_GEMM=avx2 DUET_ATTN_SIMD=avx2
    ;;
  *) bench_say "SIMD must be native or avx2, not '$SIMD'"; exit 2 ;;
esac
rounds=${ROUNDS:-2}

models=("$(bench_smollm2)")
if [ "${MODELS:-}" = all ]; then
  rand=$BENCH/random-llama-1.1b
  if [ ! -s "$rand.f16.gguf" ]; then
    [ -f "$rand/config.json" ] || bench_random_llama "$rand" --dtype f16 >&2
    "$duet" convert "$rand" --type f16 -o "$rand.f16.gguf" -q
  fi
  for t in q4_0 q4_k_m q6_k q8_0; do
    [ -s "$rand.$t.gguf" ] || "$duet" convert "$rand.f16.gguf" --type "$t" -o "$rand.$t.gguf" -q
    models+=("$rand.$t.gguf")
  done
fi

# -> "pp tg GB/s" medians (t/s) of one run, GB/s: weights streamed by the decode
# (The table is kept in $BENCH/cpu-speed-last.md for the kernels line below.)
duet_run() {
  # (A failed run leaves "- - -" in the table, not the script ended: set -e reaches here.)
  "$duet" bench -m "$1" -p 128 -n 32 -r 5 -t 2 --device cpu "${@:2}" 2>/dev/null >"$BENCH/cpu-speed-last.md" || true
  bench_duet_parse <"$BENCH/cpu-speed-last.md"
}
lc_run() {
  "$bin/llama-bench" -m "$1" -p 128 -n 32 -r 5 -t 2 2>/dev/null | bench_llama_parse
}

# -> memory read bandwidth, GB/s, of one `duet bench --bandwidth`
bandwidth() {
  "$duet" bench -m "${models[0]}" -p 0 -n 1 -r 1 -t 2 --device cpu --bandwidth 2>/dev/null \
    | sed -n 's/^memory read bandwidth: \([0-9.]*\) GB.*/\1/p'
}
bw=$( (bandwidth; bandwidth; bandwidth) | bench_median)

limits=
[ "${SIMD:-native}" = avx2 ] && limits=" (both programs limited to SIMD=avx2)"
echo "Machine: $(bench_machine)$limits; memory read bandwidth $bw GB/s (2 threads). duet $(bench_duet_label), llama.cpp 0c1e57098; -p 128 -n 32 -r 5 -t 2, $rounds rounds."
echo
echo "| model | llama.cpp pp128 | duet pp128 | ratio | llama.cpp tg32 | duet tg32 | ratio | duet tg weights GB/s (of bandwidth) | duet \`--cpu-acts auto\` pp128 | ratio | tg32 | ratio |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
declare -A kernels=()
for m in "${models[@]}"; do
  declare -A pp=() tg=() gbs=()
  bws=
  for ((r = 0; r < rounds; r++)); do
    # The bandwidth again beside each round: a VM's speed drifts by a quarter within an hour,
    # and a share of the start's figure said 110% (cpu-speed-zen4-2fbbf52.md).
    bws="$bws $(bandwidth || true)"
    for who in lc duet duetauto; do
      g=
      case $who in
        lc) read -r p t < <(lc_run "$m") ;;
        duet)
          read -r p t g < <(duet_run "$m")
          kernels[$(basename "$m" .gguf)]=$(bench_duet_cell backend tg <"$BENCH/cpu-speed-last.md")
          ;;
        duetauto) read -r p t g < <(duet_run "$m" --cpu-acts auto) ;;
      esac
      pp[$who]="${pp[$who]:-} $p"
      tg[$who]="${tg[$who]:-} $t"
      gbs[$who]="${gbs[$who]:-} $g"
    done
  done
  for who in lc duet duetauto; do
    pp[$who]=$(echo "${pp[$who]}" | bench_median)
    tg[$who]=$(echo "${tg[$who]}" | bench_median)
  done
  g=$(echo "${gbs[duet]}" | bench_median)
  rbw=$(echo "$bws" | bench_median)
  share=$(awk -v a="$g" -v b="$rbw" 'BEGIN { if (b + 0 > 0 && a + 0 > 0) printf "%.0f%% of %.1f", 100 * a / b, b; else printf "bandwidth unmeasured" }')
  echo "| $(basename "$m" .gguf) | ${pp[lc]} | ${pp[duet]} | $(bench_ratio "${pp[duet]}" "${pp[lc]}") | ${tg[lc]} | ${tg[duet]} | $(bench_ratio "${tg[duet]}" "${tg[lc]}") | $g ($share) | ${pp[duetauto]} | $(bench_ratio "${pp[duetauto]}" "${pp[lc]}") | ${tg[duetauto]} | $(bench_ratio "${tg[duetauto]}" "${tg[lc]}") |"
  unset pp tg gbs
done

# duet times its packed kernel candidates per weight type at load (runtime/src/cpu/gemm_choice.rs):
# what its last default run of each model picked.
echo
echo "duet's kernels (\`duet bench\`'s backend column, last default run):"
for m in "${models[@]}"; do
  echo "- $(basename "$m" .gguf): ${kernels[$(basename "$m" .gguf)]:-?}"
done
