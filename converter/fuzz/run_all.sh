#!/usr/bin/env bash
# A bounded libFuzzer run of every fuzz target: quant/fuzz's gguf_reader, converter/fuzz's
# safetensors_header, hf_config and tokenizer_json, and runtime/fuzz's chat_template and
# chat_template_budget, seeded from the test fixtures and runtime/fuzz/seeds. Builds with plain nightly and the sanitizer-coverage flags that
# cargo-fuzz would pass (converter/fuzz/README.md), AddressSanitizer included, into
# target/fuzz-cov (the first build compiles wgpu and tokenizers instrumented: ~40 min on 2
# cores). Prints one line per target: executions, seconds, crashes (files libFuzzer saved
# under converter/fuzz/artifacts or runtime/fuzz/artifacts); exits non-zero if any crashed.
#
#   converter/fuzz/run_all.sh             # 60 s per target
#   SECONDS_PER_TARGET=600 converter/fuzz/run_all.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
secs=${SECONDS_PER_TARGET:-60}
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
out=$root/target/fuzz-cov
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks \
-Zsanitizer=address"
for crate in quant converter runtime; do
  (cd "$root/$crate/fuzz" && cargo +nightly build --release --target "$triple" --target-dir "$out" -q)
done

# Seeds: what the readers meet in practice.
seed() { # crate target files...
  local dir=$root/$1/fuzz/corpus/$2
  mkdir -p "$dir"
  shift 2
  for f in "$@"; do [ -f "$f" ] && cp "$f" "$dir/$(echo "$f" | tr '/' '_')"; done
  return 0
}
fixtures=$root/tests/fixtures/models
seed quant gguf_reader "$root"/quant/tests/gguf-fixtures/*.gguf
seed converter safetensors_header "$fixtures"/*/model*.safetensors
seed converter hf_config "$fixtures"/*/config.json "$root"/models/*-ref/config.json
seed converter tokenizer_json "$fixtures"/*/tokenizer.json
seed runtime chat_template "$root"/models/*/chat_template.jinja
for f in "$fixtures"/*/tokenizer_config.json; do
  python3 -c 'import json, sys; t = json.load(open(sys.argv[1])).get("chat_template"); t and open(sys.argv[2], "w").write(t)' \
    "$f" "$root/runtime/fuzz/corpus/chat_template/$(basename "$(dirname "$f")").jinja"
done
seed runtime chat_template_budget "$root"/runtime/fuzz/seeds/chat_template_budget/*.jinja

failed=0
echo "| target | executions | seconds | crashes |"
echo "|---|---|---|---|"
# crate:target:largest input:largest single allocation (MB; the GGUF reader must never
# allocate more than the file implies):RSS limit (MB; the budget target's overruns park
# their threads, a depth overrun with up to 24 MiB of stack touched: ~1 GB a minute)
for t in quant:gguf_reader:8192:64:2048 converter:safetensors_header:65536:512:2048 \
  converter:hf_config:16384:512:2048 converter:tokenizer_json:65536:512:2048 \
  runtime:chat_template:4096:512:2048 runtime:chat_template_budget:4096:512:8192; do
  IFS=: read -r crate name max_len malloc_mb rss_mb <<<"$t"
  dir=$root/$crate/fuzz
  mkdir -p "$dir/artifacts/$name"
  log=$out/$name.log
  set +e
  (cd "$dir" && "$out/$triple/release/$name" "corpus/$name" -max_total_time="$secs" -max_len="$max_len" \
    -malloc_limit_mb="$malloc_mb" -rss_limit_mb="$rss_mb" -timeout=10 -artifact_prefix="artifacts/$name/") >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1/p' "$log")
  took=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$log")
  crashes=$(find "$dir/artifacts/$name" -type f | wc -l)
  [ "$rc" -eq 0 ] && [ "$crashes" -eq 0 ] || failed=1
  echo "| $name | ${runs:-?} | ${took:-?} | $crashes$([ "$rc" -ne 0 ] && echo " (exit $rc, see $log)") |"
done
exit $failed
