"""kazoo on Baton's ZooKeeper port sharing one lock with Curator and
baton-client (run by tests/tests/zookeeper_clients.rs, t80).

kazoo's Lock names its nodes `<uuid>__lock__<seq>`; Curator orders a
lock's nodes by what follows `lock-`, so it would misplace those. Named as
Curator names its nodes (`-lock-`, which kazoo's sort also reads), kazoo's
Lock queues in the same order as Curator's InterProcessMutex and
baton-client's mutex: one lock for all three.

Under the lock, the fenced counter /interop/counter ("value token who"):
the token is the czxid of this holder's lock node (which its session must
own); a counter whose token is not below ours is a fence going backwards,
a BadVersion a lost update. After each increment the tally goes to
/interop/tally/WHO. Stops once --flag exists and prints "DONE WHO made";
any failure prints "FAIL: ..." and exits 1.
"""

import argparse
import os
import sys
import time

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError
from kazoo.recipe.lock import Lock

LOCK = "/interop/lock"
COUNTER = "/interop/counter"


class CuratorLayoutLock(Lock):
    """kazoo's Lock, its nodes named as Curator's InterProcessMutex's."""

    _NODE_NAME = "-lock-"
    _EXCLUDE_NAMES = ["-lock-"]


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", required=True)
    ap.add_argument("--who", required=True)
    ap.add_argument("--flag", required=True)
    ap.add_argument("--deadline", type=float, default=90)
    a = ap.parse_args()
    deadline = time.monotonic() + a.deadline
    zk = KazooClient(hosts=a.hosts, timeout=10.0)
    zk.start(timeout=30)
    lock = CuratorLayoutLock(zk, LOCK, a.who)
    made = 0
    while not os.path.exists(a.flag):
        if time.monotonic() > deadline:
            fail("%s: no flag before the deadline (%d made)" % (a.who, made))
        if not lock.acquire(timeout=30):
            fail("%s: the lock was not acquired in 30 s" % a.who)
        try:
            mine = zk.exists(LOCK + "/" + lock.node)
            if mine is None or mine.ephemeralOwner != zk.client_id[0]:
                fail("%s: holds the lock, but its node %s is not its own" % (a.who, lock.node))
            token = mine.czxid
            data, stat = zk.get(COUNTER)
            value, last, writer = data.decode().split(" ")
            if int(last) >= token:
                fail("%s: fence: the counter's token %s (%s) is not below ours %d" % (a.who, last, writer, token))
            try:
                zk.set(COUNTER, ("%d %d %s" % (int(value) + 1, token, a.who)).encode(), version=stat.version)
            except BadVersionError:
                fail("%s: lost update: the counter changed under our lock (version %d)" % (a.who, stat.version))
            made += 1
            zk.ensure_path("/interop/tally")
            tally = "/interop/tally/" + a.who
            if zk.exists(tally) is None:
                zk.create(tally, str(made).encode())
            else:
                zk.set(tally, str(made).encode())
        finally:
            lock.release()
    print("DONE %s %d" % (a.who, made), flush=True)
    zk.stop()
    zk.close()


if __name__ == "__main__":
    main()
