#!/usr/bin/env bash
# What each K/V cache type costs in perplexity against an f16 cache, and what llama.cpp's
# quantized caches (with and without its Hadamard rotation) cost on the same files and
# text: docs/kv-cache-formats.md's accuracy table.
#
#   runtime/bench/kv_cache_accuracy.sh                  # duet's table, then llama.cpp's
#   PARTS=duet runtime/bench/kv_cache_accuracy.sh       # one part only (duet, gpu, llama.cpp)
#   PARTS=duet CTX=4096 MODELS=smollm2 ...               # duet's table at another context, on
#                                                       # chosen models (smollm2 diff-ref llama-ref)
#   PARTS=duet CONFIGS="f16 f16,q3c q3r" ...             # chosen K V pairs (the first the base)
#   PARTS="duet gpu llama.cpp" GPU_TOKENS=512 ...       # also duet --device gpu (any adapter,
#                                                       # lavapipe included) on the first 512
#                                                       # tokens against the CPU on the same,
#                                                       # every model's weights in F32 so that
#                                                       # both backends compute in f32
#   PARTS=gpu GPU_TOKENS=all GPU_MODELS=smollm2 GPU_CACHES="q6c/q6r q4c/q4r" ...
#                                                       # the whole text (lavapipe: ~2 h per
#                                                       # SmolLM2 row on 2 cores), chosen rows
#
# Models: SmolLM2-135M-Instruct (llama.cpp's Q4_1 file, a Transformer) and the reference
# pair (models/diff-ref, models/llama-ref, converted to F16; llama.cpp runs the Llama).
# Text: held-out State of the Union addresses (runtime/bench/common.sh). `-c 512` (or CTX), 2
# threads. duet's own table scores every position of each chunk; beside
# llama-perplexity it scores the second half, as llama-perplexity does. Compare ratios to
# each one's own f16, not absolute values. Prints markdown; also writes each part to
# target/bench/kv-accuracy-PART.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh

duet=$(bench_duet kv-accuracy)
text=$(bench_eval_text)
smol=$(bench_smollm2)
for m in diff llama; do
  [ -s "$BENCH/$m-ref.f16.gguf" ] || "$duet" convert "models/$m-ref" --type f16 -o "$BENCH/$m-ref.f16.gguf" -q
done
parts=" ${PARTS:-duet llama.cpp} "
has_part() { [[ $parts == *" $1 "* ]]; }
out=/dev/null
# part NAME: start writing target/bench/kv-accuracy-NAME.md
part() { out=$BENCH/kv-accuracy-$1.md; : >"$out"; bench_say "part $1 -> $out"; }
emit() { echo "$*" | tee -a "$out"; }

# duet perplexity M K V [extra...] -> the PPL
duet_ppl() {
  local m=$1 k=$2 v=$3
  shift 3
  "$duet" perplexity -m "$m" -f "$text" -c "${CTX:-512}" -t 2 --cache-type-k "$k" --cache-type-v "$v" -q "$@" 2>/dev/null \
    | sed -n 's/^PPL = \([0-9.]*\).*/\1/p'
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.2f%%", (a / b - 1) * 100 }'; }

# The new pairs beside the absmax blocks at each width, then each cache alone at 4 bits in
# every layout: K per channel (q4c) against rotated (q4r, llama.cpp's scheme) and plain
# blocks (q4); V likewise; then the 3- and 2-bit pairs and each of their halves alone.
configs=("f16 f16" "q8 q8" "q8c q8r" "q6 q6" "q6c q6r" "q4 q4" "q4c q4r"
  "q4 f16" "q4r f16" "q4c f16" "f16 q4" "f16 q4r" "f16 q4c"
  "q3c q3r" "q3c f16" "f16 q3r" "q2c q2r" "q2c f16" "f16 q2r")
[ -z "${CONFIGS:-}" ] || IFS=, read -r -a configs <<<"$CONFIGS"
echo "Machine: $(bench_machine). duet $(git rev-parse --short HEAD)."
if has_part duet; then
part duet
emit "CPU backend, default arithmetic, \`-c ${CTX:-512}\`:"
emit ""
emit "| model | K / V cache | duet PPL | vs f16 |"
emit "|---|---|---|---|"
models=()
for m in ${MODELS:-smollm2 diff-ref llama-ref}; do
  if [ "$m" = smollm2 ]; then models+=("$smol"); else models+=("$BENCH/$m.f16.gguf"); fi
done
for model in "${models[@]}"; do
  name=$(basename "$model" .gguf)
  base=""
  for c in "${configs[@]}"; do
    set -- $c
    ppl=$(duet_ppl "$model" "$1" "$2" --device cpu)
    [ -n "$base" ] || base=$ppl
    emit "| $name | $1 / $2 | $ppl | $(pct "$ppl" "$base") |"
  done
done
fi

if has_part gpu; then
  part gpu
  GPU_TOKENS=${GPU_TOKENS:-512}
  gpu_models=${GPU_MODELS:-smollm2 diff-ref llama-ref}
  gpu_caches=${GPU_CACHES:-q8c/q8r q6c/q6r q4c/q4r}
  # --max-tokens N, or nothing for the whole text
  limit=()
  [ "$GPU_TOKENS" = all ] || limit=(--max-tokens "$GPU_TOKENS")
  span="over the first $GPU_TOKENS tokens"
  [ "$GPU_TOKENS" = all ] && span="over the whole text"
  # F32 weights: the CPU backend's quantized-weight arithmetic (two-level Q8 activations)
  # differs from the GPU's on purpose; in f32 both compute the same, so what differs is
  # the attention and its cache.
  [ -s "$BENCH/smollm2.f32.gguf" ] || "$duet" convert "$smol" --type f32 -o "$BENCH/smollm2.f32.gguf" -q
  for m in diff llama; do
    [ -s "$BENCH/$m-ref.f32.gguf" ] || "$duet" convert "models/$m-ref" --type f32 -o "$BENCH/$m-ref.f32.gguf" -q
  done
  emit ""
  emit "GPU backend (\`--device gpu\`) against the CPU backend $span, weights in F32:"
  emit ""
  emit "(CPU jitter: the largest relative change of the CPU's own perplexity when every K and V"
  emit "value it caches is first moved by a relative 1e-7, 3e-7 or 1e-6, \`DUET_KV_JITTER\`: how"
  emit "far f32 rounding differences alone move the result.)"
  emit ""
  emit "| model | K / V cache | CPU PPL | GPU PPL | relative difference | CPU jitter |"
  emit "|---|---|---|---|---|---|"
  reldiff() { awk -v a="$1" -v b="$2" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; printf "%.1e", d }'; }
  for name in $gpu_models; do
    model=$BENCH/$name.f32.gguf
    for c in $gpu_caches; do
      set -- ${c/\// }
      cpu=$(duet_ppl "$model" "$1" "$2" --device cpu "${limit[@]}")
      gpu=$(duet_ppl "$model" "$1" "$2" --device gpu "${limit[@]}")
      spread=0
      for j in 1e-7 3e-7 1e-6; do
        d=$(reldiff "$(DUET_KV_JITTER=$j duet_ppl "$model" "$1" "$2" --device cpu "${limit[@]}")" "$cpu")
        spread=$(awk -v a="$d" -v b="$spread" 'BEGIN { print (a > b) ? a : b }')
      done
      emit "| $(basename "$model" .gguf) | $1 / $2 | $cpu | $gpu | $(reldiff "$gpu" "$cpu") | $spread |"
    done
  done
fi

if has_part llama.cpp; then
  part llama.cpp
  bin=$(bench_llama_cpp llama-perplexity)
  lc_ppl() {
    local m=$1 k=$2 v=$3
    shift 3
    env "$@" "$bin/llama-perplexity" -m "$m" -f "$text" -c "${CTX:-512}" -t 2 -fa on -ctk "$k" -ctv "$v" 2>&1 \
      | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p'
  }
  emit "Side by side with llama.cpp 0c1e57098 (\`llama-perplexity -c ${CTX:-512} -t 2 -fa on -ctk K -ctv V\`; its Hadamard"
  emit "rotation is on by default, \`LLAMA_ATTN_ROT_DISABLE=1\` turns it off), duet scoring the same second"
  emit "half of each chunk (\`duet perplexity --score-second-half\`); each against its own f16 cache:"
  emit ""
  emit "| model | cache | duet K / V | duet vs f16 | llama.cpp K / V | llama.cpp vs f16 |"
  emit "|---|---|---|---|---|---|"
  for model in "$smol" "$BENCH/llama-ref.f16.gguf"; do
    name=$(basename "$model" .gguf)
    dbase=$(duet_ppl "$model" f16 f16 --device cpu --score-second-half)
    lbase=$(lc_ppl "$model" f16 f16)
    # label | duet K V | llama.cpp K V rotation
    for row in "8-bit K+V|q8c q8r|q8_0 q8_0 on" "4-bit K+V|q4c q4r|q4_0 q4_0 on" "4-bit K+V|q4c q4r|q4_0 q4_0 off" \
      "4-bit K|q4c f16|q4_0 f16 on" "4-bit K|q4c f16|q4_0 f16 off" "4-bit V|f16 q4r|f16 q4_0 on"; do
      IFS='|' read -r label dc lc <<<"$row"
      set -- $dc
      dk=$1 dv=$2
      set -- $lc
      env=()
      [ "$3" = off ] && env=(LLAMA_ATTN_ROT_DISABLE=1)
      d=$(duet_ppl "$model" "$dk" "$dv" --device cpu --score-second-half)
      l=$(lc_ppl "$model" "$1" "$2" "${env[@]}")
      emit "| $name | $label | $dk / $dv | $(pct "$d" "$dbase") | $1 / $2 (rotation $3) | $(pct "$l" "$lbase") |"
    done
  done
fi
