#!/usr/bin/env bash
# The real pair with two verifier processes: ask a question, SIGKILL the verifier serving it mid-answer, and
# compare with an undisturbed run of the same request. Usage: scripts/real-failover.sh [max_tokens]
set -euo pipefail
cd "$(dirname "$0")/.."
max_tokens=${1:-200}
bin=${EASD_BIN_DIR:-target/release}
base=$((20000 + RANDOM % 20000))
d=$base; v1=$((base + 1)); v2=$((base + 2)); c=$((base + 3)); m=$((base + 4))
question='A shop sells pencils at $3 each. Emma buys 14 pencils and pays with a $50 bill. How much change does she get?'
log=/tmp/easd-failover; mkdir -p $log
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT

"$bin/easd-draft" --listen 127.0.0.1:$d --model draft >$log/draft.log 2>&1 & pids+=($!)
"$bin/easd-verifier" --listen 127.0.0.1:$v1 --model target >$log/v1.log 2>&1 & pids+=($!); v1_pid=$!
"$bin/easd-verifier" --listen 127.0.0.1:$v2 --model target >$log/v2.log 2>&1 & pids+=($!); v2_pid=$!
for p in $d $v1 $v2; do
  until "$bin/easd" health http://127.0.0.1:$p >/dev/null 2>&1; do sleep 0.5; done
done
"$bin/easd-coordinator" --listen 127.0.0.1:$c --metrics-listen 127.0.0.1:$m --draft http://127.0.0.1:$d \
    --verifier http://127.0.0.1:$v1 --verifier http://127.0.0.1:$v2 --call-timeout-s 20 --health-interval-s 0.5 \
    >$log/coordinator.log 2>&1 & pids+=($!)
until "$bin/easd" health http://127.0.0.1:$c >/dev/null 2>&1; do sleep 0.5; done

ask() { "$bin/easd" ask --coordinator http://127.0.0.1:$c --mode sd --temperature 0 --max-tokens "$max_tokens" --json "$question"; }
start=$(date +%s.%N)
ask > $log/reference.json
echo "reference run: $(python3 -c "import json;a=json.load(open('$log/reference.json'));print(a['generated_tokens'],'tokens,',round(a['wall_s'],1),'s, verifiers',a['verifiers'])")"

ask > $log/killed.json &
ask_pid=$!
# Wait until the answer is well under way, then kill the replica the coordinator's gauge names.
sleep "${KILL_AFTER_S:-4}"
victim=$(curl -s http://127.0.0.1:$m/metrics | awk '/^easd_coordinator_live_sessions\{/ && $NF > 0 {print}' | grep -o "127.0.0.1:[0-9]*" | head -1)
case "$victim" in
  *:$v1) kill -9 $v1_pid; echo "killed verifier 1 ($victim) mid-answer" ;;
  *:$v2) kill -9 $v2_pid; echo "killed verifier 2 ($victim) mid-answer" ;;
  *) echo "no live session found in the metrics (answer already done?)"; exit 1 ;;
esac
wait $ask_pid
python3 - "$log" <<'PY'
import json, sys
log = sys.argv[1]
ref, got = (json.load(open(f"{log}/{n}.json")) for n in ("reference", "killed"))
same = ref["token_ids"] == got["token_ids"]
print(f"after the kill: {got['generated_tokens']} tokens in {got['wall_s']:.1f} s, failovers {got['failovers']}, "
      f"verifiers {got['verifiers']}, identical to the reference: {same}")
print("answer tail:", repr(got["text"][-120:]))
sys.exit(0 if same and got["failovers"] >= 1 else 1)
PY
echo "total $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
