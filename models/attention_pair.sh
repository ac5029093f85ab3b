#!/usr/bin/env bash
# What the attention of the reference pair (and of the DIFF V2 model, once models/diffv2-ref
# exists) does, docs/attention-maps.md (usage: the README's "Seeing the attention"):
#   * `duet attn-map` of each model over the first sentences of a held-out Moby-Dick chapter
#     (models/reference_prompt.txt), layers 4 and 9, every head / head pair, with the HTML
#     report -> models/results/attn-map/{diff-ref,diffv2-ref,llama-ref}/
#   * `duet needle` (the DIFF paper's Table 3 metric) on each model and on SmolLM2-135M
#     (a model that can retrieve), depths 0/25/50/75/100 %, 512-token prompts, duet's
#     shipped haystack -> models/results/needle/
#   * attention sinks: `duet attn-map` of every layer of each model and of SmolLM2 over the
#     whole held-out prompt, and models/attention_sinks.py's share of attention on the first
#     token -> models/results/attention-sinks.md
#
#   models/attention_pair.sh
#
# The models are converted to F16 GGUFs under models/.cache/insight (git-ignored); SmolLM2
# comes from runtime/bench/common.sh's pinned download. CPU, deterministic (greedy).
set -euo pipefail
cd "$(dirname "$0")/.."
source runtime/bench/common.sh
WORK=models/.cache/insight
OUT=models/results
mkdir -p "$WORK" "$OUT"
duet=$(bench_duet insight)
models=(diff llama)
[ -f models/diffv2-ref/config.json ] && models=(diff diffv2 llama)
for m in "${models[@]}"; do
  "$duet" convert "models/$m-ref" --type f16 -q -o "$WORK/$m-ref.f16.gguf"
done

# The chapter's opening clauses (after its title), up to "deck,": short enough (~25 tokens)
# for token labels on the heatmaps' axes.
prompt=$(python3 - <<'PY'
import re
text = open("models/reference_prompt.txt").read().split("\n\n", 1)[1]
print(text[: text.index("deck,") + len("deck,")])
PY
)
needle_models=()
for m in "${models[@]}"; do
  needle_models+=(-m "$WORK/$m-ref.f16.gguf")
  rm -rf "$OUT/attn-map/$m-ref"
  "$duet" attn-map -q --device cpu -m "$WORK/$m-ref.f16.gguf" -p "$prompt" --layers 4,9 \
    -o "$OUT/attn-map/$m-ref" --html
done

smol=$(bench_smollm2)
mkdir -p "$OUT/needle"
"$duet" needle -q --device cpu "${needle_models[@]}" -m "$smol" \
  --ctx 512 -o "$OUT/needle" --html | tee "$OUT/needle/table.txt"

# Attention sinks (the DIFF V2 blog says V2 removes them): every layer over the whole prompt.
sink_dirs=()
for m in "${models[@]}"; do
  rm -rf "$WORK/sinks/$m-ref"
  "$duet" attn-map -q --device cpu -m "$WORK/$m-ref.f16.gguf" -f models/reference_prompt.txt -o "$WORK/sinks/$m-ref"
  sink_dirs+=("$WORK/sinks/$m-ref")
done
rm -rf "$WORK/sinks/SmolLM2-135M-Instruct"
"$duet" attn-map -q --device cpu -m "$smol" -f models/reference_prompt.txt -o "$WORK/sinks/SmolLM2-135M-Instruct"
python3 models/attention_sinks.py "${sink_dirs[@]}" "$WORK/sinks/SmolLM2-135M-Instruct" | tee "$OUT/attention-sinks.md"
