#!/usr/bin/env bash
# Per-mode speed and acceptance on the real pair, through the whole system (gRPC, coordinator, workers):
# starts `easd up` once, asks the same question in each mode (greedy), prints one row per mode.
# Usage: scripts/bench-modes.sh [max_tokens] [k]     (EASD_BIN: the easd binary, default target/release/easd)
set -euo pipefail
cd "$(dirname "$0")/.."
max_tokens=${1:-256}
k=${2:-4}
easd=${EASD_BIN:-target/release/easd}
port=$((20000 + RANDOM % 20000))
question='A shop sells pencils at $3 each. Emma buys 14 pencils and pays with a $50 bill. How much change does she get?'

"$easd" up --listen "127.0.0.1:$port" --no-http >/tmp/easd-bench-up.log 2>&1 &
up=$!
trap 'status=$?; kill $up 2>/dev/null; wait $up 2>/dev/null || true; exit $status' EXIT
for _ in $(seq 1 600); do
  "$easd" health "http://127.0.0.1:$port" >/dev/null 2>&1 && break
  sleep 0.5
done

printf '%-7s %7s %9s %8s %10s %9s %9s %8s %10s\n' mode tokens "tok/s" accept "acc/block" triggers forwards "ovhd %" answer
for mode in target draft sd easd; do
  "$easd" ask --coordinator "http://127.0.0.1:$port" --mode "$mode" --temperature 0 -k "$k" \
      --max-tokens "$max_tokens" --json "$question" > "/tmp/easd-bench-$mode.json"
  python3 - "$mode" <<'PY'
import json, re, sys
mode = sys.argv[1]
a = json.load(open(f"/tmp/easd-bench-{mode}.json"))
nums = re.findall(r"-?\d+(?:\.\d+)?", a["text"].replace(",", ""))
overhead = 100 * a["overhead_s"] / a["wall_s"] if a["wall_s"] else 0
print(f'{mode:<7} {a["generated_tokens"]:>7} {a["tokens_per_s"]:>9.2f} {a["acceptance_rate"]:>8.3f} '
      f'{a["mean_accepted_len"]:>10.2f} {a["easd_triggers"]:>9} {a["target_forwards"]:>9} {overhead:>8.2f} '
      f'{(nums[-1] if nums else "-"):>10}')
PY
done
