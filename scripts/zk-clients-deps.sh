#!/usr/bin/env bash
# The ZooKeeper client libraries tests/tests/zookeeper_clients.rs runs
# against the ZooKeeper port, installed only when missing:
#   Curator 5 from Debian (libcurator-recipes-java, libcurator-framework-java;
#   their jars name guava, slf4j-api and ZooKeeper's 3.8 jars), javac
#   (default-jdk-headless) and slf4j-simple (libslf4j-java);
#   kazoo from PyPI, pinned, in a virtualenv outside the repo
#   ($BATON_KAZOO_VENV, default /var/cache/baton-kazoo-venv), made with
#   Debian's python3 (python3-venv) and reused while it imports kazoo;
#   with what kazoo's own test suite needs (its `test` extra less gevent,
#   eventlet and pytest-cov, pinned) for tests/zk/kazoo_suite.py.
# apt-get update runs once, and only if a package has no install candidate
# (bench/rivals/common.sh's apt_install).
set -euo pipefail
PROG=zk-clients-deps.sh
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=../bench/rivals/common.sh
. "$HERE/../bench/rivals/common.sh"

KAZOO_VERSION=2.11.0
SUITE_DEPS=(pytest==9.2.0 pytest-timeout==2.4.0 objgraph==3.7.0 pyjks==20.0.0 pyopenssl==26.4.0)
VENV=${BATON_KAZOO_VENV:-/var/cache/baton-kazoo-venv}

need=()
[ -f /usr/share/java/curator-recipes.jar ] || need+=(libcurator-recipes-java)
[ -f /usr/share/java/curator-framework.jar ] || need+=(libcurator-framework-java)
[ -x /usr/bin/javac ] || need+=(default-jdk-headless)
[ -f /usr/share/java/slf4j-simple.jar ] || need+=(libslf4j-java)
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
    require_root "install ${need[*]}"
    apt_install "${need[@]}"
fi

if ! "$VENV/bin/python" -c "import kazoo.version as v; assert v.__version__ == '$KAZOO_VERSION'" 2>/dev/null; then
    note "making kazoo $KAZOO_VERSION's virtualenv in $VENV"
    rm -rf -- "$VENV"
    /usr/bin/python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
    "$VENV/bin/pip" install -q --disable-pip-version-check "kazoo==$KAZOO_VERSION" || die "pip install kazoo==$KAZOO_VERSION failed"
fi
if ! "$VENV/bin/python" -c 'import pytest, pytest_timeout, objgraph, jks, OpenSSL' 2>/dev/null; then
    note "adding kazoo's test-suite dependencies to $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${SUITE_DEPS[@]}" || die "pip install ${SUITE_DEPS[*]} failed"
fi
note "ready: Curator $(dpkg-query -W -f='${Version}' libcurator-recipes-java), kazoo $KAZOO_VERSION in $VENV"
