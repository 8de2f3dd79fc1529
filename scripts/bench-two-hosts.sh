#!/usr/bin/env bash
# Two simulated hosts on one machine: the draft worker pinned to core 0 and the verifier to core 1, one thread each,
# each behind a latency-injecting TCP proxy of the project's own (`easd bench proxy`, a per-chunk one-way delay)
# between it and the coordinator. Greedy, k = 4. For each one-way delay it reports tok/s of: the target alone, sd
# with the sequential loop, sd pipelined with blocks of k (`sd-fixed`: a coordinator started with --max-block k),
# sd pipelined with growing blocks (`sd-pipe`: up to MAX_BLOCK, at least the adaptive floor — the coordinator's
# defaults), easd pipelined (blocks of k) and, when asked for, `sd-grow` (growing blocks of at least k: a coordinator
# started with --adaptive-blocks false) and easd sequential — and whether each pipelined run produced the token ids
# of the sequential run of its mode.
#
# Usage: scripts/bench-two-hosts.sh [out.tsv]
#   DELAYS="0 1 5"         one-way delays (ms) for the pencil question
#   GSM8K_DELAYS="1"        one-way delays for the GSM8K prompts (lines GSM8K_LINES of the train split)
#   GSM8K_LINES="2000,2004" MAX_TOKENS=256 K=4 MAX_BLOCK=8 MODES="target sd-seq sd-fixed sd-pipe easd-pipe"
#                           (also: sd-grow, and easd-seq, run before easd-pipe so that the two are compared)
#   BIN_DIR=target/release  (easd, easd-draft, easd-verifier, easd-coordinator)
#   DRAFT_HEAD_VOCAB=0      the draft scores only N ids and the special tokens (0: the whole vocabulary): the first
#                           N of DRAFT_HEAD_RANKING (a file of ids, most frequent first), else the lowest ids
#   DATA=../shared/data/gsm8k/train.jsonl   ASK_TIMEOUT_S=600 (each request; the script always ends)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/easd-two-hosts.tsv}
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
delays=${DELAYS:-0 1 5}
gsm8k_delays=${GSM8K_DELAYS:-1}
gsm8k_lines=${GSM8K_LINES:-2000,2004}
max_tokens=${MAX_TOKENS:-256}
k=${K:-4}
max_block=${MAX_BLOCK:-8}
modes=${MODES:-target sd-seq sd-fixed sd-pipe easd-pipe}
data=${DATA:-../shared/data/gsm8k/train.jsonl}
ask_timeout=${ASK_TIMEOUT_S:-600}
draft_head=(--head-vocab "${DRAFT_HEAD_VOCAB:-0}")
[ -n "${DRAFT_HEAD_RANKING:-}" ] && draft_head+=(--head-ranking "$DRAFT_HEAD_RANKING")
log=$(mktemp -d /tmp/easd-two-hosts.XXXXXX)
pencil='A shop sells pencils at $3 each. Emma buys 14 pencils and pays with a $50 bill. How much change does she get?'

for b in easd easd-draft easd-verifier easd-coordinator; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: cargo build --release -p easd -p easd-services" >&2; exit 1; }
done
nproc_all=$(nproc --all)
[ "$nproc_all" -ge 2 ] || { echo "needs two cores" >&2; exit 1; }

logs_at=$log
# shellcheck source=scripts/bench-procs.sh
source scripts/bench-procs.sh

# The two "hosts": one core and one thread each.
one_thread=(env EASD_THREADS=1 CANDLE_NUM_THREADS=1 RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1 RUST_LOG=warn)
dp=$(port); vp=$(port)
taskset -c 0 "${one_thread[@]}" "$bin/easd-draft" --listen "127.0.0.1:$dp" --model draft \
  "${draft_head[@]}" >"$log/draft.log" 2>&1 &
pids+=($!)
taskset -c 1 "${one_thread[@]}" "$bin/easd-verifier" --listen "127.0.0.1:$vp" --model target >"$log/verifier.log" 2>&1 &
pids+=($!)
wait_healthy "http://127.0.0.1:$dp"
wait_healthy "http://127.0.0.1:$vp"

# Questions: the pencil question, then the GSM8K development prompts.
mapfile -t questions < <(sed -n "${gsm8k_lines}p" "$data" | python3 -c 'import json,sys; [print(json.loads(l)["question"].replace("\n"," ")) for l in sys.stdin]')

ask() { # url mode pipeline question -> json file
  local url=$1 mode=$2 pipeline=$3 question=$4 file=$5
  timeout "$ask_timeout" "$bin/easd" ask --coordinator "$url" --mode "$mode" --pipeline "$pipeline" --temperature 0 \
    -k "$k" --max-tokens "$max_tokens" --json "$question" >"$file"
}

printf 'delay_ms\tquestion\tmode\ttokens\twall_s\ttok_s\taccept\tkept\tdropped\tsame_tokens_as_seq\n' >"$out"
run_delay() { # delay question-indices…
  local delay=$1; shift
  local pdp pvp cp fp gp
  pdp=$(port); pvp=$(port); cp=$(port); fp=$(port); gp=$(port)
  "$bin/easd" bench proxy --listen "127.0.0.1:$pdp" --upstream "127.0.0.1:$dp" --delay-ms "$delay" --max-seconds 7200 >>"$log/proxy.log" 2>&1 &
  pids+=($!)
  "$bin/easd" bench proxy --listen "127.0.0.1:$pvp" --upstream "127.0.0.1:$vp" --delay-ms "$delay" --max-seconds 7200 >>"$log/proxy.log" 2>&1 &
  pids+=($!)
  RUST_LOG=warn "$bin/easd-coordinator" --listen "127.0.0.1:$cp" --draft "http://127.0.0.1:$pdp" \
    --verifier "http://127.0.0.1:$pvp" --tokenizer target --max-block "$max_block" >"$log/coordinator-$delay.log" 2>&1 &
  local coord=$!
  pids+=($coord)
  # The same workers behind a coordinator whose pipelined blocks stay at k.
  RUST_LOG=warn "$bin/easd-coordinator" --listen "127.0.0.1:$fp" --draft "http://127.0.0.1:$pdp" \
    --verifier "http://127.0.0.1:$pvp" --tokenizer target --max-block "$k" >"$log/coordinator-fixed-$delay.log" 2>&1 &
  local fixed=$!
  pids+=($fixed)
  # And behind one whose growing blocks take at least k (no adaptive floor).
  RUST_LOG=warn "$bin/easd-coordinator" --listen "127.0.0.1:$gp" --draft "http://127.0.0.1:$pdp" \
    --verifier "http://127.0.0.1:$pvp" --tokenizer target --max-block "$max_block" --adaptive-blocks false \
    >"$log/coordinator-grow-$delay.log" 2>&1 &
  local grow=$!
  pids+=($grow)
  wait_healthy "http://127.0.0.1:$cp"
  wait_healthy "http://127.0.0.1:$fp"
  wait_healthy "http://127.0.0.1:$gp"
  for qi in "$@"; do
    local question name
    if [ "$qi" = pencil ]; then question=$pencil; name=pencil; else question=${questions[$qi]}; name="gsm8k-$qi"; fi
    for m in $modes; do
      local mode=${m%-*} pipeline=true url="http://127.0.0.1:$cp"
      case $m in *-seq) pipeline=false ;; esac
      [ "$m" = target ] && mode=target
      [ "$m" = sd-fixed ] && url="http://127.0.0.1:$fp"
      [ "$m" = sd-grow ] && url="http://127.0.0.1:$gp"
      local file="$log/$delay-$name-$m.json"
      ask "$url" "$mode" "$pipeline" "$question" "$file"
      python3 - "$file" "$log/$delay-$name-$mode-seq.json" "$delay" "$name" "$m" >>"$out" <<'PY'
import json, os, sys
f, ref, delay, name, m = sys.argv[1:]
a = json.load(open(f))
same = "-"
if not m.endswith("-seq") and os.path.exists(ref):
    same = "yes" if json.load(open(ref))["token_ids"] == a["token_ids"] else "NO"
print(f'{delay}\t{name}\t{m}\t{a["generated_tokens"]}\t{a["wall_s"]:.2f}\t{a["tokens_per_s"]:.2f}\t'
      f'{a["acceptance_rate"]:.3f}\t{a.get("predrafts_kept", 0)}\t{a.get("predrafts_dropped", 0)}\t{same}')
PY
      tail -n 1 "$out"
    done
  done
  kill "$coord" "$fixed" "$grow" 2>/dev/null || true
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)   logs: $log"
for d in $delays; do
  run_delay "$d" pencil
done
gsm8k_indices=$(seq 0 $((${#questions[@]} - 1)))
for d in $gsm8k_delays; do
  # shellcheck disable=SC2086
  run_delay "$d" $gsm8k_indices
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# Ratios per delay: pipelined sd (fixed and growing blocks) / sequential sd and easd / sd (tok/s summed over the
# questions of each group).
python3 - "$out" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    group = "pencil" if r["question"] == "pencil" else "gsm8k"
    a = agg[(r["delay_ms"], group, r["mode"])]
    a[0] += int(r["tokens"]); a[1] += float(r["wall_s"])
tps = {key: n / s for key, (n, s) in agg.items() if s > 0}
modes = ["target", "sd-seq", "sd-fixed", "sd-grow", "sd-pipe", "easd-seq", "easd-pipe"]
print("\ndelay  group   " + "  ".join(f"{m:>9}" for m in modes) + "  fixed/seq    grow/seq   pipe/seq    easd/sd")
for delay, group in sorted({(d, g) for d, g, _ in tps}, key=lambda x: (x[1], float(x[0]))):
    v = {m: tps.get((delay, group, m)) for m in modes}
    f = lambda x: f"{x:9.2f}" if x else "        -"
    ratio = lambda a, b: f"{a / b:8.2f}x" if a and b else "        -"
    print(f"{delay:>5}  {group:<6}  " + "  ".join(f(v[m]) for m in v)
          + f"  {ratio(v['sd-fixed'], v['sd-seq'])}  {ratio(v['sd-grow'], v['sd-seq'])}  {ratio(v['sd-pipe'], v['sd-seq'])}"
          + f"  {ratio(v['easd-pipe'], v['sd-pipe'])}")
print()
for mode, kinds in (("sd", ("sd-fixed", "sd-grow", "sd-pipe")), ("easd", ("easd-pipe",))):
    same = [r["same_tokens_as_seq"] for r in rows if r["mode"] in kinds and r["same_tokens_as_seq"] != "-"]
    if same:
        print(f"pipelined {mode} same token ids as sequential {mode}: {same.count('yes')}/{len(same)}")
PY
