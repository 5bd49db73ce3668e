# shellcheck shell=bash
# Helpers shared by etcd.sh and zookeeper.sh. Sourced, not run.
#
# Process handling rules (see README.md):
#   * every server is started detached (setsid, stdin from /dev/null) and writes
#     its own PID to DIR/<name>.pid just before exec'ing the real binary;
#   * stop only ever signals PIDs read from those pid files, and only if
#     /proc/PID/cmdline still contains the expected marker (guards PID reuse).

die() {
    echo "$PROG: error: $*" >&2
    exit 1
}

note() {
    echo "$PROG: $*" >&2
}

require_root() {
    [ "$(id -u)" -eq 0 ] || die "'$1' must run as root (it calls apt-get); try: sudo $0 $1"
}

# abs_dir DIR -> prints the absolute path of DIR, creating it.
abs_dir() {
    mkdir -p -- "$1" || die "cannot create directory $1"
    (cd -- "$1" && pwd -P)
}

# existing_dir DIR -> absolute path of an existing DIR (no creation).
existing_dir() {
    [ -d "$1" ] || die "no such directory: $1"
    (cd -- "$1" && pwd -P)
}

valid_base() {
    case "$1" in
        '' | *[!0-9]*) die "BASE_PORT must be a number, got '$1'" ;;
    esac
    [ "$1" -ge 1024 ] && [ "$1" -le 65000 ] || die "BASE_PORT must be in 1024..65000, got $1"
}

# port_in_use PORT: true if something accepts TCP connections on 127.0.0.1:PORT.
port_in_use() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# pid_alive PID: true if PID exists and is not a zombie.
pid_alive() {
    local pid=$1 state
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    # field 3 of /proc/PID/stat is the state; the comm field (2) may contain
    # spaces, so strip everything up to the last ')'.
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# pid_matches PID MARKER: PID is alive and its command line contains MARKER.
pid_matches() {
    local pid=$1 marker=$2
    pid_alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$marker"
}

# read_pid PIDFILE -> prints the pid (digits only) or nothing.
read_pid() {
    local pid=""
    [ -r "$1" ] && read -r pid <"$1" || true
    case "$pid" in
        '' | *[!0-9]*) pid="" ;;
    esac
    printf '%s' "$pid"
}

# spawn PIDFILE LOGFILE CMD...: start CMD detached in its own session, stdout
# and stderr appended to LOGFILE; the child writes its own PID to PIDFILE and
# then execs CMD, so the recorded PID is the server's PID.
spawn() {
    local pidfile=$1 logfile=$2
    shift 2
    rm -f -- "$pidfile"
    setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" \
        </dev/null >>"$logfile" 2>&1 &
    # wait (briefly) for the pid file so callers can rely on it
    local i
    for i in $(seq 1 50); do
        [ -s "$pidfile" ] && return 0
        sleep 0.1
    done
    die "process for $pidfile did not start (see $logfile)"
}

# stop_pids MARKER PIDFILE...: SIGTERM each recorded (and still matching) PID,
# wait up to STOP_TIMEOUT (10) seconds for all, SIGKILL survivors, remove the
# pid files. Never signals anything not recorded in a pid file.
stop_pids() {
    local marker=$1
    shift
    local f pid pids=() waited=0 timeout=${STOP_TIMEOUT:-10}
    for f in "$@"; do
        [ -e "$f" ] || continue
        pid=$(read_pid "$f")
        if [ -n "$pid" ] && pid_matches "$pid" "$marker"; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
            note "sent SIGTERM to $pid ($(basename "$f" .pid))"
        elif [ -n "$pid" ]; then
            note "$(basename "$f" .pid): pid $pid not running (or not ours); nothing to stop"
        fi
    done
    while [ "${#pids[@]}" -gt 0 ] && [ "$waited" -lt $((timeout * 10)) ]; do
        local alive=()
        for pid in "${pids[@]}"; do
            pid_matches "$pid" "$marker" && alive+=("$pid")
        done
        pids=("${alive[@]+"${alive[@]}"}")
        [ "${#pids[@]}" -eq 0 ] && break
        sleep 0.1
        waited=$((waited + 1))
    done
    for pid in "${pids[@]+"${pids[@]}"}"; do
        if pid_matches "$pid" "$marker"; then
            note "pid $pid still running after ${timeout}s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    # give the kernel a moment to reap SIGKILLed processes
    for pid in "${pids[@]+"${pids[@]}"}"; do
        local i
        for i in $(seq 1 20); do
            pid_matches "$pid" "$marker" || break
            sleep 0.1
        done
    done
    for f in "$@"; do
        rm -f -- "$f"
    done
}

# apt_install PKG...: quiet, non-interactive apt-get install; runs
# 'apt-get update' first only if a package has no install candidate, and once
# more (then retries) if the install fails (e.g. stale lists -> 404).
# Package maintainer scripts are prevented from starting services (etcd-server
# ships a systemd unit) with a temporary /usr/sbin/policy-rc.d if none exists.
apt_install() {
    local log pkg policy need_update=0 created_policy=0 rc=0
    log=$(mktemp /tmp/rivals-apt.XXXXXX.log)
    export DEBIAN_FRONTEND=noninteractive
    for pkg in "$@"; do
        # (capture first: grep -q closing the pipe early + pipefail = false negative)
        policy=$(apt-cache policy "$pkg" 2>/dev/null || true)
        case "$policy" in
            *"Candidate: (none)"* | "") need_update=1 ;;
        esac
    done
    if [ "$need_update" -eq 1 ]; then
        note "apt-get update"
        apt-get update -qq >>"$log" 2>&1 || { tail -n 20 "$log" >&2; die "apt-get update failed (log: $log)"; }
    fi
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\n# temporary, created by bench/rivals: do not start services\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    note "apt-get install $* (log: $log)"
    if ! apt-get install -y -qq --no-install-recommends -o Dpkg::Use-Pty=0 "$@" >>"$log" 2>&1; then
        note "install failed; running apt-get update and retrying"
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends -o Dpkg::Use-Pty=0 "$@"; } >>"$log" 2>&1 || rc=$?
    fi
    if [ "$created_policy" -eq 1 ]; then
        rm -f /usr/sbin/policy-rc.d
        trap - EXIT
    fi
    if [ "$rc" -ne 0 ]; then
        tail -n 30 "$log" >&2
        die "apt-get install $* failed (log: $log)"
    fi
    rm -f -- "$log"
}

# Shared by the rival scripts: `endpoints` and the subcommand dispatch. Each
# script defines cmd_install, cmd_start, cmd_stop, cmd_status, endpoints_csv
# and read_base, sets PROG and SCRIPT, then calls `rival_main "$@"`.
cmd_endpoints() {
    [ $# -ge 1 ] || die "usage: $PROG endpoints DIR"
    local dir
    dir=$(existing_dir "$1")
    echo "endpoints: $(endpoints_csv "$(read_base "$dir")")"
}

usage() {
    sed -n '2,11p' "$SCRIPT" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

rival_main() {
    [ $# -ge 1 ] || usage
    local cmd=$1
    shift
    case "$cmd" in
        install) cmd_install "$@" ;;
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        status) cmd_status "$@" ;;
        endpoints) cmd_endpoints "$@" ;;
        -h | --help | help) usage ;;
        *) note "unknown command '$cmd'"; usage ;;
    esac
}
