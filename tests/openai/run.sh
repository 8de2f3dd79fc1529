#!/usr/bin/env bash
# Tests the OpenAI-compatible HTTP API with the official `openai` Python package.
#
# Makes a virtualenv in target/openai-venv (pip install openai pytest), starts a whole stack on the tiny test
# models with the HTTP API on (the serve_local example of easd-openai), waits for /health, runs pytest, stops the
# server. With EASD_OPENAI_BASE_URL set (e.g. http://127.0.0.1:8080/v1), tests that server instead.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
venv="$root/target/openai-venv"

if ! "$venv/bin/python" -c 'import openai, pytest' 2>/dev/null; then
    echo "== creating $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check openai pytest
fi

server_pid=""
log="$(mktemp)"
cleanup() {
    if [ -n "$server_pid" ]; then
        kill -INT "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -f "$log"
}
trap cleanup EXIT

if [ -z "${EASD_OPENAI_BASE_URL:-}" ]; then
    echo "== building the tiny-model server"
    cargo build --quiet -p easd-openai --example serve_local
    target_dir="$(cargo metadata --format-version 1 --no-deps | "$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    export EASD_OPENAI_API_KEY="test-token-$$"
    "$target_dir/debug/examples/serve_local" --port 0 --api-token "$EASD_OPENAI_API_KEY" >"$log" 2>&1 &
    server_pid=$!
    addr=""
    for _ in $(seq 1 600); do
        addr="$(grep -o 'listening on http://[0-9.:]*' "$log" | head -n1 | sed 's/listening on //' || true)"
        [ -n "$addr" ] && break
        if ! kill -0 "$server_pid" 2>/dev/null; then
            echo "the server exited:" >&2
            cat "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
    [ -n "$addr" ] || { echo "the server did not print its address" >&2; cat "$log" >&2; exit 1; }
    export EASD_OPENAI_BASE_URL="$addr/v1"
    health="${addr}/health"
else
    health="${EASD_OPENAI_BASE_URL%/v1}/health"
fi

echo "== waiting for $health"
"$venv/bin/python" - "$health" <<'EOF'
import sys, time, urllib.request
deadline = time.time() + 60
while True:
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    if time.time() > deadline:
        sys.exit(f"{sys.argv[1]} did not answer within 60 s")
    time.sleep(0.2)
EOF

echo "== pytest against $EASD_OPENAI_BASE_URL"
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/openai
