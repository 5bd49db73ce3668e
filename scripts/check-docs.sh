#!/usr/bin/env bash
# Checks that the commands the docs show still exist.
#
#   scripts/check-docs.sh              every `baton ...`, `batond ...` and
#                                      `make ...` command in README.md and
#                                      docs/*.md (code blocks and inline code),
#                                      and every file path named there or in
#                                      a `//!` doc (it must exist)
#   scripts/check-docs.sh --run-readme instead runs README.md's shell
#                                      example blocks (those marked
#                                      `<!-- check-docs: run -->`) against
#                                      a fresh local 3-member cluster
#   scripts/check-docs.sh FILE...      the static check on these files only
#
# The static check asks the built binaries (`$CARGO_TARGET_DIR/debug`, or
# BATON_BIN_DIR) for `--help` of each subcommand path a command names, and
# fails when a subcommand or a `--flag` is not there; for `make` it checks
# the Makefile's targets. It runs nothing else and takes a few seconds.
# It also checks that README.md's Rust example is the `no_run` doctest in
# client/src/lib.rs, which `cargo test --doc` compiles. Each failure is
# printed as FILE:LINE, the command and what is wrong; the exit status is 1
# if there was any (2: the binaries are missing).
#
# What it does not check: positional arguments, flag values, short flags,
# and commands of other programs (cargo, baton-jepsen, baton-bench).
set -uo pipefail
cd "$(dirname "$0")/.."

BIN="${BATON_BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}"
RUN_README=0
FILES=()
for a in "$@"; do
  case "$a" in
    --run-readme) RUN_README=1 ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) FILES+=("$a") ;;
  esac
done
PATHS=0
[ ${#FILES[@]} -eq 0 ] && { FILES=(README.md docs/*.md); PATHS=1; }

for p in baton batond; do
  [ -x "$BIN/$p" ] || { echo "check-docs: $BIN/$p is missing: run 'cargo build --bins' (or set BATON_BIN_DIR)" >&2; exit 2; }
done
BIN=$(cd "$BIN" && pwd)

# ------------------------------------------------------------ extraction

# Prints "FILE<TAB>LINE<TAB>COMMAND" for every command-like text: lines of
# fenced code blocks (not rust/toml/json/yaml/proto ones), indented lines
# (code blocks, also inside list items) that start with a command, and
# inline `code` that starts with one. A line ending in a backslash
# continues on the next.
extract() {
  awk '
    function emit(line, text) { printf "%s\t%d\t%s\n", FILENAME, line, text }
    function starts_command(t) {
      sub(/^[ \t]+/, "", t)
      return t ~ /^(\$ |sudo )?([A-Z_][A-Z0-9_]*=[^ ]* )*([^ ]*\/)?(baton|batond|make)( |$)/
    }
    FNR == 1 { fence = 0; skip = 0; cont = "" }
    {
      raw = $0
      if (match(raw, /^[ \t]*(```|~~~)/)) {
        if (!fence) {
          fence = 1
          info = tolower(substr(raw, RSTART + RLENGTH))
          gsub(/^[ \t]+|[ \t]+$/, "", info)
          skip = (info ~ /^(rust|toml|json|yaml|yml|proto|protobuf|clojure|python|dockerfile|ini)/)
        } else { fence = 0; skip = 0 }
        cont = ""; next
      }
      code = (fence && !skip) || (!fence && raw ~ /^(    |\t)/ && starts_command(raw))
      if (code || cont != "") {
        text = raw
        if (cont != "") { text = cont " " text; line = cline } else line = FNR
        if (text ~ /\\[ \t]*$/) { sub(/\\[ \t]*$/, "", text); cont = text; cline = line; next }
        cont = ""
        emit(line, text)
        next
      }
      # Inline code spans (single backticks).
      s = raw
      while (match(s, /`[^`]+`/)) {
        span = substr(s, RSTART + 1, RLENGTH - 2)
        s = substr(s, RSTART + RLENGTH)
        if (starts_command(span)) emit(FNR, span)
      }
    }
  ' "$@"
}

# ------------------------------------------------------------ help cache

declare -A HELP_OPTS HELP_VALUED HELP_SUBS HELP_OK
TARGETS=" $(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -pRrq -f Makefile : 2>/dev/null | awk -F: '/^[A-Za-z0-9][A-Za-z0-9_.-]*:([^=]|$)/ { print $1 }' | sort -u | tr '\n' ' ') "

# Loads `PROG PATH... --help` into the caches under key "PROG PATH...".
load_help() {
  local key="$1"; shift
  [ -n "${HELP_OK[$key]+x}" ] && return 0
  local out
  if ! out=$("$BIN/$@" --help 2>&1); then
    HELP_OK[$key]=0
    return 1
  fi
  HELP_OK[$key]=1
  # Long options, with " <" (takes a value) or not; and the subcommands.
  HELP_OPTS[$key]=" $(printf '%s\n' "$out" | sed -nE 's/^[[:space:]]+(-[A-Za-z0-9], )?--([a-z0-9][a-z0-9-]*).*/\2/p' | tr '\n' ' ') "
  HELP_VALUED[$key]=" $(printf '%s\n' "$out" | sed -nE 's/^[[:space:]]+(-[A-Za-z0-9], )?--([a-z0-9][a-z0-9-]*)[ =]\[?<.*/\2/p' | tr '\n' ' ') "
  HELP_SUBS[$key]=" $(printf '%s\n' "$out" | awk '/^Commands:/ { on = 1; next } on && /^[^ ]/ { on = 0 } on && /^  [a-z]/ { print $1 }' | tr '\n' ' ') "
}

# ------------------------------------------------------------ checking

FAILS=0
CHECKED=0
fail() { # where, command, why
  printf 'check-docs: %s: `%s`\n    %s\n' "$1" "$2" "$3"
  FAILS=$((FAILS + 1))
}

# Checks one command (its words, quotes already collapsed).
check_words() {
  local where="$1" shown="$2"; shift 2
  local words=("$@")
  local prog="${words[0]##*/}"
  CHECKED=$((CHECKED + 1))
  if [ "$prog" = make ]; then
    local i w
    for ((i = 1; i < ${#words[@]}; i++)); do
      w="${words[$i]}"
      case "$w" in
        -C|-f|-j) i=$((i + 1)) ;;
        -*|*=*) ;;
        *) [[ "$TARGETS" == *" $w "* ]] || fail "$where" "$shown" "make has no target '$w' (Makefile)" ;;
      esac
    done
    return
  fi
  local path=("$prog") key="$prog" positional=0 i w name
  load_help "$key" "${path[@]}" || { fail "$where" "$shown" "'$key --help' failed"; return; }
  for ((i = 1; i < ${#words[@]}; i++)); do
    w="${words[$i]}"
    case "$w" in
      --) return ;;
      --*)
        name="${w#--}"; name="${name%%=*}"
        if [[ "${HELP_OPTS[$key]}" != *" $name "* ]]; then
          fail "$where" "$shown" "'$key' has no flag --$name (see: $key --help)"
          return # its value, if it takes one, cannot be told from a subcommand
        elif [[ "$w" != *=* && "${HELP_VALUED[$key]}" == *" $name "* ]]; then
          i=$((i + 1))
        fi
        ;;
      -*) ;; # short flags are not checked
      ...|'…') ;; # elided arguments
      *)
        if [ "$positional" -eq 0 ] && [ "${HELP_SUBS[$key]}" != "  " ]; then
          if [[ "${HELP_SUBS[$key]}" == *" $w "* ]]; then
            path+=("$w"); key="${path[*]}"
            load_help "$key" "${path[@]}" || { fail "$where" "$shown" "'$key --help' failed"; return; }
            continue
          fi
          # An upper-case word stands for any subcommand (`baton COMMAND
          # --help`): nothing more can be checked.
          [[ "$w" =~ ^[A-Z][A-Z0-9_-]*$ ]] && return
          fail "$where" "$shown" "'$key' has no subcommand '$w' (it has:${HELP_SUBS[$key]% })"
          return
        fi
        positional=1
        ;;
    esac
  done
}

# Splits a command-like text into commands and checks those of ours.
check_text() {
  local where="$1" text="$2" shown
  shown=$(printf '%s' "$text" | sed -E 's/^[[:space:]]*(\$ )?//; s/[[:space:]]+/ /g; s/ $//')
  # Quoted strings, $(...) and comments carry no flags of ours.
  local t
  t=$(printf '%s' "$text" | sed -E "s/'[^']*'/Q/g; s/\"[^\"]*\"/Q/g; s/\\$\\([^)]*\\)/Q/g; s/(^|[[:space:]])#.*$//")
  t=$(printf '%s' "$t" | sed -E 's/(&&|\|\||;|\||&)/\n/g')
  local seg
  while IFS= read -r seg; do
    local words=() w started=0
    read -ra raw <<<"$seg"
    for w in "${raw[@]}"; do
      if [ $started -eq 0 ]; then
        case "$w" in
          '$'|sudo|time|exec|nohup|env|command) continue ;;
          [A-Za-z_]*=*) continue ;;
        esac
        case "${w##*/}" in
          baton|batond|make) started=1; words+=("$w"); continue ;;
          timeout) continue ;;
          [0-9]*) continue ;; # timeout's duration
          *) break ;;
        esac
      fi
      case "$w" in
        '>'*|'<'*|[0-9]'>'*|'('*|')'*) break ;;
      esac
      words+=("$w")
    done
    [ ${#words[@]} -gt 0 ] && check_words "$where" "$shown" "${words[@]}"
  done <<<"$t"
}

static_check() {
  while IFS=$'\t' read -r file line text; do
    check_text "$file:$line" "$text"
  done < <(extract "${FILES[@]}")

  # README.md's Rust example must be the `no_run` doctest of
  # client/src/lib.rs (which `cargo test --doc` compiles), line for line.
  if [[ " ${FILES[*]} " == *" README.md "* ]]; then
    local tmp f d same
    tmp=$(mktemp -d)
    awk -v dir="$tmp" '/^```rust/ { on = 1; n++; print FNR > (dir "/line-" n); next }
      on && /^```/ { on = 0; next } on { print > (dir "/readme-" n) }' README.md
    sed -nE 's|^//! ?||p' client/src/lib.rs |
      awk -v dir="$tmp" '/^```no_run/ { on = 1; n++; next } on && /^```/ { on = 0; next } on { print > (dir "/doctest-" n) }'
    for f in "$tmp"/readme-*; do
      [ -e "$f" ] || continue
      CHECKED=$((CHECKED + 1))
      same=0
      for d in "$tmp"/doctest-*; do
        [ -e "$d" ] && cmp -s "$f" "$d" && same=1
      done
      [ $same -eq 1 ] || fail "README.md:$(cat "$tmp/line-${f##*-}")" "the Rust example" \
        "not the same text as the no_run doctest in client/src/lib.rs's module doc: make them the same"
    done
    rm -rf "$tmp"
  fi

  [ "$PATHS" -eq 1 ] && check_paths

  echo "check-docs: $CHECKED commands and paths in ${#FILES[@]} files and the //! docs, $FAILS failures"
  [ "$FAILS" -eq 0 ] || exit 1
}

# Names that look like repository files but are not: what they are.
NOT_OURS=(
  compare.md   # written by `baton-bench compare` into its --out dir
  scale.md     # written by `baton-bench scale` into its --out dir
  locks.md     # written by `baton-bench locks` into its --out dir
  zkCli.sh     # ZooKeeper's CLI (Debian's zookeeper package)
  bill.sh      # the example script of docs/recipes.md
  server.rs    # mini-redis's, cited by server/src/shutdown.rs
)

# Every file path named in a `//!` doc (any crate) or in README.md and
# docs/*.md exists in the repository: as written from the repository root
# or from the naming file's folder, or as the end of a tracked file's path
# (`driver/ready.rs`, `cluster.rs`). Absolute paths and URLs are not ours.
check_paths() {
  local files tokens f l t p c ok
  files=$(git ls-files)
  tokens=$(
    {
      git ls-files '*.rs' | xargs grep -n '^[[:space:]]*//!' /dev/null | sed -E 's/^([^:]*):([0-9]*):/\1\t\2\t/'
      for f in README.md docs/*.md; do awk -v F="$f" '{ printf "%s\t%d\t%s\n", F, NR, $0 }' "$f"; done
    } | awk -F'\t' '{
      n = split($3, w, /[^A-Za-z0-9_.\/:-]+/)
      for (i = 1; i <= n; i++) {
        t = w[i]; sub(/[.:]+$/, "", t); sub(/^[-:]+/, "", t)
        if (t !~ /\//) { if (w[i] ~ /^-/) continue }
        if (t ~ /:\/\// || t ~ /^\//) continue
        if (t ~ /[A-Za-z0-9_]\.(rs|md|sh|proto|toml|py|java|example|service)$/) print $1 "\t" $2 "\t" t
      }
    }'
  )
  while IFS=$'\t' read -r f l t; do
    [ -n "$t" ] || continue
    CHECKED=$((CHECKED + 1))
    [[ " ${NOT_OURS[*]} " == *" ${t##*/} "* ]] && continue
    ok=0
    for c in "$t" "$(dirname "$f")/$t"; do
      c=$(realpath -m --relative-to=. -- "$c")
      grep -qxF -- "$c" <<<"$files" && { ok=1; break; }
    done
    if [ $ok -eq 0 ]; then
      p="$t"
      while [[ "$p" == ./* || "$p" == ../* ]]; do p="${p#./}"; p="${p#../}"; done
      grep -qE -- "(^|/)${p//./\\.}\$" <<<"$files" && ok=1
    fi
    [ $ok -eq 1 ] || fail "$f:$l" "$t" "no such file in the repository (renamed or moved?)"
  done <<<"$tokens"
}

[ "$RUN_README" -eq 1 ] || { static_check; exit; }

# ------------------------------------------------------------ --run-readme

# Every fenced block right after a `<!-- check-docs: run -->` line in
# README.md runs, in order, in one bash (errexit, pipefail) against a
# 3-member cluster from `batond cluster`, with the binaries on PATH and
# BATON_ENDPOINTS set to the cluster's ports (the README's commands use
# the default endpoints). Bounded: 30 s for the cluster to elect a leader,
# 120 s (CHECK_DOCS_RUN_SECS) for the blocks; the cluster and anything the
# blocks left running are stopped whatever happens.
SCRIPT=$(awk '
  /<!-- check-docs: run -->/ { want = 1; next }
  want && /^```/ && !on { on = 1; next }
  on && /^```/ { on = 0; want = 0; print ""; next }
  on { print }
' README.md)
[ -n "$SCRIPT" ] || { echo "check-docs: README.md has no block marked <!-- check-docs: run -->"; exit 1; }

WORK=$(mktemp -d /tmp/baton-check-docs.XXXXXX)
CLUSTER_PID=
cleanup() {
  # What the examples left running (`cmd &`): their process group.
  [ -s "$WORK/run.pid" ] && kill -TERM -- "-$(cat "$WORK/run.pid")" 2>/dev/null
  if [ -n "$CLUSTER_PID" ] && kill -0 "$CLUSTER_PID" 2>/dev/null; then
    kill -TERM "$CLUSTER_PID" 2>/dev/null
    # `batond cluster` stops its members within 5 s of SIGTERM.
    for _ in $(seq 1 70); do kill -0 "$CLUSTER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$CLUSTER_PID" 2>/dev/null
  fi
  # Members left behind (the cluster process killed hard): by their pids.
  for pid in $(sed -nE 's/^member [0-9]+: pid ([0-9]+) .*/\1/p' "$WORK/cluster.out" 2>/dev/null); do
    kill -KILL "$pid" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A base port whose client, peer and HTTP ports are all free (bash's
# /dev/tcp: a connection that succeeds means the port is taken).
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
BASE=
for _ in $(seq 1 20); do
  b=$((20000 + (RANDOM % 400) * 100))
  ok=1
  for i in 1 2 3; do
    for off in 0 100 200; do port_free $((b + off + i)) || ok=0; done
  done
  [ $ok -eq 1 ] && { BASE=$b; break; }
done
[ -n "$BASE" ] || { echo "check-docs: no free base port found"; exit 1; }

"$BIN/batond" cluster --nodes 3 --data-dir "$WORK/cluster" --base-port "$BASE" >"$WORK/cluster.out" 2>&1 &
CLUSTER_PID=$!
export PATH="$BIN:$PATH"
export BATON_ENDPOINTS="127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2)),127.0.0.1:$((BASE + 3))"
up=0
deadline=$((SECONDS + 30))
while [ $SECONDS -lt $deadline ] && kill -0 "$CLUSTER_PID" 2>/dev/null; do
  if timeout 5 baton health >/dev/null 2>&1; then up=1; break; fi
  sleep 0.5
done
if [ $up -eq 0 ]; then
  echo "check-docs: the local cluster did not come up within 30 s:"
  cat "$WORK/cluster.out"; tail -n 20 "$WORK"/cluster/member-*.log 2>/dev/null
  exit 1
fi

# The examples run in a session of their own (setsid), so that whatever
# they leave in the background is stopped with their process group.
{
  printf 'echo $$ > %q\nset -x\n' "$WORK/run.pid"
  printf '%s\n' "$SCRIPT"
} >"$WORK/readme.sh"
echo "check-docs: running README.md's example blocks against a local cluster ($BATON_ENDPOINTS)"
RUN_SECS="${CHECK_DOCS_RUN_SECS:-120}"
# Output to a file, not a pipe: a command left in the background would
# hold a pipe open.
(cd "$WORK" && timeout "$RUN_SECS" setsid -w bash -euo pipefail "$WORK/readme.sh") >"$WORK/readme.out" 2>&1
rc=$?
kill -TERM -- "-$(cat "$WORK/run.pid")" 2>/dev/null
sed 's/^/    /' "$WORK/readme.out"
if [ "$rc" -ne 0 ]; then
  echo "check-docs: README.md's example blocks failed (exit $rc; 124: over $RUN_SECS s): the trace above (+ lines) shows how far they got"
  exit 1
fi
echo "check-docs: README.md's example blocks ran"
