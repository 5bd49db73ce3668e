#!/usr/bin/env bash
# zookeeper.sh - install and run a 3-server ZooKeeper quorum on 127.0.0.1, as
# a rival to benchmark Baton against.
#
# Usage:
#   zookeeper.sh install                 apt-get install zookeeper (if /usr/share/java/zookeeper.jar is missing)
#   zookeeper.sh start DIR [BASE_PORT]   start servers zk-1..3, wait for 1 leader + 2 followers
#   zookeeper.sh stop DIR                stop the servers whose PIDs are recorded in DIR
#   zookeeper.sh status DIR              print each server's Mode (exit 1 if any is not serving)
#   zookeeper.sh endpoints DIR           print "endpoints: 127.0.0.1:...,...,..."
#
# Ports (BASE defaults to 12180), all bound to 127.0.0.1 only:
#   client BASE+1..3, quorum (follower->leader) BASE+11..13, election BASE+21..23.
# Layout: DIR/zk-N/zoo.cfg, DIR/zk-N/data (dataDir + myid; txn logs and
# snapshots under data/version-2), DIR/zk-N.log (stdout+stderr), DIR/zk-N.pid,
# DIR/zk.base (the base port, for status/endpoints).
#
# Version: Debian 12 (bookworm) ships ZooKeeper 3.8.0 (package
#   3.8.0-11+deb12u2), run here on OpenJDK 17 with slf4j-simple 1.7.32 as the
#   logging backend (Debian's zookeeper.jar has no slf4j binding of its own).
# Durability: ZooKeeper's default forceSync=yes is kept (and written out
#   explicitly): every transaction is fsync'ed before it is acknowledged.
# Timing: tickTime=2000 (ZooKeeper's shipped default) unless ZK_TICK_MS is set;
#   minSessionTimeout=2*tick and maxSessionTimeout=20*tick (the defaults, made
#   explicit), i.e. 4 s..40 s at the default, so a 5 s session is accepted as is.
#   Session expiry is checked in tick-sized buckets, so with tick=2000 a 5 s
#   session expires 5-7 s after the client was last heard; ZK_TICK_MS=500 gives
#   1 s..10 s sessions expiring within 0.5 s of their timeout.
#
# Environment knobs: ZK_TICK_MS (default 2000; 5 s must stay within
# [2*tick, 20*tick], so 250..2500), ZK_HEAP (default 1000m: zkServer.sh's
# ZK_SERVER_HEAP default, given as -Xmx only as zkEnv.sh does), ZK_START_TIMEOUT
# (seconds, default 90), STOP_TIMEOUT (seconds before SIGKILL, default 10).

set -euo pipefail

PROG=zookeeper.sh
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
SCRIPT="${BASH_SOURCE[0]}"
# shellcheck source=common.sh
. "$HERE/common.sh"

DEFAULT_BASE=12180
SERVERS=(1 2 3)
ZK_JAR=/usr/share/java/zookeeper.jar
SLF4J_SIMPLE=/usr/share/java/slf4j-simple.jar

client_port() { echo $(($1 + $2)); }          # base, server
quorum_port() { echo $(($1 + 10 + $2)); }     # base, server
election_port() { echo $(($1 + 20 + $2)); }   # base, server

endpoints_csv() { # base
    local n out=""
    for n in "${SERVERS[@]}"; do
        out+="${out:+,}127.0.0.1:$(client_port "$1" "$n")"
    done
    echo "$out"
}

pidfiles() { # dir
    local n
    for n in "${SERVERS[@]}"; do echo "$1/zk-$n.pid"; done
}

stop_all() { # dir
    local -a pf
    mapfile -t pf < <(pidfiles "$1")
    stop_pids "$1/zk-" "${pf[@]}"
}

read_base() { # dir
    local base=""
    [ -r "$1/zk.base" ] && read -r base <"$1/zk.base" || true
    [ -n "$base" ] || die "$1/zk.base not found: was the quorum started with '$PROG start $1'?"
    echo "$base"
}

# find_slf4j_simple: prints the path of slf4j-simple's jar, or nothing.
find_slf4j_simple() {
    if [ -f "$SLF4J_SIMPLE" ]; then
        echo "$SLF4J_SIMPLE"
        return 0
    fi
    dpkg -L libslf4j-java 2>/dev/null | grep -E '/slf4j-simple[^/]*\.jar$' | head -n 1 || true
}

# logging_cp: prints the classpath entries for an SLF4J 1.7 binding.
# Preference: slf4j-simple; else (announced on stderr) slf4j-jdk14,
# slf4j-log4j12 + log4j 1.2, logback, and as a last resort slf4j-nop (no logs).
logging_cp() {
    local j
    j=$(find_slf4j_simple)
    if [ -n "$j" ]; then
        echo "$j"
        return 0
    fi
    if [ -f /usr/share/java/slf4j-jdk14.jar ]; then
        note "slf4j-simple not found; falling back to slf4j-jdk14 (java.util.logging) for ZooKeeper's logs"
        echo /usr/share/java/slf4j-jdk14.jar
    elif [ -f /usr/share/java/slf4j-log4j12.jar ] && [ -f /usr/share/java/log4j-1.2.jar ]; then
        note "slf4j-simple not found; falling back to slf4j-log4j12 + log4j 1.2 for ZooKeeper's logs"
        echo /usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar
    elif [ -f /usr/share/java/logback-classic.jar ] && [ -f /usr/share/java/logback-core.jar ]; then
        note "slf4j-simple not found; falling back to logback for ZooKeeper's logs"
        echo /usr/share/java/logback-classic.jar:/usr/share/java/logback-core.jar
    elif [ -f /usr/share/java/slf4j-nop.jar ]; then
        note "WARNING: no slf4j logging binding except slf4j-nop: ZooKeeper will log nothing"
        echo /usr/share/java/slf4j-nop.jar
    else
        note "WARNING: no slf4j binding found: ZooKeeper will log nothing (SLF4J falls back to NOP)"
        echo ""
    fi
}

cmd_install() {
    require_root install
    if [ -f "$ZK_JAR" ] && command -v java >/dev/null 2>&1; then
        note "zookeeper already installed ($ZK_JAR, package $(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null || echo '?'))"
    else
        apt_install zookeeper
        [ -f "$ZK_JAR" ] || die "$ZK_JAR still missing after installing zookeeper"
        note "installed zookeeper $(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null || echo '?')"
    fi
    command -v java >/dev/null 2>&1 || die "java not on PATH (zookeeper depends on default-jre; check the install)"
    if [ -z "$(find_slf4j_simple)" ]; then
        apt_install libslf4j-java
    fi
    local j
    j=$(find_slf4j_simple)
    if [ -n "$j" ]; then
        [ "$j" = "$SLF4J_SIMPLE" ] || note "slf4j-simple is at $j (not $SLF4J_SIMPLE); start uses it from there"
    else
        note "slf4j-simple not available; start will use: $(logging_cp 2>&1 | tr '\n' ' ')"
    fi
}

# zk_4lw PORT CMD: send a four-letter-word command, print the reply.
zk_4lw() {
    timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1; printf "%s" "$1" >&3; cat <&3' \
        "$1" "$2" 2>/dev/null
}

# zk_mode PORT: prints leader|follower|standalone|observer, or nothing.
zk_mode() {
    local out
    out=$(zk_4lw "$1" srvr || true)
    printf '%s\n' "$out" | sed -n 's/^Mode: //p' | head -n 1
}

print_log_tails() { # dir
    local n
    for n in "${SERVERS[@]}"; do
        echo "----- tail of $1/zk-$n.log -----" >&2
        tail -n 25 "$1/zk-$n.log" >&2 2>/dev/null || echo "(no log)" >&2
    done
}

write_config() { # dir base n tick
    local dir=$1 base=$2 n=$3 tick=$4 m
    mkdir -p "$dir/zk-$n/data"
    echo "$n" >"$dir/zk-$n/data/myid"
    {
        echo "# generated by bench/rivals/zookeeper.sh at $(date -Is); rewritten on every start"
        echo "tickTime=$tick"
        echo "initLimit=10"
        echo "syncLimit=5"
        echo "minSessionTimeout=$((2 * tick))"
        echo "maxSessionTimeout=$((20 * tick))"
        echo "dataDir=$dir/zk-$n/data"
        echo "clientPort=$(client_port "$base" "$n")"
        echo "clientPortAddress=127.0.0.1"
        for m in "${SERVERS[@]}"; do
            echo "server.$m=127.0.0.1:$(quorum_port "$base" "$m"):$(election_port "$base" "$m")"
        done
        echo "4lw.commands.whitelist=srvr,ruok,mntr,stat"
        echo "admin.enableServer=false"
        echo "# ZooKeeper's default, spelled out: fsync every txn log write"
        echo "forceSync=yes"
    } >"$dir/zk-$n/zoo.cfg"
}

cmd_start() {
    [ $# -ge 1 ] || die "usage: $PROG start DIR [BASE_PORT]"
    local dir base n p m pid tick heap cp log_cp timeout deadline modes leaders followers
    dir=$(abs_dir "$1")
    base=${2:-$DEFAULT_BASE}
    valid_base "$base"
    tick=${ZK_TICK_MS:-2000}
    case "$tick" in '' | *[!0-9]*) die "ZK_TICK_MS must be a number" ;; esac
    [ $((2 * tick)) -le 5000 ] && [ $((20 * tick)) -ge 5000 ] ||
        die "ZK_TICK_MS=$tick does not allow a 5 s session (needs 250..2500)"
    heap=${ZK_HEAP:-1000m}
    [ -f "$ZK_JAR" ] || die "$ZK_JAR not found; run: $0 install"
    command -v java >/dev/null 2>&1 || die "java not found; run: $0 install"

    for n in "${SERVERS[@]}"; do
        pid=$(read_pid "$dir/zk-$n.pid")
        if [ -n "$pid" ] && pid_matches "$pid" "$dir/zk-"; then
            die "zk-$n already running (pid $pid); run: $0 stop $dir"
        fi
    done
    for n in "${SERVERS[@]}"; do
        for p in "$(client_port "$base" "$n")" "$(quorum_port "$base" "$n")" "$(election_port "$base" "$n")"; do
            port_in_use "$p" && die "port $p on 127.0.0.1 is already in use"
        done
    done
    if [ -d "$dir/zk-1/data/version-2" ]; then
        note "reusing existing data in $dir/zk-N/data (delete $dir for a fresh quorum)"
    fi
    echo "$base" >"$dir/zk.base"

    log_cp=$(logging_cp)
    # zookeeper.jar's manifest Class-Path pulls in zookeeper-jute, slf4j-api,
    # netty, jackson, ... from /usr/share/java; slf4j-api is listed again for
    # clarity, plus the logging binding.
    cp="$ZK_JAR:/usr/share/java/slf4j-api.jar${log_cp:+:$log_cp}"

    for n in "${SERVERS[@]}"; do
        write_config "$dir" "$base" "$n" "$tick"
        echo "=== $(date -Is) $PROG start zk-$n ===" >>"$dir/zk-$n.log"
        spawn "$dir/zk-$n.pid" "$dir/zk-$n.log" \
            java "-Xmx$heap" -XX:+ExitOnOutOfMemoryError \
            -Djava.net.preferIPv4Stack=true \
            -Dorg.slf4j.simpleLogger.defaultLogLevel=info \
            -Dorg.slf4j.simpleLogger.showDateTime=true \
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSZ" \
            "-Dzookeeper.log.dir=$dir" \
            -cp "$cp" \
            org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zk-$n/zoo.cfg"
    done

    timeout=${ZK_START_TIMEOUT:-90}
    deadline=$((SECONDS + timeout))
    while :; do
        for n in "${SERVERS[@]}"; do
            pid=$(read_pid "$dir/zk-$n.pid")
            if ! pid_matches "$pid" "$dir/zk-"; then
                print_log_tails "$dir"
                note "zk-$n (pid ${pid:-?}) exited during startup; stopping the others"
                stop_all "$dir" || true
                exit 1
            fi
        done
        leaders=0 followers=0 modes=""
        for n in "${SERVERS[@]}"; do
            m=$(zk_mode "$(client_port "$base" "$n")")
            modes+=" zk-$n=${m:-not-serving}"
            case "$m" in
                leader) leaders=$((leaders + 1)) ;;
                follower) followers=$((followers + 1)) ;;
            esac
        done
        if [ "$leaders" -eq 1 ] && [ "$followers" -eq 2 ]; then
            break
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            print_log_tails "$dir"
            note "no leader + 2 followers after ${timeout}s (modes:$modes); stopping the quorum"
            stop_all "$dir" || true
            exit 1
        fi
        sleep 0.5
    done
    note "quorum up (tickTime=${tick}ms, sessions $((2 * tick))..$((20 * tick)) ms):$modes"
    echo "endpoints: $(endpoints_csv "$base")"
}

cmd_stop() {
    [ $# -ge 1 ] || die "usage: $PROG stop DIR"
    local dir
    dir=$(existing_dir "$1")
    stop_all "$dir"
}

cmd_status() {
    [ $# -ge 1 ] || die "usage: $PROG status DIR"
    local dir base n pid port m out rc=0
    dir=$(existing_dir "$1")
    base=$(read_base "$dir")
    for n in "${SERVERS[@]}"; do
        port=$(client_port "$base" "$n")
        pid=$(read_pid "$dir/zk-$n.pid")
        if [ -z "$pid" ] || ! pid_matches "$pid" "$dir/zk-"; then
            echo "zk-$n 127.0.0.1:$port pid=- down"
            rc=1
            continue
        fi
        out=$(zk_4lw "$port" srvr || true)
        m=$(printf '%s\n' "$out" | sed -n 's/^Mode: //p' | head -n 1)
        if [ -n "$m" ]; then
            echo "zk-$n 127.0.0.1:$port pid=$pid Mode: $m ($(printf '%s\n' "$out" | grep -m1 '^Zxid:' || true))"
        else
            echo "zk-$n 127.0.0.1:$port pid=$pid not serving: $(printf '%s' "$out" | tr '\n' ' ')"
            rc=1
        fi
    done
    return "$rc"
}

rival_main "$@"
