#!/usr/bin/env bash
# The GPU check: one script for a machine with an NVIDIA GPU. Builds with the `cuda` feature, pulls the default
# pair, benchmarks both models on the GPU, asks the pencil question in target / sd / easd modes with the draft and
# the target on the GPU (on separate GPUs when there are two), and runs a 100-problem GSM8K development eval of sd
# vs easd. Everything lands under one folder; a rerun reuses the build, the models and the eval's results
# (results.jsonl is resumed), so it is safe to run again after an interruption.
#
#   scripts/gpu-check.sh [OUT_DIR]            (default: target/gpu-check)
#
# Environment:
#   EASD_BIN_DIR       use prebuilt binaries (built elsewhere with `--features easd/cuda,easd-services/cuda`)
#                      instead of building here
#   EASD_MODELS_DIR    where the pair is (or is pulled to)
#   GPU_CHECK_PROBLEMS problems in the eval (default 100)
#   GPU_CHECK_BUDGET_S stop starting new steps after this many seconds (default 420: the whole check is meant to
#                      finish in under 8 minutes on an H100-class GPU)
# Needs nvcc to build (a system CUDA, or scripts/cuda-toolchain.sh) and the NVIDIA driver to run.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$(mkdir -p "${1:-target/gpu-check}" && cd "${1:-target/gpu-check}" && pwd)"
problems="${GPU_CHECK_PROBLEMS:-100}"
budget="${GPU_CHECK_BUDGET_S:-420}"
started=$SECONDS
summary="$out/summary.md"
pencil='A shop sells pencils at $3 each. Emma buys 14 pencils and pays with a $50 bill. How much change does she get?'

log() { printf '%s\n' "$*" | tee -a "$summary"; }
over_budget() { [ $((SECONDS - started)) -ge "$budget" ]; }
# step NAME CMD…: runs CMD with its output in $out/NAME.log; records ok/failed and the seconds it took.
step() {
    local name="$1"
    shift
    if over_budget; then
        log "| $name | skipped (budget of ${budget} s spent) | |"
        return 1
    fi
    local t=$SECONDS
    if "$@" >"$out/$name.log" 2>&1; then
        log "| $name | ok | $((SECONDS - t)) s |"
    else
        log "| $name | FAILED (exit $?, see $name.log) | $((SECONDS - t)) s |"
        return 1
    fi
}

: >"$summary"
log "# GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
log ""
log '```'
nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv 2>&1 | tee -a "$summary"
log '```'
gpus="$(nvidia-smi --list-gpus 2>/dev/null | wc -l)"
if [ "$gpus" -lt 1 ]; then
    log "no GPU visible (nvidia-smi lists none): nothing to check"
    exit 1
fi
draft_dev="cuda:0"
target_dev="cuda:$((gpus > 1 ? 1 : 0))"
log ""
log "draft on $draft_dev, target on $target_dev"
log ""
log "| step | result | time |"
log "|---|---|---|"

if [ -n "${EASD_BIN_DIR:-}" ]; then
    bin="$EASD_BIN_DIR"
else
    if ! command -v nvcc >/dev/null; then
        eval "$(scripts/cuda-toolchain.sh)" || exit 1
    fi
    cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '. ')"
    export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-$cap}"
    step build cargo build --release -p easd -p easd-services --features easd/cuda,easd-services/cuda || exit 1
    bin="$root/target/release"
fi
easd="$bin/easd"

step pull "$easd" models pull || exit 1
step bench-draft "$easd" bench model --model draft --device "$draft_dev"
step bench-target "$easd" bench model --model target --device "$target_dev"

devices=(--draft-device "$draft_dev" --target-device "$target_dev")
for mode in target sd easd; do
    step "ask-$mode" "$easd" ask --json --mode "$mode" --max-tokens 200 "${devices[@]}" "$pencil"
done

# GSM8K development lines (2000+), the slice the earlier CPU figures used.
step eval "$easd" eval --modes sd,easd --offset 2000 --limit "$problems" --concurrency 4 \
    --out "$out/eval" "${devices[@]}"

log ""
log "## Figures"
for f in "$out"/bench-*.log; do
    [ -f "$f" ] && { log ""; log "$(basename "$f" .log):"; log '```'; tail -n 12 "$f" | tee -a "$summary"; log '```'; }
done
for mode in target sd easd; do
    f="$out/ask-$mode.log"
    [ -f "$f" ] || continue
    line="$(python3 -c 'import json,sys
s = sys.stdin.read(); a = json.loads(s[s.index("{"):])
print(*(f"{k} {a[k]}" for k in ("generated_tokens", "tokens_per_s", "acceptance_rate", "easd_triggers")), sep=", ")' \
        <"$f" 2>/dev/null)"
    log "ask $mode: ${line:-no summary (see ask-$mode.log)}"
done
[ -f "$out/eval/report.md" ] && log "eval report: $out/eval/report.md"
log ""
log "total $((SECONDS - started)) s"
