#!/usr/bin/env bash
# `make test`: the whole suite, stage by stage, in the order below; stops at
# the first stage that fails. At the end (also after a failure) it prints
# how long each stage took, and the slowest test binaries of the workspace
# stage, so the next person knows where the time goes (the house issue:
# measure per stage first).
#
# The stages: lint, the advisory check, the build, the docs' commands and
# paths, README's examples, the rivals (etcd, ZooKeeper) and the ZooKeeper
# clients (Curator, kazoo), the stores a lock protects (PostgreSQL, Redis:
# the fence tests), the workspace's tests (unit, golden, real
# 3-member clusters, the harness's fault-catching tests, the benchmark's
# adapters to the rivals and their lock-safety tests), the simulator with its planted-bug twins, 20 s of each fuzz
# target, a short Jepsen run of every workload, a short compare, a short
# run of every lock kind (locks-smoke) and a short scale. `make check` is the fast tier for the edit loop.
set -uo pipefail
cd "$(dirname "$0")/.."
MAKE="${MAKE:-make}"
CARGO="${CARGO:-cargo}"
LOG=$(mktemp -d /tmp/baton-test.XXXXXX)
NAMES=() SECS=() RESULTS=()

table() {
  local i total=0
  echo
  echo "make test: time per stage"
  printf '  %-16s %8s  %s\n' stage seconds result
  for i in "${!NAMES[@]}"; do
    printf '  %-16s %8d  %s\n' "${NAMES[$i]}" "${SECS[$i]}" "${RESULTS[$i]}"
    total=$((total + SECS[i]))
  done
  printf '  %-16s %8d\n' total "$total"
  if [ -s "$LOG/workspace.out" ]; then
    echo "slowest test binaries (workspace stage; seconds inside the binary):"
    awk '/^ *Running /{ bin = $NF; gsub(/[()]/, "", bin); sub(/.*\//, "", bin); sub(/-[0-9a-f]+$/, "", bin)
        name = bin " " ($2 == "unittests" ? $3 : $2) }
      /^ *Doc-tests /{ name = $2 " doc-tests" }
      /^test result:/ { for (i = 1; i <= NF; i++) if ($i == "in") { t = $(i + 1); sub(/s$/, "", t); print t "\t" name } }' \
      "$LOG/workspace.out" | sort -rn | head -n 12 | awk -F'\t' '{ printf "  %8.1f  %s\n", $1, $2 }'
  fi
}

stage() { # name, command...
  local name="$1" start rc
  shift
  echo "=== make test: $name"
  start=$SECONDS
  "$@"
  rc=$?
  NAMES+=("$name") SECS+=($((SECONDS - start)))
  if [ $rc -ne 0 ]; then
    RESULTS+=("FAILED (exit $rc)")
    table
    echo "make test: stage $name failed"
    exit $rc
  fi
  RESULTS+=(ok)
}

workspace() {
  $CARGO test --workspace -- --test-threads=2 2>&1 | tee "$LOG/workspace.out"
  return "${PIPESTATUS[0]}"
}

stage lint $MAKE --no-print-directory lint
stage advisories $MAKE --no-print-directory advisories
stage build $MAKE --no-print-directory build
stage check-docs $MAKE --no-print-directory check-docs
stage check-readme $MAKE --no-print-directory check-readme
stage rival-deps $MAKE --no-print-directory rival-deps
stage zk-clients-deps $MAKE --no-print-directory zk-clients-deps
stage store-deps $MAKE --no-print-directory store-deps
stage workspace workspace
stage sim $MAKE --no-print-directory sim
stage fuzz-smoke $MAKE --no-print-directory fuzz-smoke FUZZ_SECS=20
stage jepsen-smoke $MAKE --no-print-directory jepsen-smoke
stage compare-smoke $MAKE --no-print-directory compare-smoke
stage locks-smoke $MAKE --no-print-directory locks-smoke
stage scale-smoke $MAKE --no-print-directory scale-smoke
table
rm -rf "$LOG"
