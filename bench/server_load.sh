#!/usr/bin/env bash
# Load test of `diffucoder serve` on loopback: starts the server on a free port, runs CLIENTS concurrent
# clients for SECONDS (bench/server_load.cc), then prints the client's JSON summary plus the server's peak RSS.
# Usage: bench/server_load.sh BUILD_DIR MODEL_DIR [CLIENTS=64] [SECONDS=60] [MAX_BATCH=64] [REQUEST_JSON]
#   e.g. bench/server_load.sh build build/fixtures/tiny-vocab 64 60 1    # one-at-a-time serving
# Exit code 1 when any request failed. Run it under `nice -n 19` on a shared machine.
set -euo pipefail
build="$1"; model="$2"; clients="${3:-64}"; seconds="${4:-60}"; max_batch="${5:-64}"
default_request='{"max_tokens": 16, "steps": 16, "alg": "origin", "temperature": 0}'
request="${6:-$default_request}"
log="$(mktemp)"
"$build/diffucoder" serve --model "$model" --port 0 --max-batch "$max_batch" --max-queue 1024 \
  --http-threads $((clients + 16)) ${SERVE_ARGS:-} 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 600); do
  port="$(sed -n 's|.*on http://[^:]*:\([0-9]*\).*|\1|p' "$log")"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "server_load: the server did not start" >&2; cat "$log" >&2; exit 1; }
set +e
summary="$("$build/bench/server_load" --port "$port" --clients "$clients" --seconds "$seconds" --request "$request")"
rc=$?
set -e
rss_kb="$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$pid/status")"
kill "$pid"; wait "$pid" 2>/dev/null || true
echo "${summary%\}}, \"max_batch\": $max_batch, \"peak_rss_mb\": $((rss_kb / 1024))}"
exit "$rc"
