#!/usr/bin/env bash
# `make fuzz-smoke`: each fuzz target (fuzz/README.md) for FUZZ_SECS
# (default 30) seconds with nightly and cargo-fuzz (installed if missing);
# a crash fails and leaves its input in fuzz/artifacts/.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"
SECS="${FUZZ_SECS:-30}"
command -v cargo-fuzz >/dev/null || $CARGO install cargo-fuzz --locked || exit 1
for t in client_frame peer_frame apply zk_frame; do
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t"
  echo "fuzz-smoke: $t ($SECS s)"
  $CARGO +nightly fuzz run -a "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -max_total_time="$SECS" -print_final_stats=1 2>&1 \
    | grep -E '^(Done|stat::average_exec_per_sec)|panicked|ERROR|SUMMARY|Test unit written'
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fuzz-smoke: $t failed (input in fuzz/artifacts/$t)"; exit 1; }
done
