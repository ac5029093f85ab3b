#!/usr/bin/env bash
# docs/gpu-backend.md's accuracy table: runs the GPU tests (runtime/tests/gpu_ops.rs,
# tests/gpu_model.rs) with their output shown and prints, next to each bound the tests
# assert, the worst value they measured. Needs a Vulkan adapter (lavapipe: Debian's
# mesa-vulkan-drivers; tests/run-all.sh installs it) and, for the SmolLM2 rows, the assets
# tests/run-all.sh fetches. A test that fails stops the script.
#
#   runtime/bench/gpu_accuracy.sh            # table on stdout, the tests' logs in target/bench
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
# A missing adapter or asset fails the tests instead of skipping them.
export DUET_REQUIRE_GPU=1 DUET_REQUIRE_ORACLES=1
DUET_SMOLLM2=${DUET_SMOLLM2:-$(bench_smollm2)}
export DUET_SMOLLM2

ops=$BENCH/gpu-ops.log
model=$BENCH/gpu-model.log
bench_say "GPU op tests -> $ops"
cargo test --release -q -p duet-runtime --test gpu_ops -- --nocapture --test-threads 1 >"$ops" 2>&1 \
  || { tail -30 "$ops" >&2; exit 1; }
bench_say "GPU model tests -> $model"
cargo test --release -q --test gpu_model -- --nocapture --test-threads 1 >"$model" 2>&1 \
  || { tail -30 "$model" >&2; exit 1; }

# max of the numbers that follow `key` on the lines matching `pattern` (awk regex)
worst() { # file pattern key
  awk -v pat="$2" -v key="$3" '$0 ~ pat {
      i = index($0, key); if (!i) next
      split(substr($0, i + length(key)), w, /[ ,;|()]+/); v = w[1] + 0
      if (!n++ || v > m) m = v
    } END { if (!n) { print "n/a"; exit } s = sprintf("%.1e", m); sub(/e-0/, "e-", s); print s }' "$1"
}
# the number after `key` on the first line matching `pattern`
first() { # file pattern key
  awk -v pat="$2" -v key="$3" '$0 ~ pat { i = index($0, key); split(substr($0, i + length(key)), w, /[ ,%]+/); print w[1]; exit }' "$1"
}

rowops=$(worst "$ops" '^[.]?(rms_norm|rope |swiglu|add |dex)[^:]*: nmse' 'nmse ')
attn=$(worst "$ops" '^[.]?attention .*K (f32|q[0-9][rc]?) V (f32|q[0-9][rc]?)[ :].*nmse' 'nmse ')
attn16=$(worst "$ops" '^[.]?attention .*(K f16|V f16).*nmse' 'nmse ')
mm32=$(worst "$ops" 'matmul .*f16=false' 'vs exact ')
mm16=$(worst "$ops" 'matmul .*f16=true' 'vs exact ')
mmf=$(worst "$ops" 'matmul +(F32|F16|BF16) .*f16=false' 'vs CPU backend ')
mmq=$(worst "$ops" 'matmul +[A-Z0-9_]*Q[0-9A-Z_]* .*f16=false' 'vs CPU backend ')
fix32=$(worst "$model" ' f32: vs exact' 'max|Δ| ')
fix16=$(worst "$model" ' f16: vs exact' 'KL ')
st_kl=$(first "$model" 'GPU vs transformers' 'mean KL ')
st_top=$(first "$model" 'GPU vs transformers' 'top-1 ')
sc_kl=$(first "$model" 'GPU vs CPU backend: mean KL' 'mean KL ')
sc_top=$(first "$model" 'GPU vs CPU backend: mean KL' 'top-1 ')

echo "Adapter: $(grep -m1 -o 'GPU .*adapter[^)]*)' "$ops" || head -1 "$ops"). duet $(git rev-parse --short HEAD)."
echo
echo "| what | f32 arithmetic | f16 products |"
echo "|---|---|---|"
echo "| element-wise and row ops (RMSNorm, RoPE, SwiGLU, add, bias, DEX) vs the CPU backend, normalised MSE | ≤ 1e-7 (measured ≤ $rowops) | (f32 always) |"
echo "| attention over the same cache bytes vs the CPU backend, normalised MSE | ≤ 1e-7, ≤ 1e-6 with an f16 cache (measured ≤ $attn, f16 ≤ $attn16) | (f32 always) |"
echo "| matmul, every weight type, vs exact arithmetic on the same dequantized weights | ≤ 1e-10 (measured ≤ $mm32) | ≤ 2e-6 (measured ≤ $mm16) |"
echo "| matmul vs the CPU backend's matmul with ggml's single Q8 activations (\`--cpu-acts q8\`) | F32/F16/BF16 ≤ 1e-7 (measured ≤ $mmf), quantized ≤ 1e-4 (measured ≤ $mmq) | same |"
echo "| fixture models (DiffLlama, Llama, DEX; F32, Q8_0, Q4_K_M) vs exact arithmetic | max abs. logit error ≤ 1e-3 (measured ≤ $fix32) | mean KL ≤ 1e-4 (measured ≤ $fix16) |"
echo "| SmolLM2-135M Q4_1, 512 tokens, vs transformers float32 | top-1 $st_top%, mean KL $st_kl | |"
echo "| SmolLM2-135M, 512 tokens, vs the CPU backend (two-level Q8 activations) | top-1 $sc_top%, mean KL $sc_kl (asserted ≥ 99%, ≤ 0.005) | |"
