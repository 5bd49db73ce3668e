"""kazoo's own test suite, unmodified, against Baton's ZooKeeper port.

    python kazoo_suite.py HOST:PORT,HOST:PORT,... [pytest arguments]

Runs the test files of the installed kazoo package (kazoo/tests: lock,
election, barrier, counter, queue, party, watchers, cache, lease,
partitioner) with pytest against the members given, which must be running.
kazoo's harness (kazoo.testing.harness) starts a Java ZooKeeper cluster of
its own; the one thing replaced here is where it finds the cluster:
`get_global_cluster` returns these members, already up, and starting,
stopping or tearing them down is left to whoever started them
(tests/tests/zookeeper_clients.rs t70). Every test, its client code and its
assertions are kazoo's. The exit status is pytest's.
"""

import importlib
import os
import sys

import kazoo.testing.harness as harness

# The files the issue names (kazoo 2.11).
FILES = [
    "lock",
    "election",
    "barrier",
    "counter",
    "queue",
    "party",
    "watchers",
    "cache",
    "lease",
    "partitioner",
]


class Member:
    """One member's ZooKeeper port, as kazoo's harness sees a server."""

    def __init__(self, address):
        self.address = address
        self.secure_address = address
        self.running = True

    def get_logs(self, num_lines=100):
        return []


class Members(list):
    """The running cluster: kazoo's harness may call these; the members
    are not this script's to start or stop."""

    def start(self):
        pass

    def stop(self):
        pass

    def terminate(self):
        pass

    def get_logs(self):
        return []


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    members = Members(Member(a) for a in sys.argv[1].split(",") if a)
    harness.get_global_cluster = lambda: members
    import pytest

    tests = os.path.dirname(importlib.import_module("kazoo.tests").__file__)
    files = [os.path.join(tests, "test_%s.py" % f) for f in FILES]
    args = ["-q", "-p", "no:cacheprovider", "--timeout=120", "-rfE", *files, *sys.argv[2:]]
    return pytest.main(args)


if __name__ == "__main__":
    sys.exit(main())
