#!/usr/bin/env bash
# `duet attn-bench` on a trained DIFF / Llama pair (and the DIFF V2 model when DIR/diffv2-ref
# exists), docs/low-bit-attention.md's results:
# held-out text (never trained on) decoded from the training run's evaluation slices ->
# both models converted to F16 GGUFs, calibrated (for the static logit scales) on another
# held-out slice -> attn-bench over WINDOWS windows of TOKENS tokens (each from an empty cache,
# metrics pooled) -> models/results/NAME-attn-bench.{json,csv,svg} and NAME-table.md (the
# side-by-side markdown tables of models/pair_table.py).
#
#   models/attn_bench_pair.sh                      # models/diff-ref + models/llama-ref
#   models/attn_bench_pair.sh DIR NAME             # DIR/diff-ref + DIR/llama-ref, results NAME
#
# Environment: DUET_VENV (a venv with models/requirements.txt, default models/.venv), DATA
# (the run's data directory, default models/.cache/run-ref/data), TOKENS (per window, default
# 512: the models' context), WINDOWS (default 8).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-models}
NAME=${2:-ref-pair}
VENV=${DUET_VENV:-models/.venv}
DATA=${DATA:-models/.cache/run-ref/data}
TOKENS=${TOKENS:-512}
WINDOWS=${WINDOWS:-8}
for m in diff-ref llama-ref; do
    [ -f "$DIR/$m/config.json" ] || { echo "error: $DIR/$m/config.json not found (train the pair first: models/make_models.sh)" >&2; exit 1; }
done
[ -f "$DATA/eval-sotu.bin" ] || { echo "error: $DATA/eval-sotu.bin not found (the training run's data stage)" >&2; exit 1; }
# Kept (git-ignored) so that the results name them by a stable path.
WORK=models/.cache/attn-bench
mkdir -p "$WORK"

# Evaluation text: the held-out State of the Union addresses; calibration text: the held-out
# Moby-Dick chapters and fortunes (a different slice, so calibration never sees the text
# it is scored on).
"$VENV/bin/python" - "$DATA" "$WORK" <<'PY'
import sys
import numpy as np
from tokenizers import Tokenizer
data, work = sys.argv[1:3]
tok = Tokenizer.from_file(f"{data}/tokenizer.json")
def text(names, n):
    ids = np.concatenate([np.fromfile(f"{data}/eval-{s}.bin", dtype=np.uint16) for s in names])
    return tok.decode(ids[:n].tolist(), skip_special_tokens=True)
open(f"{work}/eval.txt", "w").write(text(["sotu"], 8192))
open(f"{work}/calib.txt", "w").write(text(["moby-dick", "fortunes"], 8192))
PY

cargo build --release --quiet
models=(diff llama)
[ -f "$DIR/diffv2-ref/config.json" ] && models=(diff diffv2 llama)
args=()
for m in "${models[@]}"; do
    ./target/release/duet convert "$DIR/$m-ref" --type f16 --calibrate "$WORK/calib.txt" -o "$WORK/$NAME-$m.f16.gguf" -q
    args+=(-m "$WORK/$NAME-$m.f16.gguf")
done
mkdir -p models/results
./target/release/duet attn-bench "${args[@]}" \
    -f "$WORK/eval.txt" -c "$TOKENS" -w "$WINDOWS" -o "models/results/$NAME-attn-bench"
# docs/low-bit-attention.md's side-by-side tables (DIFF vs Llama per setting; both outlier summaries).
python3 models/pair_table.py "models/results/$NAME-attn-bench.json" | tee "models/results/$NAME-table.md"
