#!/usr/bin/env bash
# The batch-invariance check on the real pair: greedy `sd` must give the token ids of greedy `target`.
# Starts `easd up` once, asks the pencil question and GSM8K development questions (train lines 2000.., the
# evaluation's prompt) in both modes and compares the token ids of each answer.
# Usage: scripts/greedy-equality.sh [questions] [max_tokens] [k]     (EASD_BIN: default target/release/easd)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
max_tokens=${2:-1024}
k=${3:-4}
easd=${EASD_BIN:-target/release/easd}
dataset=${DATASET:-../shared/data/gsm8k/train.jsonl}
out=${OUT_DIR:-/tmp/easd-greedy-equality}
mkdir -p "$out"
port=$((20000 + RANDOM % 20000))

"$easd" up --listen "127.0.0.1:$port" --no-http >"$out/up.log" 2>&1 &
up=$!
trap 'status=$?; kill $up 2>/dev/null; wait $up 2>/dev/null || true; exit $status' EXIT
for _ in $(seq 1 600); do
  "$easd" health "http://127.0.0.1:$port" >/dev/null 2>&1 && break
  sleep 0.5
done

questions=("A shop sells pencils at \$3 each. Emma buys 14 pencils and pays with a \$50 bill. How much change does she get?")
while IFS= read -r q; do questions+=("$q"); done < <(python3 - "$dataset" "$n" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()[2000:2000 + int(sys.argv[2])]
for l in lines:
    q = json.loads(l)["question"].replace("\n", " ")
    # The evaluation's prompt, on one line (the shell reads one question per line).
    print('Solve the following math problem step by step. End your response with a line of the form '
          '"The answer is N." where N is the final number. Question: ' + q)
PY
)

same=0; total=0
printf '%-9s %8s %8s %10s %10s  %s\n' question tokens sd_tok "target t/s" "sd t/s" "token ids"
for i in "${!questions[@]}"; do
  for mode in target sd; do
    "$easd" ask --coordinator "http://127.0.0.1:$port" --mode $mode --temperature 0 -k "$k" --max-tokens "$max_tokens" \
      --json "${questions[$i]}" >"$out/$i-$mode.json"
  done
  verdict=$(python3 - "$out/$i-target.json" "$out/$i-sd.json" <<'PY'
import json, sys
t, s = (json.load(open(p)) for p in sys.argv[1:3])
if t["token_ids"] == s["token_ids"]:
    print(f'{len(t["token_ids"])} {len(s["token_ids"])} {t["tokens_per_s"]:.2f} {s["tokens_per_s"]:.2f} identical')
else:
    first = next((j for j, (a, b) in enumerate(zip(t["token_ids"], s["token_ids"])) if a != b), min(len(t["token_ids"]), len(s["token_ids"])))
    print(f'{len(t["token_ids"])} {len(s["token_ids"])} {t["tokens_per_s"]:.2f} {s["tokens_per_s"]:.2f} DIFFER-at-token-{first}')
PY
)
  read -r tt st tr sr v <<<"$verdict"
  label=pencil; [ "$i" -gt 0 ] && label="gsm$((1999 + i))"
  printf '%-9s %8s %8s %10s %10s  %s\n' "$label" "$tt" "$st" "$tr" "$sr" "$v"
  total=$((total + 1)); [ "$v" = identical ] && same=$((same + 1))
done
echo "identical token ids: $same of $total answers (max_tokens $max_tokens, k $k)"
[ "$same" = "$total" ]
