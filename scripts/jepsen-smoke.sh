#!/usr/bin/env bash
# `make jepsen-smoke`: each workload JEPSEN_SECS (default 30) seconds under
# a random mix of every nemesis, the lock workload once more with TLS on
# both ports, every workload at once through the ZooKeeper door (a
# ZooKeeper client on the ZooKeeper port), and the lock, election, rwlock
# and semaphore workloads through the CLI door (`baton lock`, `baton elect`: the mix then
# has `kill-client` too). Any invalid result fails it; a
# harness error or "unknown" (exit 2) is retried once. Debug build.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"
SECS="${JEPSEN_SECS:-30}"
out=$(mktemp -d /tmp/baton-jepsen-smoke.XXXXXX)
for w in register lock election session rwlock semaphore lock+tls all+zk all+cli; do
  args=(--workload "${w%+*}")
  [ "$w" = lock+tls ] && args+=(--tls)
  [ "$w" = all+zk ] && args+=(--door zookeeper)
  [ "$w" = all+cli ] && args+=(--door cli)
  for try in 1 2; do
    $CARGO run -q -p baton-jepsen -- test "${args[@]}" --nemesis all \
      --time-limit "$SECS" --out "$out/$w-$try" | tail -n 12
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 2 ] && [ "$try" -eq 1 ]; then
      echo "harness error or unknown; retrying $w once"
      continue
    fi
    break
  done
  [ "$rc" -eq 0 ] || { echo "jepsen smoke: $w failed (exit $rc); results in $out/$w-$try"; exit 1; }
done
rm -rf "$out"
