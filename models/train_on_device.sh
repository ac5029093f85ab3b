#!/usr/bin/env bash
# Trains reference models on a lent GPU machine, the same way train.py trains them on a CPU
# (same data, order, seed, optimiser, schedule, evaluation and float32 precision), for the
# case where a CPU run does not fit: DIFF V2 needs ~3.5 h of a 2-core CPU.
#
# A GPU machine reaches no network and hands back at most 8 files of 16 MiB, so the work is
# split in three steps:
#
#   1. here:   models/.venv/bin/python models/train.py data
#              (the tokenized data, models/.cache/run-ref/data, ~8 MB, travels to the device)
#   2. device: bash models/train_on_device.sh train v2         [carry models/.cache/run-ref/data]
#              trains with the device's python3 (torch there), then writes the finished
#              checkpoint without its optimizer state (export needs the weights, step count,
#              loss curve and timing only) to $OUT in 15 MiB parts with their SHA-256, and
#              the training log
#   3. here:   models/train_on_device.sh join DIR v2
#              (DIR: where the device's files came back) checks and joins the parts into
#              models/.cache/run-ref/ckpt/v2/, after which `train.py export --models v2` and
#              the rest of models/make_models.sh run as after a CPU training
#
# The device is sent the whole working tree, which must stay under 64 MiB with the data: the
# tracked files alone are ~63.5 MiB, so move models/llama-ref/model.safetensors,
# models/diff-ref/model.safetensors and models/duet-diff-ref.q8_0.gguf (49 MiB) out of the
# checkout for the call and back after it.
# PRESET=tiny DEVICE=cpu rehearse all of it on a CPU in a minute (after `train.py data
# --preset tiny`, with OUT set to any folder and the venv's python first in PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-ref}
DEVICE=${DEVICE:-cuda}
WORK=models/.cache/run-$PRESET
PART=15M

usage() {
  echo "usage: $0 train MODEL | join DIR MODEL   (MODEL: llama, diff or v2)" >&2
  exit 2
}

case "${1:-}" in
train)
  [ $# -eq 2 ] || usage
  model=$2
  : "${OUT:?OUT (the folder whose files come back) is not set: run this on the device machine}"
  [ -s "$WORK/data/train.bin" ] || { echo "error: $WORK/data/train.bin is missing: carry $WORK/data" >&2; exit 1; }
  export PYTHONUNBUFFERED=1
  if [ "$DEVICE" = cuda ]; then
    python3 -c 'import torch, tokenizers, numpy; assert torch.cuda.is_available(), "torch sees no GPU"'
  fi
  python3 models/train.py train --preset "$PRESET" --models "$model" --device "$DEVICE" --precision fp32 \
    --threads "$(nproc)" --work "$WORK" 2>&1 | tee "$OUT/train-$model.log"
  python3 - "$WORK/ckpt/$model/state.pt" "$WORK/slim-$model.pt" <<'PY'
import sys, torch
ck = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
assert ck["step"] == ck["hparams"]["total_steps"], f"training stopped at step {ck['step']}"
ck.pop("optim", None)
torch.save(ck, sys.argv[2])
PY
  split -b "$PART" -d "$WORK/slim-$model.pt" "$OUT/$model-state.pt.part"
  (cd "$WORK" && sha256sum "slim-$model.pt") >"$OUT/$model-state.pt.sha256"
  cp "$WORK/ckpt/$model/metrics.csv" "$OUT/$model-metrics.csv"
  ls -l "$OUT"
  ;;
join)
  [ $# -eq 3 ] || usage
  dir=$2 model=$3
  want=$(cut -d' ' -f1 "$dir/$model-state.pt.sha256")
  mkdir -p "$WORK/ckpt/$model"
  tmp=$WORK/ckpt/$model/state.pt.join
  cat "$dir/$model-state.pt.part"* >"$tmp"
  got=$(sha256sum "$tmp" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    rm -f "$tmp"
    echo "error: the joined checkpoint has sha256 $got, the device wrote $want" >&2
    exit 1
  fi
  cp "$dir/$model-metrics.csv" "$WORK/ckpt/$model/metrics.csv"
  mv "$tmp" "$WORK/ckpt/$model/state.pt"
  echo "$WORK/ckpt/$model/state.pt: trained on the device; next: models/.venv/bin/python models/train.py export --models $model"
  ;;
*) usage ;;
esac
