# Shared by the benchmark scripts that start real processes: sourced, not run. Expects `$bin` (the folder of the
# easd binaries) and `$logs_at` (where the processes' logs go, for the error message).
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_healthy() {
  for _ in $(seq 1 1200); do "$bin/easd" health "$1" >/dev/null 2>&1 && return 0; sleep 0.25; done
  echo "$1 never became healthy (logs in $logs_at)" >&2; exit 1
}
