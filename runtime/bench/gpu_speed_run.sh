# The `run` step of runtime/bench/gpu_speed.sh (sourced by it; see there): on the GPU
# machine, from the repository root, with .gpu-carry/ made by `prepare` beside it.

run() {
  local out=${OUT:-$PWD/target/gpu-speed}
  mkdir -p "$out"
  local log=$out/run.log
  : >"$log"
  [ -f "$carry/bin.tar.xz" ] || { echo "error: no $carry/bin.tar.xz: run 'runtime/bench/gpu_speed.sh prepare' first" >&2; exit 1; }
  # The Vulkan loader, where the image has none (the device tool's recipe: unpacked into /).
  if ! ldconfig -p | grep -q 'libvulkan.so.1'; then
    for f in "$carry"/loader/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -f "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then
    export VK_DRIVER_FILES=$icd __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  fi
  export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg-$$}
  mkdir -p "$XDG_RUNTIME_DIR"
  local stage=$PWD/target/gpu-carry
  rm -rf "$stage" && mkdir -p "$stage"
  xz -dc "$carry/bin.tar.xz" | tar -C "$stage" -xf -
  # The test binaries find the fixtures and the duet binary under the folder they were
  # built in: on another machine, put the binaries here and make that path lead here (a dry
  # run where they were built leaves that build alone; a machine whose copy of the tree has
  # the build's path still lacks target/, which is not carried).
  local root
  root=$(cat "$stage/build-root")
  if [ "$root" != "$PWD" ] || [ ! -x target/release/duet ]; then
    mkdir -p target/release/deps
    cp "$stage/target/release/duet" target/release/duet
    cp "$stage"/target/release/deps/* target/release/deps/
    [ -e "$root" ] || { mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root"; }
  fi
  local duet=$stage/target/release/duet lbench=$stage/llama/llama-bench
  local gpu driver
  gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
  bench_say "GPU: ${gpu:-unknown}, driver ${driver:-unknown}"

  # 1. The GPU tests.
  local tests_log=$out/gpu-tests.log t name failed=0
  : >"$tests_log"
  export DUET_REQUIRE_GPU=1 DUET_SKIP_LOG=$out/skips.txt
  : >"$DUET_SKIP_LOG"
  [ "${TESTS:-1}" = 1 ] || gpu_tests=()
  for t in "${gpu_tests[@]}"; do
    name=${t#*:}
    bench_say "test binary $name"
    echo "=== $name" >>"$tests_log"
    timeout 180 "$stage/target/release/deps/$name" --test-threads "$(nproc)" >>"$tests_log" 2>&1 || failed=1
  done
  grep -E '^(=== |test result:|test .* FAILED|failures:|SKIPPED)' "$tests_log" >&2 || true
  unset DUET_REQUIRE_GPU

  # 2. The models.
  local models=() diff_model depth=4096 tg=128 pp=512
  if [ "${MODELS:-}" = small ]; then
    depth=256
    for m in llama-ref diff-ref; do
      [ -s "$BENCH/$m.q8_0.gguf" ] || "$duet" convert "models/$m" -t q8_0 -o "$BENCH/$m.q8_0.gguf" -q
    done
    models=("$BENCH/llama-ref.q8_0.gguf")
    diff_model=$BENCH/diff-ref.q8_0.gguf
  else
    local base
    for a in llama diff; do
      base=$BENCH/random-$a-1.1b
      if [ ! -s "$base.f16.gguf" ]; then
        bench_say "making the random 1.1B $a"
        bench_random_llama "$base" --dtype f16 $([ $a = diff ] && echo --diff) >>"$log"
        "$duet" convert "$base" -t f16 -o "$base.f16.gguf" -q
        rm -rf "$base"
      fi
    done
    for t in q4_0 q4_k_m q8_0; do
      base=$BENCH/random-llama-1.1b
      [ -s "$base.$t.gguf" ] || "$duet" convert "$base.f16.gguf" -t "$t" -o "$base.$t.gguf" -q
      models+=("$base.$t.gguf")
    done
    diff_model=$BENCH/random-diff-1.1b.q4_0.gguf
    [ -s "$diff_model" ] || "$duet" convert "$BENCH/random-diff-1.1b.f16.gguf" -t q4_0 -o "$diff_model" -q
  fi

  # 3. Speed. The card's copy bandwidth first (bytes read + written per second).
  local bw
  bw=$(python3 - 2>>"$log" <<'PY' || true
import torch
x = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20):
    y.copy_(x)
e.record()
torch.cuda.synchronize()
print(f"{2 * x.numel() * 4 * 20 / (s.elapsed_time(e) / 1e3) / 1e9:.0f}")
PY
  )
  local res=$out/gpu-speed.md
  {
    echo "GPU: ${gpu:-unknown}; driver ${driver:-unknown}; copy bandwidth ${bw:-unmeasured} GB/s (torch, read + written)."
    echo "duet $(cat "$stage/commit") \`--device gpu\` (Vulkan through wgpu), llama.cpp 0c1e57098 \`llama-bench -ngl 99\` (Vulkan);"
    echo "-p $pp -n $tg -r 3; depth rows -p 0 -n $tg -d $depth -r 2. Host: $(bench_machine)."
    echo
    echo "| model | llama.cpp pp$pp | duet pp$pp | ratio | llama.cpp tg$tg | duet tg$tg | ratio | duet tg weights GB/s (of copy bandwidth) |"
    echo "|---|---|---|---|---|---|---|---|"
  } >"$res"
  local m lp lt dp dt dg share
  declare -A duet_tg=()
  for m in "${models[@]}" "$diff_model"; do
    bench_say "speed of $(basename "$m")"
    read -r lp lt < <(timeout 150 "$lbench" -m "$m" -ngl 99 -p $pp -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_llama_parse)
    read -r dp dt dg < <(timeout 150 "$duet" bench -m "$m" --device gpu -p $pp -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_duet_parse)
    duet_tg[$m]=$dt
    share=$(awk -v g="$dg" -v b="${bw:-0}" 'BEGIN { if (b > 0 && g + 0 > 0) printf " (%.0f%%)", 100 * g / b }')
    echo "| $(basename "$m" .gguf) | $lp | $dp | $(bench_ratio "$dp" "$lp") | $lt | $dt | $(bench_ratio "$dt" "$lt") | $dg$share |" >>"$res"
  done
  {
    echo
    echo "Decode at depth $depth, $(basename "${models[0]}" .gguf):"
    echo
    echo "| cache | llama.cpp tg$tg @ d$depth | duet tg$tg @ d$depth | ratio |"
    echo "|---|---|---|---|"
  } >>"$res"
  local lc_f16 du_f16 lc_q4 du_q4 x
  read -r x lc_f16 < <(timeout 150 "$lbench" -m "${models[0]}" -ngl 99 -fa 1 -p 0 -n $tg -d $depth -r 2 2>>"$log" | tee -a "$log" | bench_llama_parse)
  read -r x du_f16 x < <(timeout 150 "$duet" bench -m "${models[0]}" --device gpu -p 0 -n $tg -d $depth -r 2 2>>"$log" | tee -a "$log" | bench_duet_parse)
  read -r x lc_q4 < <(timeout 150 "$lbench" -m "${models[0]}" -ngl 99 -fa 1 -ctk q4_0 -ctv q4_0 -p 0 -n $tg -d $depth -r 2 2>>"$log" | tee -a "$log" | bench_llama_parse)
  read -r x du_q4 x < <(timeout 150 "$duet" bench -m "${models[0]}" --device gpu --ctk q4c --ctv q4r -p 0 -n $tg -d $depth -r 2 2>>"$log" | tee -a "$log" | bench_duet_parse)
  {
    echo "| f16 | $lc_f16 | $du_f16 | $(bench_ratio "$du_f16" "$lc_f16") |"
    echo "| 4-bit (llama.cpp q4_0/q4_0, duet q4c/q4r) | $lc_q4 | $du_q4 | $(bench_ratio "$du_q4" "$lc_q4") |"
    echo
    echo "duet, 4-bit cache / f16 cache at depth $depth: $(bench_ratio "$du_q4" "$du_f16")."
    echo "duet, DiffLlama / same-shape Llama decode ($(basename "$diff_model" .gguf) / $(basename "${models[0]}" .gguf)): $(bench_ratio "${duet_tg[$diff_model]}" "${duet_tg[${models[0]}]}") (llama.cpp does not run DiffLlama)."
    echo
    echo "Adapters (from the programs' own logs):"
    echo
    grep -h -E '^GPU adapter:|^ggml_vulkan: [0-9]+ =|^ggml_vulkan: No devices' "$log" | sort -u | sed 's/^/    /'
  } >>"$res"

  # Other builds carried by `DUET_BASE=… prepare`, if any: decode beside this one, and this
  # one submitting once per token (the host's time then comes before the GPU's).
  if [ -d "$stage/base" ]; then
    local b bt nt name
    declare -A this_tg=()
    {
      echo
      echo "Decode of other duet builds and of this one ($(cat "$stage/commit")), same card, same run:"
      echo
      echo "| build | model | tg$tg | this build / it |"
      echo "|---|---|---|---|"
    } >>"$res"
    for m in "${models[@]}" "$diff_model"; do
      read -r x nt x < <(timeout 150 "$duet" bench -m "$m" --device gpu -p 0 -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_duet_parse)
      this_tg[$m]=$nt
      echo "| this | $(basename "$m" .gguf) | $nt | |" >>"$res"
      for b in "$stage"/base/*/duet; do
        name=$(cat "$(dirname "$b")/name")
        read -r x bt x < <(timeout 150 "$b" bench -m "$m" --device gpu -p 0 -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_duet_parse)
        echo "| $name | $(basename "$m" .gguf) | $bt | $(bench_ratio "$nt" "$bt") |" >>"$res"
      done
    done
    m=${models[0]}
    nt=${this_tg[$m]}
    read -r x bt x < <(timeout 150 "$duet" bench -m "$m" --device gpu --gpu-submit-every 0 -p 0 -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_duet_parse)
    echo "| this, one submission per token | $(basename "$m" .gguf) | $bt | $(bench_ratio "$nt" "$bt") |" >>"$res"
    for b in "$stage"/base/*/duet; do
      name=$(cat "$(dirname "$b")/name")
      read -r x bt x < <(timeout 150 "$b" bench -m "$m" --device gpu -p 0 -n $tg -d $depth -r 2 2>>"$log" | tee -a "$log" | bench_duet_parse)
      echo "| $name | $(basename "$m" .gguf) @ d$depth f16 | $bt | $(bench_ratio "$du_f16" "$bt") |" >>"$res"
    done
  fi

  # 4. Where duet's GPU time goes.
  local prof=$out/profiles.md
  : >"$prof"
  for m in "${models[0]}" "$diff_model"; do
    echo "## $(basename "$m" .gguf): pp$pp and tg$tg" >>"$prof"
    timeout 150 "$duet" bench -m "$m" --device gpu --gpu-profile -p $pp -n $tg -r 1 2>>"$log" >>"$prof" || echo "(failed)" >>"$prof"
  done
  echo "## $(basename "${models[0]}" .gguf): decode at depth $depth, f16 and q4c/q4r caches" >>"$prof"
  timeout 150 "$duet" bench -m "${models[0]}" --device gpu --gpu-profile -p 0 -n 32 -d $depth -r 1 2>>"$log" >>"$prof" || echo "(failed)" >>"$prof"
  timeout 150 "$duet" bench -m "${models[0]}" --device gpu --gpu-profile --ctk q4c --ctv q4r -p 0 -n 32 -d $depth -r 1 2>>"$log" >>"$prof" \
    || echo "(failed)" >>"$prof"

  {
    echo
    echo "GPU tests on this card: $(grep -c '^test result: ok' "$tests_log") binaries passed, $(grep -c '^test result: FAILED' "$tests_log") failed; skipped: $(wc -l <"$DUET_SKIP_LOG")."
  } >>"$res"
  cat "$res"
  [ "$failed" = 0 ] || { echo "error: a GPU test failed (see $tests_log)" >&2; exit 1; }
}
