#!/usr/bin/env bash
# Regenerates everything in models/ from nothing:
#   venv (models/.venv) -> texts from npm and Debian -> 8k byte-level BPE -> Llama, DiffLlama and
#   DIFF V2 (trained in turn, resumable) -> bf16 HF directories + evaluation -> reference logits
#   -> `duet convert` of the DiffLlama to models/duet-diff-ref.q8_0.gguf.
#
#   models/make_models.sh                  # from the repository root or anywhere
#   models/make_models.sh --threads 2      # extra arguments go to models/train.py
#
# Run it again after an interruption: finished stages are skipped and training resumes
# from its last checkpoint (models/.cache/run-ref/ckpt/<llama|diff|v2>/state.pt).
# Environment: DUET_VENV=DIR uses an existing venv with models/requirements.txt instead of
# making models/.venv; NICE=N sets the niceness of the heavy steps (default 10); OUT=DIR
# puts the exported models elsewhere (default models/; for tests with --preset tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DUET_VENV:-models/.venv}
OUT=${OUT:-models}
NICE="nice -n ${NICE:-10}"
t_all=$(date +%s)
stamp() { echo "[make_models $(date +%H:%M:%S)] $*"; }

if [ ! -x "$VENV/bin/python" ]; then
    stamp "creating $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet -r models/requirements.txt
fi
stamp "venv ready ($(( $(date +%s) - t_all )) s)"

$NICE "$VENV/bin/python" models/train.py all --out "$OUT" "$@"
stamp "trained and exported ($(( $(date +%s) - t_all )) s)"

$NICE "$VENV/bin/python" models/reference_logits.py "$OUT/llama-ref" "$OUT/diff-ref" "$OUT/diffv2-ref" --prompt "$OUT/reference_prompt.txt"

$NICE cargo build --release --quiet
$NICE ./target/release/duet convert "$OUT/diff-ref" --type q8_0 -o "$OUT/duet-diff-ref.q8_0.gguf" --threads 1 -q
stamp "done in $(( $(date +%s) - t_all )) s"
