#!/usr/bin/env bash
# `make locks-smoke`: every lock kind of `baton-bench locks` (12) for 3 s with 3
# workers, without a fault, with paused holders, with the lock service's
# primary killed and with a holder's links to it cut (the last two not for
# the 3 PostgreSQL kinds: 42 runs), to keep the adapters
# working (debug build: the figures mean nothing). Fails if the run is not
# valid (a fenced kind lost a decrement, or any kind did with no fault, or
# one acknowledged nothing), or a row or the report is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"
out=$(mktemp -d /tmp/baton-locks-smoke.XXXXXX)
$CARGO run -q -p baton-bench -- locks --workers 3 --time-limit 3 --faults none,pause,kill,cut \
  --out "$out" 2>&1 | grep -v WARN | tail -n 20
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "locks smoke failed; see $out"; exit 1; }
rows=$(grep -c '"kind"' "$out/locks.json")
[ "$rows" -eq 42 ] || { echo "locks smoke: $rows rows in locks.json, expected 42 (12 + 12 + 9 + 9)"; exit 1; }
test -s "$out/locks.png" && test -s "$out/locks.md" || { echo "locks smoke: no locks.png or locks.md in $out"; exit 1; }
rm -rf "$out"
