#!/usr/bin/env bash
# Cross-session batching: N concurrent greedy sd sessions on GSM8K development prompts (lines FIRST_LINE.. of the
# train split) against real worker processes, compared with the same requests one at a time — with batching on
# (the workers' defaults) and off (--batch-max-rows 1). For each: aggregate tok/s, per-session tok/s vs alone,
# p50/p99 latency, identical token ids vs alone, and the RSS of each process before/after (`easd bench sessions`).
#
# Usage: scripts/bench-batching.sh [out-dir]
#   CONCURRENCY=8 MAX_TOKENS=256 K=4 MODE=sd FIRST_LINE=2000 CONFIGS="on off" BATCH_WINDOW_MS=2
#   PIPELINE=true|false (default: the coordinator's, pipelined)   THREADS=0 (kernel threads per worker, 0 = all)
#   SPEC_OFF_AT=0 (the coordinator's --speculation-off-at: greedy sd runs the target alone while that many sessions
#   share the verifier; 0 = always speculate)
#   DRAFT_MODEL=draft TARGET_MODEL=target (the default pair, or GGUF paths, e.g. from `easd models tiny --dir D`)
#   BIN_DIR=target/release (easd, easd-draft, easd-verifier, easd-coordinator)   DATA=../shared/data/gsm8k/train.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/easd-batching}
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
concurrency=${CONCURRENCY:-8}
max_tokens=${MAX_TOKENS:-256}
k=${K:-4}
mode=${MODE:-sd}
first_line=${FIRST_LINE:-2000}
configs=${CONFIGS:-on off}
window=${BATCH_WINDOW_MS:-2}
spec_off_at=${SPEC_OFF_AT:-0}
threads=${THREADS:-0}
draft_model=${DRAFT_MODEL:-draft}
target_model=${TARGET_MODEL:-target}
data=${DATA:-../shared/data/gsm8k/train.jsonl}
mkdir -p "$out"

for b in easd easd-draft easd-verifier easd-coordinator; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: cargo build --release -p easd -p easd-services" >&2; exit 1; }
done
logs_at=$out
# shellcheck source=scripts/bench-procs.sh
source scripts/bench-procs.sh

pipeline_flag=()
[ -n "${PIPELINE:-}" ] && pipeline_flag=(--pipeline "$PIPELINE")
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)   output: $out"
for config in $configs; do
  case $config in
    on) batch=(--batch-window-ms "$window") ;;
    off) batch=(--batch-max-rows 1) ;;
    *) echo "unknown config $config (on|off)" >&2; exit 1 ;;
  esac
  dp=$(port); vp=$(port); cp=$(port)
  env EASD_THREADS="$threads" RUST_LOG=warn "$bin/easd-draft" --listen "127.0.0.1:$dp" --model "$draft_model" \
    "${batch[@]}" >"$out/draft-$config.log" 2>&1 &
  draft=$!; pids+=("$draft")
  env EASD_THREADS="$threads" RUST_LOG=warn "$bin/easd-verifier" --listen "127.0.0.1:$vp" --model "$target_model" \
    "${batch[@]}" >"$out/verifier-$config.log" 2>&1 &
  verifier=$!; pids+=("$verifier")
  wait_healthy "http://127.0.0.1:$dp"
  wait_healthy "http://127.0.0.1:$vp"
  RUST_LOG=warn "$bin/easd-coordinator" --listen "127.0.0.1:$cp" --draft "http://127.0.0.1:$dp" \
    --verifier "http://127.0.0.1:$vp" --tokenizer "$target_model" --speculation-off-at "$spec_off_at" >"$out/coordinator-$config.log" 2>&1 &
  coordinator=$!; pids+=("$coordinator")
  wait_healthy "http://127.0.0.1:$cp"
  echo "== batching $config, speculation off at $spec_off_at sessions (0: never)"
  "$bin/easd" bench sessions --coordinator "http://127.0.0.1:$cp" --concurrency "$concurrency" --data "$data" \
    --first-line "$first_line" --mode "$mode" -k "$k" --max-tokens "$max_tokens" "${pipeline_flag[@]}" \
    --pid "draft=$draft" --pid "verifier=$verifier" --pid "coordinator=$coordinator" --json "$out/batching-$config.json" \
    | tee "$out/batching-$config.txt"
  kill "$coordinator" "$draft" "$verifier" 2>/dev/null || true
  wait "$coordinator" "$draft" "$verifier" 2>/dev/null || true
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
