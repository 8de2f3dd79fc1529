#!/usr/bin/env bash
# End-to-end smoke test of the container stack: builds the image, starts draft + two verifiers
# + coordinator with the tiny test models, asks a question through the coordinator, kills the
# verifier holding the session mid-answer, and checks that the answer completes (and equals
# the answer of an undisturbed run with the same seed, DESIGN §2.4), then tears everything
# down and prints how long each phase took.
#
# Usage: deploy/compose-smoke.sh [--skip-build] [--keep]
#   --skip-build  reuse the image $EASD_IMAGE (default easd:smoke) and target/release/easd
#   --keep        leave the stack running (tear down with the printed command)
# Environment: SMOKE_MAX_TOKENS (default 400), SMOKE_SEED (default 7), EASD_CLI (host easd binary,
#              default target/release/easd),
#              SMOKE_TIMEOUT_S (per phase, default 300), EASD_IMAGE.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
skip_build=0
keep=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --skip-build) skip_build=1; shift ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "compose-smoke.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

image="${EASD_IMAGE:-easd:smoke}"
max_tokens="${SMOKE_MAX_TOKENS:-400}"
seed="${SMOKE_SEED:-7}"
timeout_s="${SMOKE_TIMEOUT_S:-300}"
question="A farmer has 17 rows of 23 apple trees. How many trees are there? Think step by step."
easd="${EASD_CLI:-$repo/target/release/easd}"
project="easd-smoke-$$"

log() { echo "compose-smoke.sh: $*"; }
fail() { echo "compose-smoke.sh: FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

if docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    compose_cmd=(docker-compose)
else
    fail "neither 'docker compose' nor 'docker-compose' is installed"
fi

work=$(mktemp -d /tmp/easd-smoke.XXXXXX)
# The containers run as uid 65532: the models must be world-readable.
chmod 755 "$work"
mkdir -m 755 "$work/models"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
export EASD_IMAGE="$image"
export EASD_MODELS_DIR="$work/models"
export EASD_DRAFT_MODEL=/models/tiny-draft.gguf
export EASD_TARGET_MODEL=/models/tiny-target.gguf
export EASD_COORDINATOR_PORT; EASD_COORDINATOR_PORT=$(free_port)
export EASD_HTTP_PORT; EASD_HTTP_PORT=$(free_port)
export OTEL_EXPORTER_OTLP_ENDPOINT=""

# The smoke test also reads the coordinator's metrics: publish them on loopback, port picked by Docker.
cat >"$work/smoke.override.yml" <<'YAML'
services:
  coordinator:
    ports: ["127.0.0.1::9100"]
YAML
compose() {
    "${compose_cmd[@]}" -p "$project" -f "$repo/docker-compose.yml" -f "$work/smoke.override.yml" "$@"
}

torn_down=0
teardown() {
    local rc=$?
    if [[ $torn_down -eq 1 ]]; then
        rm -rf "$work"
    elif [[ $keep -eq 1 ]]; then
        log "stack left running; tear down with:"
        log "  ${compose_cmd[*]} -p $project -f docker-compose.yml -f $work/smoke.override.yml down -v"
    else
        if [[ $rc -ne 0 ]]; then
            log "logs of the failed run (last 40 lines per service):"
            compose logs --no-color --tail=40 2>&1 || true
        fi
        compose down -v --remove-orphans >/dev/null 2>&1 || true
        rm -rf "$work"
    fi
    exit "$rc"
}
trap teardown EXIT

metric() { # metric HOST_PORT SERIES_PREFIX -> summed value (0 when absent)
    curl -fsS "http://127.0.0.1:$1/metrics" | awk -v p="$2" 'index($0, p) == 1 { s += $NF } END { print s + 0 }'
}

t_total=$(now)

# 1. Image and host CLI.
t=$(now)
if [[ $skip_build -eq 0 ]]; then
    "$repo/deploy/docker/build-images.sh" --tag "$image"
else
    docker image inspect "$image" >/dev/null 2>&1 || fail "image $image missing (drop --skip-build)"
fi
[[ -x "$easd" ]] || fail "$easd missing (drop --skip-build)"
t_build=$(since "$t")

# 2. Tiny models (written fresh each run; never committed).
"$easd" models tiny --dir "$work/models"
chmod 644 "$work/models"/*.gguf
for m in tiny-draft.gguf tiny-target.gguf; do
    [[ -s "$work/models/$m" ]] || fail "easd models tiny did not write $m"
done

# 3. Stack up; compose starts the coordinator once the workers report healthy.
t=$(now)
compose up -d >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "compose up"; }
deadline=$(( $(date +%s) + timeout_s ))
cid=$(compose ps -q coordinator)
until [[ "$(docker inspect -f '{{.State.Health.Status}}' "$cid")" == healthy ]]; do
    [[ $(date +%s) -lt $deadline ]] || fail "coordinator not healthy within ${timeout_s}s"
    [[ "$(docker inspect -f '{{.State.Status}}' "$cid")" == running ]] || fail "coordinator exited"
    sleep 1
done
t_up=$(since "$t")
coordinator_url="http://127.0.0.1:$EASD_COORDINATOR_PORT"
port_of() { compose port "$1" "$2" | awk -F: '{print $NF}'; }
coord_metrics=$(port_of coordinator 9100)
log "stack healthy in ${t_up}s; coordinator at $coordinator_url"

ask=("$easd" ask --coordinator "$coordinator_url" --max-tokens "$max_tokens" --seed "$seed" "$question")

# 4. Reference answer, all replicas up.
t=$(now)
timeout "$timeout_s" "${ask[@]}" >"$work/reference.txt" 2>"$work/reference.err" || { cat "$work/reference.err" >&2; fail "reference ask"; }
t_reference=$(since "$t")
[[ -s "$work/reference.txt" ]] || fail "reference answer is empty"
log "reference answer: $(wc -c <"$work/reference.txt") bytes in ${t_reference}s"
failovers_before=$(metric "$coord_metrics" easd_coordinator_failovers_total)

# 5. Same question again; kill the replica holding the session as soon as text streams.
t=$(now)
timeout "$timeout_s" "${ask[@]}" >"$work/answer.txt" 2>"$work/answer.err" &
ask_pid=$!
deadline=$(( $(date +%s) + timeout_s ))
until [[ -s "$work/answer.txt" ]]; do
    kill -0 "$ask_pid" 2>/dev/null || break
    [[ $(date +%s) -lt $deadline ]] || fail "no answer text within ${timeout_s}s"
    sleep 0.05
done
kill -0 "$ask_pid" 2>/dev/null \
    || fail "the answer finished before a verifier could be killed; raise SMOKE_MAX_TOKENS"
# The coordinator's live_sessions gauge names the replica the session is pinned to (a stale
# cache on the other replica would fool the workers' own gauges).
victim=""
for v in verifier-1 verifier-2; do
    # Any replica label naming the service (http://verifier-1:50052, verifier-1:50052, ...).
    sessions=$(curl -fsS "http://127.0.0.1:$coord_metrics/metrics" | awk -v v="$v:" \
        'index($0, "easd_coordinator_live_sessions{") == 1 && index($0, v) { s += $NF } END { print s + 0 }')
    if [[ "$sessions" != 0 ]]; then victim=$v; break; fi
done
[[ -n "$victim" ]] || fail "the coordinator reports no live session on either verifier while the answer streams"
docker kill "$(compose ps -q "$victim")" >/dev/null
log "killed $victim after $(wc -c <"$work/answer.txt") bytes of answer"
wait "$ask_pid" || { cat "$work/answer.err" >&2; fail "the answer did not complete after $victim died"; }
t_failover=$(since "$t")

# 6. The answer completed, failed over, and is the same text as the undisturbed one.
failovers_after=$(metric "$coord_metrics" easd_coordinator_failovers_total)
awk -v a="$failovers_after" -v b="$failovers_before" 'BEGIN { exit !(a > b) }' \
    || fail "coordinator counted no failover (failovers_total $failovers_before -> $failovers_after)"
if ! cmp -s "$work/reference.txt" "$work/answer.txt"; then
    diff "$work/reference.txt" "$work/answer.txt" | head -20 >&2 || true
    fail "the answer after failover differs from the reference answer (same seed)"
fi
log "answer completed after failover (${t_failover}s), identical to the reference"

t=$(now)
if [[ $keep -eq 0 ]]; then
    compose down -v --remove-orphans >/dev/null 2>&1
    torn_down=1
fi
t_down=$(since "$t")
log "timings: build ${t_build}s, up ${t_up}s, reference ${t_reference}s, failover answer ${t_failover}s, down ${t_down}s, total $(since "$t_total")s"
log "PASS"
