#!/usr/bin/env bash
# The advisory check (cargo-deny, offline, deterministic): every crate in
# Cargo.lock against a pinned copy of the RustSec advisory database. Any
# advisory that applies fails the check unless deny.toml lists it as an
# exception with its reason. See docs/advisories.md.
#
#   scripts/advisories.sh                  run the check (what `make advisories` does)
#   scripts/advisories.sh refresh GIT_DIR  replace the pinned copy with the
#                                          `crates/` tree of a RustSec advisory-db
#                                          git snapshot (bare or not), at its HEAD
#
# The pinned copy is plain files (crates/<name>/RUSTSEC-*.md, SOURCE): it is
# read from $BATON_ADVISORY_DB, by default ../shared/advisory-db beside the
# repository. cargo-deny only opens a database that is a git repository, so
# each run commits a copy of those files to a fresh repository in a temporary
# directory; nothing is fetched, and the result depends only on Cargo.lock,
# deny.toml and the pinned files.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# The pinned copy: $BATON_ADVISORY_DB, else ../shared/advisory-db beside the
# repository, else /work/shared/advisory-db (this workplace's shared folder).
db=${BATON_ADVISORY_DB:-}
if [ -z "$db" ]; then
  db=$root/../shared/advisory-db
  [ -d "$db/crates" ] || [ ! -d /work/shared/advisory-db/crates ] || db=/work/shared/advisory-db
fi
# Pinned so that a new cargo-deny release cannot change the verdict.
deny_version=0.20.2
# The directory cargo-deny derives from deny.toml's db-urls entry.
db_dir=advisory-db-3157b0e258782691

refresh() {
  local src=$1 tmp
  git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null 2>&1 \
    || git -C "$src" rev-parse --verify -q HEAD >/dev/null \
    || { echo "advisories: $src is not a git repository" >&2; exit 1; }
  local gd
  gd=$(git -C "$src" rev-parse --absolute-git-dir 2>/dev/null || echo "$src")
  tmp=$(mktemp -d)
  git --git-dir="$gd" archive HEAD crates LICENSE.txt | tar -x -C "$tmp"
  git --git-dir="$gd" log -1 --format='commit %H%ndate %cI' HEAD >"$tmp/SOURCE"
  rm -rf "$db"
  mkdir -p "$(dirname "$db")"
  mv "$tmp" "$db"
  chmod -R a+rX "$db"
  echo "advisories: $db now holds $(find "$db/crates" -name '*.md' | wc -l) advisories ($(sed -n 's/^date //p' "$db/SOURCE"))"
}

check() {
  if [ ! -d "$db/crates" ]; then
    # The database is data from a public snapshot: it may live only in the
    # shared folder, never in this repository (docs/advisories.md). Without
    # it there is nothing to check against: say so loudly, do not fail.
    echo "advisories: SKIPPED: no advisory database at $db (set BATON_ADVISORY_DB; docs/advisories.md)" >&2
    exit 0
  fi
  if ! cargo deny --version 2>/dev/null | grep -q " $deny_version\$"; then
    echo "advisories: installing cargo-deny $deny_version"
    cargo install --locked --quiet cargo-deny --version "$deny_version"
  fi
  check_tmp=$(mktemp -d /tmp/baton-advisories.XXXXXX)
  trap 'rm -rf "$check_tmp"' EXIT
  local tmp=$check_tmp
  mkdir -p "$tmp/$db_dir"
  cp -R "$db/crates" "$tmp/$db_dir/"
  (
    cd "$tmp/$db_dir"
    git init -q
    git add -A
    git -c user.name=baton -c user.email=baton@localhost -c commit.gpgsign=false commit -q -m "pinned advisory-db"
  )
  # The verdict must not depend on today's date, so the temporary repository
  # is committed now (cargo-deny's staleness check always passes) and the age
  # of the pinned snapshot is only reported.
  local date age
  date=$(sed -n 's/^date //p' "$db/SOURCE" 2>/dev/null || true)
  age=$(( ($(date +%s) - $(date -d "${date:-1970-01-01}" +%s)) / 86400 ))
  echo "advisories: RustSec snapshot of ${date:-unknown date} ($age days old), $(find "$db/crates" -name '*.md' | wc -l) advisories"
  if [ "$age" -gt 90 ]; then
    echo "advisories: note: the snapshot is over 90 days old; refresh it (docs/advisories.md)"
  fi
  cd "$root"
  # cargo-deny reads every crate of Cargo.lock, for every platform, from the
  # local registry and runs offline: on a new machine (no ~/.cargo/registry
  # yet) it fails with "failed to download ... --offline was specified".
  # Fetch them first; on a kept machine this is a no-op.
  cargo fetch --locked --quiet
  BATON_ADVISORY_DBS="$tmp" cargo deny --offline --locked --log-level warn check advisories
}

case "${1:-check}" in
  check) check ;;
  refresh)
    [ $# -eq 2 ] || { echo "usage: $0 refresh GIT_DIR" >&2; exit 2; }
    refresh "$2"
    ;;
  *)
    echo "usage: $0 [check | refresh GIT_DIR]" >&2
    exit 2
    ;;
esac
