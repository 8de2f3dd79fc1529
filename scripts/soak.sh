#!/usr/bin/env bash
# Soak (issue 18): starts `easd up` on loopback with the real default pair (or the models given), then drives
# SESSIONS concurrent chat sessions of mixed modes (target / sd / easd in turn) through its OpenAI-compatible HTTP API
# for DURATION seconds, and reports per minute: completed requests, errors by status, p50/p99 latency and the RSS of
# every process (the `easd up` process, which holds the draft worker, the verifier and the coordinator, and the load
# driver). At the end it says whether each RSS levelled off (last minute's growth ≤ max(8 MiB, 1 %) — with the first
# minute's growth beside it). Bounded: no request starts after DURATION, each has REQUEST_TIMEOUT_S, and the whole
# run is killed at DURATION + REQUEST_TIMEOUT_S + 120 s; everything it started is stopped on exit. Traffic goes to
# 127.0.0.1 only. Questions: GSM8K development lines (FIRST_LINE, 0-based, default 2000), never the study's 5000+.
#
# Usage: scripts/soak.sh [out-dir]          (default /tmp/easd-soak-<UTC time>; writes summary.md there)
#   DURATION=600 SESSIONS=32 MODES=target,sd,easd MAX_TOKENS=128 REQUEST_TIMEOUT_S=300 SAMPLE_S=5
#   DRAFT_MODEL=draft TARGET_MODEL=target (the default pair, or GGUF paths / hf: names, e.g. the tiny pair from
#   `easd models tiny --dir D`)   THREADS=0   FIRST_LINE=2000   DATA=../shared/data/gsm8k/train.jsonl
#   BIN_DIR=target/release   UP_ARGS="--batch-window-ms 2" (more `easd up` flags)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/easd-soak-$(date -u +%Y%m%dT%H%M%SZ)}
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
duration=${DURATION:-600}
sessions=${SESSIONS:-32}
modes=${MODES:-target,sd,easd}
max_tokens=${MAX_TOKENS:-128}
request_timeout=${REQUEST_TIMEOUT_S:-300}
sample_s=${SAMPLE_S:-5}
draft_model=${DRAFT_MODEL:-draft}
target_model=${TARGET_MODEL:-target}
threads=${THREADS:-0}
first_line=${FIRST_LINE:-2000}
data=${DATA:-../shared/data/gsm8k/train.jsonl}
read -r -a up_args <<<"${UP_ARGS:-}"

[ -x "$bin/easd" ] || { echo "missing $bin/easd: cargo build --release -p easd" >&2; exit 1; }
[ -f "$data" ] || { echo "missing $data" >&2; exit 1; }
if [ "$first_line" -ge 5000 ] && [ "$first_line" -lt 6000 ]; then
  echo "FIRST_LINE=$first_line: lines 5000–5999 are the pre-registered study's (docs/STUDY-PROTOCOL.md)" >&2; exit 1
fi
mkdir -p "$out"
logs_at=$out
# shellcheck source=scripts/bench-procs.sh
source scripts/bench-procs.sh

cp=$(port); hp=$(port)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)   output: $out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
env EASD_THREADS="$threads" RUST_LOG=warn "$bin/easd" up --listen "127.0.0.1:$cp" --http-listen "127.0.0.1:$hp" \
  --draft-model "$draft_model" --target-model "$target_model" "${up_args[@]}" >"$out/up.log" 2>&1 &
up=$!; pids+=("$up")
wait_healthy "http://127.0.0.1:$cp"
# The HTTP API answers once the stack is up; /health is 200 only while draft and verifier serve.
for _ in $(seq 1 240); do
  curl -fsS "http://127.0.0.1:$hp/health" >/dev/null 2>&1 && break
  sleep 0.25
done
curl -fsS "http://127.0.0.1:$hp/health" >"$out/health.json" || { echo "HTTP API never healthy (see $out/up.log)" >&2; exit 1; }

echo "== soak: $sessions sessions ($modes), $duration s, max_tokens $max_tokens"
status=0
timeout --kill-after=10 "$((duration + request_timeout + 120))" python3 scripts/soak_load.py \
  --url "http://127.0.0.1:$hp" --out "$out" --duration-s "$duration" --sessions "$sessions" --modes "$modes" \
  --max-tokens "$max_tokens" --data "$data" --first-line "$first_line" --request-timeout-s "$request_timeout" \
  --sample-s "$sample_s" --pid "easd-up=$up" | tee "$out/driver.txt" || status=$?
alive=yes; kill -0 "$up" 2>/dev/null || alive="no (see up.log)"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
cleanup
trap - EXIT INT TERM

{
  echo "# Soak: $sessions concurrent sessions ($modes) for $duration s against \`easd up\`"
  echo
  echo "* when: $(date -u +%FT%TZ) (end); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'); host $(uname -n), $(nproc) cores"
  echo "* models: draft \`$draft_model\`, target \`$target_model\`; \`easd up\` threads ${threads} (0 = all cores), extra flags: ${UP_ARGS:-none}"
  echo "* load: greedy chat completions via the OpenAI API on 127.0.0.1, max_tokens $max_tokens, one request at a time per session, GSM8K train lines $first_line+ as questions; request timeout $request_timeout s"
  echo "* load average before / after: $load_before / $load_after; \`easd up\` alive at the end: $alive; driver exit status $status"
  echo
  echo "## Per minute"
  echo
  echo "Requests count in the minute they finished (the last minute also takes those finishing after the duration). RSS: the last sample (every $sample_s s) at or before the minute's end."
  echo
  if [ -f "$out/minutes.md" ]; then cat "$out/minutes.md"; else echo "(no minutes table: the driver failed, see driver.txt)"; fi
  echo
  echo "## Totals and memory"
  echo
  if [ -f "$out/driver.txt" ]; then sed -n '/^completed /,$p' "$out/driver.txt" | sed 's/^/* /'; fi
  echo
  echo "Files: requests.csv (every request), rss.csv (every sample), summary.json, up.log, driver.txt."
} >"$out/summary.md"
echo "summary: $out/summary.md"
exit "$status"
