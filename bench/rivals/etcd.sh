#!/usr/bin/env bash
# etcd.sh - install and run a 3-member etcd cluster on 127.0.0.1, as a rival to
# benchmark Baton against.
#
# Usage:
#   etcd.sh install                 apt-get install etcd-server etcd-client (if `etcd` is missing)
#   etcd.sh start DIR [BASE_PORT]   start members etcd-1..3, wait until healthy
#   etcd.sh stop DIR                stop the members whose PIDs are recorded in DIR
#   etcd.sh status DIR              print each member's health (exit 1 if any unhealthy)
#   etcd.sh endpoints DIR           print "endpoints: 127.0.0.1:...,...,..."
#
# Ports (BASE defaults to 12370): client BASE+1..3, peer BASE+11..13, all on
# 127.0.0.1 only. Layout: DIR/etcd-N (data dir), DIR/etcd-N.log, DIR/etcd-N.pid,
# DIR/etcd.base (the base port, for status/endpoints).
#
# Version: Debian 12 (bookworm) ships etcd 3.4.23 (package 3.4.23-4+b4);
#   `etcd --version` -> "etcd Version: 3.4.23 / Git SHA: Not provided (use
#   ./build instead of go build) / Go Version: go1.19.8 / Go OS/Arch: linux/amd64".
# Durability: etcd's defaults are kept: the raft WAL is fsync'ed before a write
# is acknowledged and the bbolt backend is committed+synced in batches (no
# --unsafe-no-fsync, which 3.4 does not have anyway).
# Architecture: etcd 3.4 refuses to start on arm64 unless
# ETCD_UNSUPPORTED_ARCH=arm64 is set; this machine is amd64, the variable is
# only set below when `uname -m` reports aarch64/arm64.
#
# Environment knobs: ETCD_START_TIMEOUT (seconds, default 60), STOP_TIMEOUT
# (seconds before SIGKILL, default 10).

set -euo pipefail

PROG=etcd.sh
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
SCRIPT="${BASH_SOURCE[0]}"
# shellcheck source=common.sh
. "$HERE/common.sh"

DEFAULT_BASE=12370
MEMBERS=(1 2 3)

export ETCDCTL_API=3
# Do not let a caller's etcdctl settings redirect our health checks.
unset ETCDCTL_ENDPOINTS ETCDCTL_CACERT ETCDCTL_CERT ETCDCTL_KEY ETCDCTL_USER || true
case "$(uname -m)" in
    aarch64 | arm64) export ETCD_UNSUPPORTED_ARCH=arm64 ;;
esac

client_port() { echo $(($1 + $2)); }      # base, member
peer_port() { echo $(($1 + 10 + $2)); }   # base, member

endpoints_csv() { # base
    local n out=""
    for n in "${MEMBERS[@]}"; do
        out+="${out:+,}127.0.0.1:$(client_port "$1" "$n")"
    done
    echo "$out"
}

pidfiles() { # dir
    local n
    for n in "${MEMBERS[@]}"; do echo "$1/etcd-$n.pid"; done
}

stop_all() { # dir
    local -a pf
    mapfile -t pf < <(pidfiles "$1")
    stop_pids "$1/etcd-" "${pf[@]}"
}

read_base() { # dir
    local base=""
    [ -r "$1/etcd.base" ] && read -r base <"$1/etcd.base" || true
    [ -n "$base" ] || die "$1/etcd.base not found: was the cluster started with '$PROG start $1'?"
    echo "$base"
}

etcdctl_q() { # extra args...
    etcdctl --dial-timeout=2s --command-timeout=3s "$@"
}

cmd_install() {
    require_root install
    if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
        note "etcd already installed: $(etcd --version 2>/dev/null | head -n 1)"
        return 0
    fi
    apt_install etcd-server etcd-client
    command -v etcd >/dev/null 2>&1 || die "etcd still not on PATH after install"
    note "installed: $(etcd --version 2>/dev/null | head -n 1)"
}

print_log_tails() { # dir
    local n
    for n in "${MEMBERS[@]}"; do
        echo "----- tail of $1/etcd-$n.log -----" >&2
        tail -n 25 "$1/etcd-$n.log" >&2 2>/dev/null || echo "(no log)" >&2
    done
}

cmd_start() {
    [ $# -ge 1 ] || die "usage: $PROG start DIR [BASE_PORT]"
    local dir base n p pid cluster="" eps timeout deadline
    dir=$(abs_dir "$1")
    base=${2:-$DEFAULT_BASE}
    valid_base "$base"
    command -v etcd >/dev/null 2>&1 || die "etcd not installed; run: $0 install"
    command -v etcdctl >/dev/null 2>&1 || die "etcdctl not installed; run: $0 install"

    for n in "${MEMBERS[@]}"; do
        pid=$(read_pid "$dir/etcd-$n.pid")
        if [ -n "$pid" ] && pid_matches "$pid" "$dir/etcd-"; then
            die "etcd-$n already running (pid $pid); run: $0 stop $dir"
        fi
    done
    for n in "${MEMBERS[@]}"; do
        for p in "$(client_port "$base" "$n")" "$(peer_port "$base" "$n")"; do
            port_in_use "$p" && die "port $p on 127.0.0.1 is already in use"
        done
        cluster+="${cluster:+,}etcd-$n=http://127.0.0.1:$(peer_port "$base" "$n")"
    done
    if [ -d "$dir/etcd-1/member" ]; then
        note "reusing existing data in $dir/etcd-N (delete $dir for a fresh cluster)"
    fi
    echo "$base" >"$dir/etcd.base"

    for n in "${MEMBERS[@]}"; do
        local cport pport
        cport=$(client_port "$base" "$n")
        pport=$(peer_port "$base" "$n")
        echo "=== $(date -Is) $PROG start etcd-$n ===" >>"$dir/etcd-$n.log"
        spawn "$dir/etcd-$n.pid" "$dir/etcd-$n.log" \
            etcd \
            --name "etcd-$n" \
            --data-dir "$dir/etcd-$n" \
            --listen-client-urls "http://127.0.0.1:$cport" \
            --advertise-client-urls "http://127.0.0.1:$cport" \
            --listen-peer-urls "http://127.0.0.1:$pport" \
            --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
            --initial-cluster "$cluster" \
            --initial-cluster-token "baton-bench-etcd-$base" \
            --initial-cluster-state new \
            --logger zap --log-outputs stderr
    done

    eps=$(endpoints_csv "$base")
    timeout=${ETCD_START_TIMEOUT:-60}
    deadline=$((SECONDS + timeout))
    while :; do
        for n in "${MEMBERS[@]}"; do
            pid=$(read_pid "$dir/etcd-$n.pid")
            if ! pid_matches "$pid" "$dir/etcd-"; then
                print_log_tails "$dir"
                note "etcd-$n (pid ${pid:-?}) exited during startup; stopping the others"
                stop_all "$dir" || true
                exit 1
            fi
        done
        if etcdctl_q --endpoints="$eps" endpoint health >/dev/null 2>&1; then
            break
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            etcdctl_q --endpoints="$eps" endpoint health >&2 || true
            print_log_tails "$dir"
            note "cluster not healthy after ${timeout}s; stopping it"
            stop_all "$dir" || true
            exit 1
        fi
        sleep 0.5
    done
    etcdctl_q --endpoints="$eps" endpoint health 2>&1 | sed "s/^/$PROG: /" >&2 || true
    echo "endpoints: $eps"
}

cmd_stop() {
    [ $# -ge 1 ] || die "usage: $PROG stop DIR"
    local dir
    dir=$(existing_dir "$1")
    stop_all "$dir"
}

cmd_status() {
    [ $# -ge 1 ] || die "usage: $PROG status DIR"
    local dir base n pid ep rc=0 out
    dir=$(existing_dir "$1")
    base=$(read_base "$dir")
    for n in "${MEMBERS[@]}"; do
        ep="127.0.0.1:$(client_port "$base" "$n")"
        pid=$(read_pid "$dir/etcd-$n.pid")
        if [ -z "$pid" ] || ! pid_matches "$pid" "$dir/etcd-"; then
            echo "etcd-$n $ep pid=- down"
            rc=1
            continue
        fi
        if out=$(etcdctl_q --endpoints="$ep" endpoint health 2>&1); then
            echo "etcd-$n $ep pid=$pid healthy (${out##*: })"
        else
            echo "etcd-$n $ep pid=$pid UNHEALTHY: $(echo "$out" | tr '\n' ' ')"
            rc=1
        fi
    done
    return "$rc"
}

rival_main "$@"
