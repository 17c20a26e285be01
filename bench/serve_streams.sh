#!/usr/bin/env bash
# Serving throughput and latency at several numbers of concurrent streams (issue 35 item 5): starts
# `diffucoder serve` once on 127.0.0.1 (a free port) with SERVE_FLAGS, then for each count N of LEVELS runs
# bench/server_load (N clients posting REQUEST back to back for SECONDS each, then waiting for their last
# answers) and writes one JSON object: {"serve_flags", "request", "levels": [server_load's summary per N:
# tokens_per_second (generated tokens over all requests / wall time), latency_ms_p50, latency_ms_p99, failed,
# ...]}. Every level runs under `timeout` (SECONDS + LEVEL_LIMIT); a level that fails or times out is recorded
# with its exit code ("rc") and the rest still run.
# Usage: bench/serve_streams.sh DIFFUCODER SERVER_LOAD MODEL_DIR OUT_JSON
#   env: SERVE_FLAGS (e.g. "--device vulkan --fast"), REQUEST (a JSON object merged into every completion),
#        LEVELS ("1 4 16 64"), SECONDS (10), LEVEL_LIMIT (120), START_LIMIT (600: seconds to load the model).
set -u
DC=$1 LOAD=$2 MODEL=$3 OUT=$4
LEVELS=${LEVELS:-1 4 16 64} SECONDS_PER_LEVEL=${SECONDS:-10} LEVEL_LIMIT=${LEVEL_LIMIT:-120} START_LIMIT=${START_LIMIT:-600}
REQUEST=${REQUEST:-'{"max_tokens": 32, "steps": 32, "temperature": 0}'}
max=1; for n in $LEVELS; do ((n > max)) && max=$n; done
log=$(mktemp)
# shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
"$DC" serve --model "$MODEL" --host 127.0.0.1 --port 0 --max-batch "$max" --max-queue 4096 \
  --http-threads $((max + 16)) --max-connections-per-client 4096 ${SERVE_FLAGS:-} 2> "$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 $((START_LIMIT * 10))); do
  port=$(sed -n 's|.*on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log")
  [[ -n $port ]] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $port ]]; then
  echo "serve_streams: the server did not start:" >&2; cat "$log" >&2
  exit 1
fi
head -2 "$log" >&2
levels=""
for n in $LEVELS; do
  summary=$(timeout $((SECONDS_PER_LEVEL + LEVEL_LIMIT)) "$LOAD" --port "$port" --clients "$n" \
    --seconds "$SECONDS_PER_LEVEL" --request "$REQUEST")
  rc=$?
  [[ $summary == \{*\} ]] || summary="{\"clients\": $n}"
  echo "streams $n: rc=$rc $summary" >&2
  levels+="${levels:+, }${summary%\}}, \"rc\": $rc}"
done
# The request and flags as JSON strings (quotes and backslashes escaped).
quote() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
printf '{"serve_flags": %s, "request": %s, "levels": [%s]}\n' "$(quote "${SERVE_FLAGS:-}")" "$(quote "$REQUEST")" "$levels" > "$OUT"
