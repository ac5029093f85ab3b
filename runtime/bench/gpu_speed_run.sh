# The `run` step of runtime/bench/gpu_speed.sh (sourced by it; see there): on the GPU
# machine, from the repository root, with .gpu-carry/ made by `prepare` beside it.
#
# Device time is short (minutes a session), so the steps run in the order of what they
# tell, each only if the time left (RUN_BUDGET seconds from the start, default 540) covers
# what it needs; every result file is written as its rows come, so a run cut short still
# brings back what it measured:
#   1. the GPU kernel tests (runtime gpu_ops: every kernel and fallback against the CPU);
#   2. the card's copy bandwidth and the matvec kernel sweep (`duet bench --gpu-kernels
#      llama`: every variant on the 1.1B and 8B Llama matrices) -> kernels.md;
#   3. llama.cpp beside duet, pp512 and tg128, on the random 1.1B Llama (Q4_0, Q4_K_M,
#      Q8_0) and the same-shape DiffLlama -> gpu-speed.md; 3b. prefill with and without the
#      cooperative-matrix product (--gpu-tune coop=off); 3c. decode of an 8B-class Llama
#      (Llama-3-8B's shape, random weights, Q4_0 and Q4_K_M), both programs;
#   4. where the GPU time goes (`--gpu-profile`: decode, prefill, 4 streams, 4-bit cache
#      at depth) -> profiles.md;
#   5. decode under each --gpu-tune variant (fusion off, no subgroups, no trusted modules,
#      other matvec shapes, submission sizes) -> gpu-speed.md;
#   6. decode at depth 4,096, f16 and 4-bit caches, both programs, and the attention's
#      spread (--gpu-tune attn=N);
#   6b. several streams decoding together (--parallel 4 and 8, 8 under mvtok=1, 4, 16);
#   6c. `duet serve --device gpu --parallel 8` under 1 and 8 streamed clients;
#   7. other duet builds carried by `DUET_BASE=… prepare`, on the same card;
#   8. the same-shape DIFF V2;
#   9. the other GPU test binaries.
# SWEEP=0 leaves out the kernel sweep (step 2), TUNES=0 the --gpu-tune variants (step 5),
# COOP=0 the prefill rows with and without cooperative matrices (3b), EIGHT_B=0 the 8B-class
# Llama's decode (3c; also left out by QUICK=1 and MODELS=small), PROFILES=0 the
# profiles (4), DEPTH=0 decode at depth (6), STREAMS=0 several streams (6b, 6c); QUICK=1 makes and measures
# the Q4_0 Llama alone and leaves out step 3's table.

run() {
  local out=${OUT:-$PWD/target/gpu-speed}
  local deadline=$((SECONDS + ${RUN_BUDGET:-540}))
  # Whether `$1` seconds are left for the next step (else it is noted as skipped).
  time_for() {
    if [ $((deadline - SECONDS)) -ge "$1" ]; then return 0; fi
    echo "(skipped for time: $2)" | tee -a "$res" >&2
    return 1
  }
  mkdir -p "$out"
  local log=$out/run.log res=$out/gpu-speed.md kern=$out/kernels.md prof=$out/profiles.md
  : >"$log"
  : >"$res"
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

  # 1. The kernel tests: every kernel and fallback against the CPU backend.
  local tests_log=$out/gpu-tests.log t name failed=0
  : >"$tests_log"
  export DUET_REQUIRE_GPU=1 DUET_SKIP_LOG=$out/skips.txt
  # An NVIDIA card from Volta (compute capability 7.0) on has 16x16x16 f16 cooperative
  # matrices: their test must run, not skip.
  local cc
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 || true)
  if [ -n "$cc" ] && awk -v c="$cc" 'BEGIN { exit !(c + 0 >= 7.0) }'; then export DUET_REQUIRE_COOP=1; fi
  : >"$DUET_SKIP_LOG"
  run_tests() {
    for t in "$@"; do
      name=${t#*:}
      bench_say "test binary $name"
      echo "=== $name" >>"$tests_log"
      timeout 150 "$stage/target/release/deps/$name" --test-threads "$(nproc)" >>"$tests_log" 2>&1 || failed=1
    done
  }
  [ "${TESTS:-1}" = 1 ] && run_tests "duet-runtime:gpu_ops"

  # 2. Copy bandwidth (bytes read + written per second), then the matvec sweep.
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
  {
    echo "GPU: ${gpu:-unknown}; driver ${driver:-unknown}; copy bandwidth ${bw:-unmeasured} GB/s (torch, read + written)."
    echo "duet $(cat "$stage/commit") \`--device gpu\` (Vulkan through wgpu), llama.cpp 0c1e57098 \`llama-bench -ngl 99\` (Vulkan)."
    echo "Host: $(bench_machine)."
    echo
  } >>"$res"
  if [ "${MODELS:-}" != small ] && [ "${SWEEP:-1}" = 1 ] && time_for 150 "the matvec kernel sweep"; then
    bench_say "matvec kernel sweep"
    { echo "GPU: ${gpu:-unknown}; driver ${driver:-unknown}; copy bandwidth ${bw:-unmeasured} GB/s."; echo; } >"$kern"
    timeout 200 "$duet" bench --device gpu --gpu-kernels llama >>"$kern" 2>>"$log" || echo "(the sweep failed: see run.log)" >>"$kern"
  fi

  # 3. The models, and the two programs side by side.
  local models=() diff_model depth=4096 tg=128 pp=512 base
  if [ "${MODELS:-}" = small ]; then
    depth=256
    for m in llama-ref diff-ref; do
      [ -s "$BENCH/$m.q8_0.gguf" ] || "$duet" convert "models/$m" --type q8_0 -o "$BENCH/$m.q8_0.gguf" -q
    done
    models=("$BENCH/llama-ref.q8_0.gguf")
    diff_model=$BENCH/diff-ref.q8_0.gguf
  else
    local kinds=(llama diff) types=(q4_0 q4_k_m q8_0)
    # QUICK=1: the Q4_0 Llama alone, for runs that measure one change in a minute or two.
    [ "${QUICK:-0}" = 1 ] && kinds=(llama) types=(q4_0)
    for a in "${kinds[@]}"; do
      base=$BENCH/random-$a-1.1b
      if [ ! -s "$base.f16.gguf" ]; then
        bench_say "making the random 1.1B $a"
        bench_random_llama "$base" --dtype f16 $([ $a = diff ] && echo --diff) >>"$log"
        "$duet" convert "$base" --type f16 -o "$base.f16.gguf" -q
        rm -rf "$base"
      fi
    done
    for t in "${types[@]}"; do
      base=$BENCH/random-llama-1.1b
      [ -s "$base.$t.gguf" ] || "$duet" convert "$base.f16.gguf" --type "$t" -o "$base.$t.gguf" -q
      models+=("$base.$t.gguf")
    done
    diff_model=$BENCH/random-diff-1.1b.q4_0.gguf
    if [ "${QUICK:-0}" = 1 ]; then
      diff_model=
    elif [ ! -s "$diff_model" ]; then
      "$duet" convert "$BENCH/random-diff-1.1b.f16.gguf" --type q4_0 -o "$diff_model" -q
    fi
  fi
  {
    echo "-p $pp -n $tg -r 3:"
    echo
    echo "| model | llama.cpp pp$pp | duet pp$pp | ratio | llama.cpp tg$tg | duet tg$tg | ratio | duet tg weights GB/s (of copy bandwidth) |"
    echo "|---|---|---|---|---|---|---|---|"
  } >>"$res"
  local m lp lt dp dt dg share
  declare -A duet_tg=()
  # " (N%)": weights GB/s `$1` as a share of the card's copy bandwidth, where both are known.
  copy_share() { awk -v g="$1" -v b="${bw:-0}" 'BEGIN { if (b > 0 && g + 0 > 0) printf " (%.0f%%)", 100 * g / b }'; }
  for m in "${models[@]}" ${diff_model:+"$diff_model"}; do
    [ "${QUICK:-0}" = 1 ] && { echo "(left out: QUICK=1)" >>"$res"; break; }
    time_for 40 "$(basename "$m")" || continue
    bench_say "speed of $(basename "$m")"
    read -r lp lt < <(timeout 150 "$lbench" -m "$m" -ngl 99 -p $pp -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_llama_parse)
    read -r dp dt dg < <(timeout 150 "$duet" bench -m "$m" --device gpu -p $pp -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_duet_parse)
    duet_tg[$m]=$dt
    share=$(copy_share "$dg")
    echo "| $(basename "$m" .gguf) | $lp | $dp | $(bench_ratio "$dp" "$lp") | $lt | $dt | $(bench_ratio "$dt" "$lt") | $dg$share |" >>"$res"
  done
  {
    echo
    [ -z "$diff_model" ] || echo "duet, DiffLlama / same-shape Llama decode: $(bench_ratio "${duet_tg[$diff_model]:-}" "${duet_tg[${models[0]}]:-}") (llama.cpp does not run DiffLlama)."
    echo
    grep -h -E '^GPU work of' "$log" | sort -u | sed 's/^/    /' || true
    echo
    echo "Adapters (from the programs' own logs):"
    echo
    grep -h -E '^GPU adapter:|^ggml_vulkan: [0-9]+ =|^ggml_vulkan: No devices' "$log" | sort -u | sed 's/^/    /' || true
  } >>"$res"

  # 3b. Prefill with and without the cooperative-matrix (tensor-core) product.
  if [ "${COOP:-1}" = 1 ] && time_for 40 "prefill without cooperative matrices"; then
    {
      echo
      echo "Prefill pp$pp (-r 3) with the product on cooperative matrices (the default where the adapter has them, tiles of 128 tokens; and \`--gpu-tune cooptile=64\`) and without (\`--gpu-tune coop=off\`):"
      echo
      echo "| model | default | cooptile=64 | coop=off | default / coop=off |"
      echo "|---|---|---|---|---|"
    } >>"$res"
    local wp
    for m in "${models[@]}"; do
      time_for 20 "coop=off on $(basename "$m")" || break
      read -r dp x < <(timeout 60 "$duet" bench -m "$m" --device gpu -p $pp -n 0 -r 3 2>>"$log" | bench_duet_parse)
      read -r wp x < <(timeout 60 "$duet" bench -m "$m" --device gpu -p $pp -n 0 -r 3 --gpu-tune cooptile=64 2>>"$log" | bench_duet_parse)
      read -r lp x < <(timeout 60 "$duet" bench -m "$m" --device gpu -p $pp -n 0 -r 3 --gpu-tune coop=off 2>>"$log" | bench_duet_parse)
      echo "| $(basename "$m" .gguf) | $dp | $wp | $lp | $(bench_ratio "$dp" "$lp") |" >>"$res"
    done
  fi

  # 3c. An 8B-class Llama (Llama-3-8B's shape, converter/bench/make_random_llama.py --shape
  # 8b: ~4.5 GB at 4 bits), decode only: the size where the matvec streams its weights and
  # nothing else counts. Making it (16 GB of f16, then two conversions) takes ~1-2 minutes.
  if [ "${MODELS:-}" != small ] && [ "${QUICK:-0}" != 1 ] && [ "${EIGHT_B:-1}" = 1 ] && time_for 240 "the 8B shape"; then
    base=$BENCH/random-llama-8b
    if [ ! -s "$base.q4_0.gguf" ] || [ ! -s "$base.q4_k_m.gguf" ]; then
      bench_say "making the random 8B"
      # (A failure here is noted, not the end of the run: `run` is under set -e.)
      if bench_random_llama "$base" --dtype f16 --shape 8b >>"$log" 2>&1; then
        for t in q4_0 q4_k_m; do
          [ -s "$base.$t.gguf" ] || timeout 200 "$duet" convert "$base" --type "$t" -o "$base.$t.gguf" -q 2>>"$log" \
            || echo "(the 8B $t file could not be made: see run.log)" >>"$res"
        done
      else
        echo "(the 8B model could not be made: see run.log)" >>"$res"
      fi
      rm -rf "$base"
    fi
    {
      echo
      echo "An 8B-class Llama (random weights in Llama-3-8B's shape), decode -p 0 -n $tg -r 3:"
      echo
      echo "| model | llama.cpp tg$tg | duet tg$tg | ratio | duet weights GB/s (of copy bandwidth) |"
      echo "|---|---|---|---|---|"
    } >>"$res"
    for t in q4_0 q4_k_m; do
      m=$base.$t.gguf
      [ -s "$m" ] || continue
      time_for 40 "$(basename "$m")" || break
      bench_say "speed of $(basename "$m")"
      read -r x lt < <(timeout 150 "$lbench" -m "$m" -ngl 99 -p 0 -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_llama_parse)
      read -r x dt dg < <(timeout 150 "$duet" bench -m "$m" --device gpu -p 0 -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_duet_parse)
      share=$(copy_share "$dg")
      echo "| $(basename "$m" .gguf) | $lt | $dt | $(bench_ratio "$dt" "$lt") | $dg$share |" >>"$res"
    done
  fi

  # 4. Where duet's GPU time goes.
  : >"$prof"
  if [ "${PROFILES:-1}" = 1 ] && time_for 40 "the profiles"; then
    for m in "${models[@]:0:2}"; do
      echo "## $(basename "$m" .gguf): tg$tg" >>"$prof"
      timeout 60 "$duet" bench -m "$m" --device gpu --gpu-profile -p 0 -n $tg -r 1 2>>"$log" >>"$prof" || echo "(failed)" >>"$prof"
    done
    # Prefill (the prompt product) and a step of 4 streams (products of 4 tokens).
    echo "## $(basename "${models[0]}" .gguf): pp$pp" >>"$prof"
    timeout 60 "$duet" bench -m "${models[0]}" --device gpu --gpu-profile -p $pp -n 0 -r 1 2>>"$log" >>"$prof" || echo "(failed)" >>"$prof"
    echo "## $(basename "${models[0]}" .gguf): 4 streams, tg32" >>"$prof"
    timeout 60 "$duet" bench -m "${models[0]}" --device gpu --gpu-profile --parallel 4 -p 0 -n 32 -r 1 2>>"$log" >>"$prof" \
      || echo "(failed)" >>"$prof"
    echo "## $(basename "${models[0]}" .gguf): decode at depth $depth, q4c/q4r caches" >>"$prof"
    timeout 60 "$duet" bench -m "${models[0]}" --device gpu --gpu-profile --ctk q4c --ctv q4r -p 0 -n 32 -d $depth -r 1 2>>"$log" >>"$prof" \
      || echo "(failed)" >>"$prof"
  fi

  # 5. Decode under each kernel choice, the two main files.
  local tunes=("" "fuse=off" "subgroups=off" "trusted=off" "matvec=64x2" "matvec=128x1" "matvec=128x4" "matvec=256x2")
  local x nt v
  {
    echo
    echo "Decode tg$tg (-r 3) under --gpu-tune variants, and submission sizes (--gpu-submit-every):"
    echo
    echo "| variant | $(basename "${models[0]}" .gguf) | $(basename "${models[1]:-${models[0]}}" .gguf) |"
    echo "|---|---|---|"
  } >>"$res"
  for v in "${tunes[@]}" "submit=10" "submit=100" "submit=0"; do
    [ "${TUNES:-1}" = 1 ] || { echo "(left out: TUNES=0)" >>"$res"; break; }
    time_for 15 "tune $v" || break
    local row="| ${v:-default} |"
    for m in "${models[0]}" "${models[1]:-${models[0]}}"; do
      case $v in
        submit=*) read -r x nt x < <(timeout 60 "$duet" bench -m "$m" --device gpu -p 0 -n $tg -r 3 --gpu-submit-every "${v#submit=}" 2>>"$log" | bench_duet_parse) ;;
        "") nt=${duet_tg[$m]:-} ;;
        *) read -r x nt x < <(timeout 60 "$duet" bench -m "$m" --device gpu -p 0 -n $tg -r 3 --gpu-tune "$v" 2>>"$log" | bench_duet_parse) ;;
      esac
      row="$row $nt |"
    done
    echo "$row" >>"$res"
  done

  # 6. Decode at depth.
  local lc_f16 du_f16 lc_q4 du_q4
  if [ "${DEPTH:-1}" = 1 ] && time_for 60 "decode at depth $depth"; then
    {
      echo
      echo "Decode at depth $depth, $(basename "${models[0]}" .gguf) (-p 0 -n $tg -d $depth -r 2):"
      echo
      echo "| cache | llama.cpp tg$tg @ d$depth | duet tg$tg @ d$depth | ratio |"
      echo "|---|---|---|---|"
    } >>"$res"
    read -r x lc_f16 < <(timeout 100 "$lbench" -m "${models[0]}" -ngl 99 -fa 1 -p 0 -n $tg -d $depth -r 2 2>>"$log" | tee -a "$log" | bench_llama_parse)
    read -r x du_f16 x < <(timeout 100 "$duet" bench -m "${models[0]}" --device gpu -p 0 -n $tg -d $depth -r 2 2>>"$log" | tee -a "$log" | bench_duet_parse)
    echo "| f16 | $lc_f16 | $du_f16 | $(bench_ratio "$du_f16" "$lc_f16") |" >>"$res"
    read -r x lc_q4 < <(timeout 100 "$lbench" -m "${models[0]}" -ngl 99 -fa 1 -ctk q4_0 -ctv q4_0 -p 0 -n $tg -d $depth -r 2 2>>"$log" | tee -a "$log" | bench_llama_parse)
    read -r x du_q4 x < <(timeout 100 "$duet" bench -m "${models[0]}" --device gpu --ctk q4c --ctv q4r -p 0 -n $tg -d $depth -r 2 2>>"$log" | tee -a "$log" | bench_duet_parse)
    echo "| 4-bit (llama.cpp q4_0/q4_0, duet q4c/q4r) | $lc_q4 | $du_q4 | $(bench_ratio "$du_q4" "$lc_q4") |" >>"$res"
    echo >>"$res"
    echo "duet, 4-bit cache / f16 cache at depth $depth: $(bench_ratio "$du_q4" "$du_f16")." >>"$res"
    # The decode attention's spread (workgroups a row), f16 cache.
    local aw
    for aw in 1024 2048 8192; do
      time_for 20 "attn=$aw at depth" || break
      read -r x nt x < <(timeout 60 "$duet" bench -m "${models[0]}" --device gpu -p 0 -n $tg -d $depth -r 2 --gpu-tune "attn=$aw" 2>>"$log" | bench_duet_parse)
      echo "duet f16 cache at depth $depth with --gpu-tune attn=$aw: $nt t/s ($(bench_ratio "$nt" "$du_f16") the default's)." >>"$res"
    done
  fi

  # 6b. Several streams decoding together (what `duet serve --parallel` does): the
  # aggregate tokens/s of 4 and 8 sequences beside one (llama-bench has no such mode).
  if [ "${STREAMS:-1}" = 1 ] && time_for 40 "several streams"; then
    {
      echo
      echo "Decode of several streams together, $(basename "${models[0]}" .gguf) (\`duet bench --parallel N -p 0 -n 64 -r 2\`, aggregate t/s):"
      echo
      echo "| streams | aggregate tg64 | / one stream |"
      echo "|---|---|---|"
    } >>"$res"
    local np one
    for np in 1 4 8; do
      time_for 15 "--parallel $np" || break
      read -r x nt x < <(timeout 60 "$duet" bench -m "${models[0]}" --device gpu -p 0 -n 64 -r 2 --parallel $np 2>>"$log" | tee -a "$log" | bench_duet_parse)
      [ "$np" = 1 ] && one=$nt
      echo "| $np | $nt | $(bench_ratio "$nt" "${one:-}") |" >>"$res"
    done
    # The tokens' workgroups interleaved (the same rows' side by side) instead of one token
    # per dispatch z; products of a few tokens through the matvec up to mvtok=N (8 tokens
    # through the matmul: mvtok=4).
    for v in "4 mvinterleave=on" "8 mvinterleave=on" "8 mvtok=4" "8 mvtok=16"; do
      np=${v%% *} v=${v#* }
      time_for 15 "--parallel $np $v" || break
      read -r x nt x < <(timeout 60 "$duet" bench -m "${models[0]}" --device gpu -p 0 -n 64 -r 2 --parallel $np --gpu-tune "$v" 2>>"$log" | bench_duet_parse)
      echo "| $np, --gpu-tune $v | $nt | $(bench_ratio "$nt" "${one:-}") |" >>"$res"
    done
  fi

  # 6c. `duet serve --device gpu` under load (runtime/bench/serve_load.py: streamed
  # completions, greedy, 128 tokens each): one stream alone, then 8 at once, through the
  # server's own batching; the aggregate is what a server's users get together.
  if [ "${STREAMS:-1}" = 1 ] && time_for 150 "duet serve with 1 and 8 streams"; then
    local port=18291 spid sline
    "$duet" serve -m "${models[0]}" --device gpu -c 1024 --parallel 8 --port $port -q >>"$log" 2>&1 &
    spid=$!
    # (serve_load.py first waits up to 45 s for the server to answer.)
    sline=$(timeout 145 python3 runtime/bench/serve_load.py "http://127.0.0.1:$port" --wait 45 --streams 8 --tokens 128 --rounds 2 2>>"$log" || true)
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    echo "serve: $sline" >>"$log"
    {
      echo
      echo "\`duet serve --device gpu --parallel 8\`, $(basename "${models[0]}" .gguf), runtime/bench/serve_load.py (streamed, greedy, 128 tokens a reply, medians of 2 rounds):"
      echo
      python3 - "$sline" <<'PY' || echo "(no result: see run.log)"
import json, sys
m = json.loads(sys.argv[1])
print("| 1 stream t/s | 8 streams t/s (aggregate) | 8 / 1 | TTFT idle ms | TTFT with 7 streaming ms |")
print("|---|---|---|---|---|")
print(f"| {m['single_tps']:.1f} | {m['aggregate_tps']:.1f} | {m['aggregate_tps'] / m['single_tps']:.2f}× | "
      f"{m['ttft_idle_ms']:.0f} | {m['ttft_busy_ms']:.0f} |")
PY
    } >>"$res"
  fi

  # 7. Other builds carried by `DUET_BASE=… prepare`, on the same card in the same run.
  if [ -d "$stage/base" ]; then
    local b bt name
    {
      echo
      echo "Decode tg$tg (-r 3) of other duet builds beside this one ($(cat "$stage/commit")), same card, same run:"
      echo
      echo "| build | model | tg$tg | this build / it |"
      echo "|---|---|---|---|"
    } >>"$res"
    for m in "${models[@]}" "$diff_model"; do
      for b in "$stage"/base/*/duet; do
        time_for 12 "$(cat "$(dirname "$b")/name") on $(basename "$m")" || break 2
        name=$(cat "$(dirname "$b")/name")
        read -r x bt x < <(timeout 60 "$b" bench -m "$m" --device gpu -p 0 -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_duet_parse)
        echo "| $name | $(basename "$m" .gguf) | $bt | $(bench_ratio "${duet_tg[$m]:-}" "$bt") |" >>"$res"
      done
    done
  fi

  # 8. DIFF V2 of the same shape.
  if [ "${MODELS:-}" != small ] && time_for 90 "the DIFF V2 model"; then
    base=$BENCH/random-v2-1.1b
    if [ ! -s "$base.q4_0.gguf" ]; then
      bench_say "making the random 1.1B DIFF V2"
      bench_random_llama "$base" --dtype f16 --v2 >>"$log" && "$duet" convert "$base" --type q4_0 -o "$base.q4_0.gguf" -q
      rm -rf "$base"
    fi
    read -r x nt x < <(timeout 60 "$duet" bench -m "$base.q4_0.gguf" --device gpu -p 0 -n $tg -r 3 2>>"$log" | tee -a "$log" | bench_duet_parse)
    echo >>"$res"
    echo "duet, DIFF V2 / same-shape Llama decode (random-v2-1.1b.q4_0, tg$tg $nt): $(bench_ratio "$nt" "${duet_tg[${models[0]}]:-}")." >>"$res"
  fi

  # 9. The other GPU test binaries.
  if [ "${TESTS:-1}" = 1 ]; then
    local rest=()
    for t in "${gpu_tests[@]}"; do [ "$t" = "duet-runtime:gpu_ops" ] || rest+=("$t"); done
    if time_for 200 "the other GPU test binaries"; then run_tests "${rest[@]}"; fi
  fi
  {
    echo
    echo "GPU tests on this card: $(grep -c '^test result: ok' "$tests_log") binaries passed, $(grep -c '^test result: FAILED' "$tests_log") failed; skipped: $(wc -l <"$DUET_SKIP_LOG")."
    grep -E '^(=== |test result:|test .* FAILED)' "$tests_log" | sed 's/^/    /' || true
  } >>"$res"
  cat "$res"
  [ "$failed" = 0 ] || { echo "error: a GPU test failed (see $tests_log)" >&2; exit 1; }
}
