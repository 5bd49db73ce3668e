#!/usr/bin/env bash
# `make scale-smoke`: every scale dimension at small sizes on Baton and
# ZooKeeper, and etcd's (nodes, sessions, locks, clients; ~40 s), one
# cluster each (debug build, ~3 min). Fails if the command fails (a herd in
# a lock queue fails it) or scale.json lacks a dimension's rows.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"
out=$(mktemp -d /tmp/baton-scale-smoke.XXXXXX)
timeout 420 $CARGO run -q -p baton-bench -- scale --targets baton,zookeeper,etcd --shared-cluster \
  --nodes 1000,3000 --sessions 50 --watches 500 --watchers 50 --waiters 1,5,20 --clients 1,8 \
  --session-timeout 4000 --interval 1 --expiry-sample 5 --lock-window 2 --duration 1 --runs 1 \
  --out "$out" 2>&1 | grep -v WARN | tail -n 60
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "scale smoke failed; see $out"; exit 1; }
for d in nodes sessions watches fanout locks clients; do
  rows=$(grep -c "\"dim\": \"$d\"" "$out/scale.json")
  [ "$rows" -ge 2 ] || { echo "scale smoke: $rows $d rows in scale.json, expected 2 or more"; exit 1; }
  test -s "$out/scale-$d.png" || { echo "scale smoke: no scale-$d.png"; exit 1; }
done
grep -q '"wakeups_per_release"' "$out/scale.json" && test -s "$out/scale.md" \
  || { echo "scale smoke: no wakeups_per_release in scale.json, or no scale.md; see $out"; exit 1; }
rm -rf "$out"
