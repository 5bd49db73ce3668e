#!/usr/bin/env bash
# `make locks-smoke`: every lock kind of `baton-bench locks` (11) for 3 s with 3
# workers, without a fault, with paused holders and with the lock service's
# primary killed (not the 3 PostgreSQL kinds: 30 runs), to keep the adapters
# working (debug build: the figures mean nothing). Fails if the run is not
# valid (a fenced kind lost a decrement, or any kind did with no fault, or
# one acknowledged nothing), or a row or the report is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"
out=$(mktemp -d /tmp/baton-locks-smoke.XXXXXX)
$CARGO run -q -p baton-bench -- locks --workers 3 --time-limit 3 --faults none,pause,kill \
  --out "$out" 2>&1 | grep -v WARN | tail -n 20
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "locks smoke failed; see $out"; exit 1; }
rows=$(grep -c '"kind"' "$out/locks.json")
[ "$rows" -eq 30 ] || { echo "locks smoke: $rows rows in locks.json, expected 30 (11 + 11 + 8)"; exit 1; }
test -s "$out/locks.png" && test -s "$out/locks.md" || { echo "locks smoke: no locks.png or locks.md in $out"; exit 1; }
rm -rf "$out"
