#!/usr/bin/env bash
# The stores a lock protects, for the fence tests (fence/tests/) and the
# lock comparison, installed from Debian only when missing:
#   PostgreSQL (postgresql: initdb, postgres; baton_kit::stores::Postgres
#   runs a private cluster as the postgres user on a free port),
#   Redis (redis-server; baton_kit::stores::Redis runs a private one),
#   MariaDB (mariadb-server: mariadbd, mariadb-install-db;
#   baton_kit::stores::Mariadb runs a private one, for GET_LOCK).
# Services are not started (a temporary policy-rc.d); apt-get update runs
# once, and only if a package has no install candidate
# (bench/rivals/common.sh's apt_install).
set -euo pipefail
PROG=store-deps.sh
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=../bench/rivals/common.sh
. "$HERE/../bench/rivals/common.sh"

need=()
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || need+=(postgresql)
[ -x /usr/bin/redis-server ] || need+=(redis-server)
[ -x /usr/sbin/mariadbd ] || need+=(mariadb-server)
if [ ${#need[@]} -gt 0 ]; then
    require_root "install ${need[*]}"
    apt_install "${need[@]}"
fi
pg=$(compgen -G '/usr/lib/postgresql/*/bin/postgres' | sort -V | tail -n 1)
note "ready: $("$pg" --version), $(/usr/bin/redis-server --version | cut -d' ' -f1-3), MariaDB $(/usr/sbin/mariadbd --version | awk '{print $3}')"
