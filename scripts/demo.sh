#!/usr/bin/env bash
# The demo: a local 3-member cluster; write through one member, read through
# the others, kill -9 the leader, see a new leader with the data intact, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${CARGO_TARGET_DIR:-target}/release"
BATOND="$BIN/batond"
BATON="$BIN/baton"
DATA=$(mktemp -d /tmp/baton-demo.XXXXXX)
BASE=${BATON_DEMO_BASE_PORT:-7100}
EPS="127.0.0.1:$((BASE+1)),127.0.0.1:$((BASE+2)),127.0.0.1:$((BASE+3))"
export BATON_ENDPOINTS="$EPS"
CLUSTER_PID=""

cleanup() {
  if [ -n "$CLUSTER_PID" ] && kill -0 "$CLUSTER_PID" 2>/dev/null; then
    kill -TERM "$CLUSTER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$CLUSTER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$CLUSTER_PID" 2>/dev/null || true
  fi
  # Members the cluster process started, should it have died first.
  pkill -KILL -f -- "--data-dir=$DATA/" 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT INT TERM

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

step "start a local 3-member cluster (batond cluster --nodes 3)"
"$BATOND" cluster --nodes 3 --data-dir "$DATA" --base-port "$BASE" > "$DATA/cluster.out" 2>&1 &
CLUSTER_PID=$!
for _ in $(seq 100); do grep -q '^endpoints:' "$DATA/cluster.out" 2>/dev/null && break; sleep 0.1; done
cat "$DATA/cluster.out"
for _ in $(seq 100); do "$BATON" status 2>/dev/null | grep -q leader && break; sleep 0.1; done
run "$BATON" status

step "write through member 1, read through members 2 and 3"
run "$BATON" --endpoints "127.0.0.1:$((BASE+1))" create /demo/config "max_workers=8" --parents
run "$BATON" --endpoints "127.0.0.1:$((BASE+1))" set /demo/config "max_workers=16"
for m in 2 3; do
  printf 'member %s says: ' "$m"; "$BATON" --endpoints "127.0.0.1:$((BASE+m))" get /demo/config
done
run "$BATON" --endpoints "127.0.0.1:$((BASE+2))" create /demo/job- "queued" --sequential
run "$BATON" --endpoints "127.0.0.1:$((BASE+3))" create /demo/job- "queued" --sequential
run "$BATON" ls /demo
run "$BATON" stat /demo/config

step "kill -9 the leader"
LEADER=$("$BATON" status --json | grep '"role":"leader"' | sed 's/.*"id":\([0-9]*\).*/\1/' | head -1)
PID=$(grep "^member $LEADER:" "$DATA/cluster.out" | sed 's/.*pid \([0-9]*\).*/\1/' | tail -n 1)
echo "leader is member $LEADER (pid $PID)"
run kill -9 "$PID"
START=$(date +%s%N)
for _ in $(seq 200); do
  NEW=$("$BATON" status --json 2>/dev/null | grep '"role":"leader"' | sed 's/.*"id":\([0-9]*\).*/\1/' | head -1 || true)
  [ -n "$NEW" ] && [ "$NEW" != "$LEADER" ] && break
  sleep 0.05
done
echo "new leader: member $NEW after $(( ($(date +%s%N) - START) / 1000000 )) ms"
run "$BATON" status || true

step "the data is intact, and writes go on"
run "$BATON" get /demo/config
run "$BATON" ls /demo
run "$BATON" create /demo/after-failover "ok"
run "$BATON" get /demo/after-failover

step "batond cluster starts the killed member again on its data dir: it rejoins and catches up"
for _ in $(seq 100); do grep -q "^member $LEADER exited" "$DATA/cluster.out" && break; sleep 0.1; done
grep -A1 "^member $LEADER exited" "$DATA/cluster.out"
for _ in $(seq 100); do
  "$BATON" --endpoints "127.0.0.1:$((BASE+LEADER))" get --stale /demo/after-failover >/dev/null 2>&1 && break; sleep 0.1
done
printf 'member %s says: ' "$LEADER"; "$BATON" --endpoints "127.0.0.1:$((BASE+LEADER))" get --stale /demo/after-failover
run "$BATON" status

step "the main job: workers take turns on a lock, each write fenced by its token"
# Seed 000's single-runner job: `baton lock NAME -- CMD` runs CMD while
# holding the lock, with the token in BATON_FENCE_TOKEN. Each worker reads
# the counter and writes it back +1, guarded by check_fence on "billing".
export PATH="$BIN:$PATH"
W="$DATA/work"; mkdir -p "$W"; : > "$W/accepted"; : > "$W/rejected"; : > "$W/grants"
"$BATON" create /demo/counter 0 >/dev/null
JOB='echo "$BATON_FENCE_TOKEN" >> '"$W"'/grants
n=$(baton get /demo/counter); echo "$PPID $$ $BATON_FENCE_TOKEN" > '"$W"'/holder; sleep 0.3
if baton set /demo/counter $((n+1)) --fence billing=$BATON_FENCE_TOKEN >/dev/null 2>'"$W"'/err.$$; then
  echo "$BATON_FENCE_TOKEN" >> '"$W"'/accepted
else
  echo "$BATON_FENCE_TOKEN $(cat '"$W"'/err.$$)" >> '"$W"'/rejected
fi'
PIDS=()
for w in 1 2 3 4; do
  ( for i in 1 2 3 4 5; do
      baton lock billing --session-timeout 2s --grace 1s -- sh -c "$JOB" 2>>"$W/worker-$w.log" || true
    done ) &
  PIDS+=($!)
done
sleep 2
# Catch a job between its read and its write: wait for the next one to
# announce itself (it has read the counter and sleeps 0.3 s), then pause.
: > "$W/holder"
for _ in $(seq 500); do [ -s "$W/holder" ] && break; sleep 0.01; done
read -r KEEPER SH TOKEN < "$W/holder"
# The job's parent is the keeper `baton lock` runs it under, in a process
# group of their own (cli/src/holder.rs); the keeper's parent is the
# `baton lock` process that holds the session. Pause both: the whole holder.
HOLDER=$(ps -o ppid= -p "$KEEPER" | tr -d ' ')
GROUP=$(ps -o pgid= -p "$SH" | tr -d ' ')
echo "pausing the holder (token $TOKEN, pid $HOLDER) with SIGSTOP, past its 2 s session timeout"
kill -STOP -- "-$GROUP" 2>/dev/null || true; kill -STOP "$HOLDER" 2>/dev/null || true
sleep 3.5
echo "meanwhile the lock moved on: $(tail -n 1 "$W/grants" | tr -d '\n') is the newest token"
echo "waking the paused job first: it still believes it holds the lock and writes"
kill -CONT -- "-$GROUP" 2>/dev/null || true; sleep 1.5
kill -CONT "$HOLDER" 2>/dev/null || true
sleep 1
LEADER=$("$BATON" status --json | grep '"role":"leader"' | sed 's/.*"id":\([0-9]*\).*/\1/' | head -1)
LPID=$(grep "^member $LEADER:" "$DATA/cluster.out" | sed 's/.*pid \([0-9]*\).*/\1/')
echo "kill -9 the leader (member $LEADER) while the workers run"
kill -9 "$LPID"
for p in "${PIDS[@]}"; do wait "$p"; done

step "summary"
GRANTS=$(wc -l < "$W/grants"); ACC=$(wc -l < "$W/accepted"); REJ=$(wc -l < "$W/rejected")
echo "grants:          $GRANTS"
echo "tokens in order: $(tr '\n' ' ' < "$W/grants")"
echo "accepted writes: $ACC"
echo "rejected writes: $REJ"
echo "stopped before writing (lock in doubt): $((GRANTS - ACC - REJ))"
sed 's/^/  stale write, token /' "$W/rejected"
grep -h "lost" "$W"/worker-*.log | sed 's/^/  /' || true
COUNTER=$("$BATON" get /demo/counter)
echo "counter:         $COUNTER"
if [ "$COUNTER" = "$ACC" ] && [ "$REJ" -ge 1 ] && sort -n -c "$W/grants" 2>/dev/null; then
  echo "OK: counter == accepted writes, tokens only grew, the paused holder's late write was refused"
else
  echo "UNEXPECTED: counter $COUNTER, accepted $ACC, rejected $REJ"; exit 1
fi

step "stop everything"
kill -TERM "$CLUSTER_PID"
wait "$CLUSTER_PID" 2>/dev/null || true
CLUSTER_PID=""
echo "cluster stopped; demo done"
