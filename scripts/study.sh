#!/usr/bin/env bash
# The pre-registered study of docs/STUDY-PROTOCOL.md: GSM8K train lines 5000–5999 (0-based), modes target, sd and
# easd (τ 0.449 / 0.283, ρ 0.8, N 5), greedy, 1,024 max tokens. Resumable: rerun the same command and finished
# lines are skipped. After the run it rewrites the report over all three modes from the stored results, with the
# pre-registered tests (easd vs target primary, easd vs sd secondary, Holm over the two).
#
# Usage: scripts/study.sh [out-dir]        (default docs/eval/study-2026-12)
#   MODES=target,sd,easd  the modes this session runs: all three problem-major (the plan), or one at a time
#   CONCURRENCY=8         requests in flight (batching on; the runtime is batch-invariant, so tokens do not change)
#   BIN_DIR=target/release   DATASET=../shared/data/gsm8k/train.jsonl   EXTRA_ARGS="--threads 2" (passed to eval)
#   REPORT_ONLY=1         only rewrite the report from the stored results (no model loads)
# Do not change the study's fixed values here (slice, n, thresholds, decoding): they are the protocol.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/eval/study-2026-12}
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
modes=${MODES:-target,sd,easd}
concurrency=${CONCURRENCY:-8}
dataset=${DATASET:-../shared/data/gsm8k/train.jsonl}
read -r -a extra <<<"${EXTRA_ARGS:-}"

[ -x "$bin/easd" ] || { echo "missing $bin/easd: cargo build --release -p easd" >&2; exit 1; }
[ -f "$dataset" ] || { echo "missing $dataset" >&2; exit 1; }
case ",$modes," in
  *,draft,*) echo "MODES=$modes: the study runs target, sd and easd only" >&2; exit 1 ;;
esac

# The protocol's fixed settings (docs/STUDY-PROTOCOL.md, "Design").
study=(--dataset "$dataset" --out "$out" --offset 5000 --limit 1000
  --temperature 0 --top-p 1 --top-k 0 --seed 0 -k 4 --max-tokens 1024
  --tau-draft 0.44877332 --tau-target 0.28269166 --rho 0.8 --top-n 5 --order after-sd
  --calibration docs/eval/calibration/target-greedy-12q.json)

mkdir -p "$out"
log="$out/sessions.log"
if [ -z "${REPORT_ONLY:-}" ]; then
  echo "$(date -u +%FT%TZ) start: modes $modes, concurrency $concurrency, load $(cut -d' ' -f1-3 /proc/loadavg)" \
    | tee -a "$log"
  status=0
  "$bin/easd" eval "${study[@]}" --modes "$modes" --concurrency "$concurrency" "${extra[@]}" || status=$?
  echo "$(date -u +%FT%TZ) end: exit $status, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
fi
# The report over all three modes, whatever this session ran; nothing is generated.
"$bin/easd" eval "${study[@]}" --modes target,sd,easd --compare easd:target,easd:sd --report-only
exit "${status:-0}"
