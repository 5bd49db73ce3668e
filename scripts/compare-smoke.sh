#!/usr/bin/env bash
# `make compare-smoke`: every compare workload for a few seconds on every
# target (Baton, etcd, ZooKeeper, and Baton through its ZooKeeper port), to
# keep the adapters working (debug build: the figures mean nothing). A
# failed run, a missing row or CPU figure, or a missing page fails it.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"
out=$(mktemp -d /tmp/baton-compare-smoke.XXXXXX)
$CARGO run -q -p baton-bench -- compare --targets baton,etcd,zookeeper,baton-zk \
  --duration 2 --warmup 0 --run-warmup 1 --runs 1 --open-loop 50 --open-loop-runs 1 \
  --out "$out" 2>&1 | grep -v WARN | tail -n 60
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "compare smoke failed; see $out"; exit 1; }
# 6 closed-loop workloads and 2 open-loop ones (at 50%), on 4 targets.
rows=$(grep -c '"workload"' "$out/compare.json")
[ "$rows" -eq 32 ] || { echo "compare smoke: $rows rows in compare.json, expected 32"; exit 1; }
open=$(grep -c '"load_pct": 50' "$out/compare.json")
[ "$open" -eq 8 ] || { echo "compare smoke: $open open-loop rows, expected 8"; exit 1; }
grep -q '^## Open-loop latency' "$out/compare.md" || { echo "compare smoke: no open-loop table in $out/compare.md"; exit 1; }
! grep -q '"failed"' "$out/compare.json" || { echo "compare smoke: a run failed; see $out/compare.md"; exit 1; }
# Member CPU per op on every steady row and its one run (20 + 20) and on
# every open-loop row and its run (8 + 8), none on failover: each target's
# member pids were found and read.
cpu=$(grep -c '"member_cpu_us"' "$out/compare.json")
[ "$cpu" -eq 56 ] || { echo "compare smoke: member_cpu_us on $cpu rows and runs, expected 56"; exit 1; }
test -s "$out/compare.png" && test -s "$out/compare.md" || { echo "compare smoke: no compare.png or compare.md in $out"; exit 1; }
rm -rf "$out"
