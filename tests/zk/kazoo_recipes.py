"""kazoo's recipes against Baton's ZooKeeper port, through a leader kill -9.

Run by tests/tests/zookeeper_clients.rs (t50), which starts a 3-member
cluster, runs this with the members' ZooKeeper ports, watches the counter
node through Baton's own port and kills the leader (SIGKILL) once the lock
contenders have made KILL_AT increments; it then creates the file
--killed-flag. Everything else is asserted here; any failure exits 1 with
a line starting "FAIL:".

Phases:
  1. watchers: a DataWatch and a ChildrenWatch, on a client connected to
     the leader first (so its connection dies with the leader and its
     watches come back through setWatches on another member);
  2. Lock: CONTENDERS sessions (threads) increment a counter node under
     kazoo's Lock with a versioned set (the fenced counter). Mutual
     exclusion: an ephemeral holder node that only the holder may create,
     and a versioned set that a second holder would fail. No lost update:
     the counter ends at the sum of the increments each contender made.
     They keep going until the leader is dead and each has made
     AFTER_KILL more;
  3. after the kill: the watchers saw the changes made after it (their
     client lost its connection, was told so through its one-shot
     watches, and kept its session), then
     Election, Barrier, Counter, Queue and Party.

Every wait is bounded; the whole run has a deadline (--deadline seconds).
"""

import argparse
import os
import sys
import threading
import time
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError
from kazoo.retry import KazooRetry

CONTENDERS = 4
KILL_AT = 12  # the Rust side kills the leader once the counter reaches it
AFTER_KILL = 4  # increments each contender makes after the kill
ROOT = "/kazoo"
COUNTER = ROOT + "/fenced"
HOLDER = ROOT + "/holder"

failures = []
fail_lock = threading.Lock()


def fail(msg):
    with fail_lock:
        failures.append(msg)
    print("FAIL: " + msg, flush=True)


def say(msg):
    print(msg, flush=True)


def wait_for(what, cond, timeout):
    """Polls cond every 50 ms; False (and a failure) after timeout seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    fail("timed out after %ss waiting for %s" % (timeout, what))
    return False


def client(hosts, randomize=True):
    # Connection retries forever-ish within the deadline; commands retry on
    # connection loss only where the recipe does it itself.
    c = KazooClient(
        hosts=hosts,
        timeout=10.0,
        randomize_hosts=randomize,
        connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
    )
    c.start(timeout=15)
    return c


def retry(fn, *args, **kw):
    """Retries an idempotent call on connection loss (bounded)."""
    return KazooRetry(max_tries=60, delay=0.1, max_delay=0.5, ignore_expire=False)(fn, *args, **kw)


def fenced_increment(zk, me, n, holders):
    """One increment of COUNTER under the lock. The counter's data is
    "value owner n": on an ambiguous set (connection loss) a re-read tells
    whether ours landed; anything else than ours or the value we read is
    another writer inside the lock."""
    try:
        retry(zk.create, HOLDER, me.encode(), ephemeral=True)
    except NodeExistsError:
        # Ours if a retried create had landed before the connection went.
        data, _ = retry(zk.get, HOLDER)
        if data != me.encode():
            fail("mutual exclusion: %s holds the lock but %s's holder node exists" % (me, data.decode()))
            return False
    # Same-process check too: at most one contender inside at a time.
    with holders["lock"]:
        holders["in"] += 1
        if holders["in"] > 1:
            fail("mutual exclusion: %d contenders inside the lock at once" % holders["in"])
    try:
        data, stat = retry(zk.get, COUNTER)
        value = int(data.split()[0])
        mine = ("%d %s %d" % (value + 1, me, n)).encode()
        try:
            zk.set(COUNTER, mine, version=stat.version)
        except BadVersionError:
            fail("lost update: the counter changed under %s's lock (version %d)" % (me, stat.version))
            return False
        except (ConnectionLoss, SessionExpiredError) as e:
            now, _ = retry(zk.get, COUNTER)
            if now == mine:
                say("ambiguous set by %s landed (%s)" % (me, type(e).__name__))
            elif now == data:
                zk_set_again(zk, COUNTER, mine, stat.version)
            else:
                fail("lost update: after %s's ambiguous set the counter is %r" % (me, now))
                return False
        return True
    finally:
        with holders["lock"]:
            holders["in"] -= 1
        try:
            retry(zk.delete, HOLDER)
        except NoNodeError:
            pass  # a retried delete whose first try landed


def zk_set_again(zk, path, data, version):
    retry(zk.set, path, data, version=version)


def lock_phase(hosts, leader_host, killed_flag, deadline):
    setup = client(hosts)
    setup.ensure_path(ROOT)
    setup.create(COUNTER, b"0 nobody 0")
    holders = {"lock": threading.Lock(), "in": 0}
    made = [0] * CONTENDERS
    errors = []

    def contender(i):
        # Half the contenders start on the leader (they lose their
        # connection at the kill and resume their session elsewhere).
        h = leader_host + "," + hosts if i % 2 == 0 else hosts
        zk = client(h, randomize=i % 2 != 0)
        me = "c%d-%s" % (i, uuid.uuid4().hex[:6])
        lock = zk.Lock(ROOT + "/lock", me)
        after = 0
        try:
            while time.monotonic() < deadline:
                if os.path.exists(killed_flag):
                    if after >= AFTER_KILL:
                        break
                got = lock.acquire(timeout=30)
                if not got:
                    fail("%s did not get the lock within 30 s" % me)
                    return
                try:
                    killed = os.path.exists(killed_flag)
                    if fenced_increment(zk, me, made[i] + 1, holders):
                        made[i] += 1
                        if killed:
                            after += 1
                finally:
                    retry(lock.release)
            else:
                fail("%s: deadline passed in the lock phase (killed flag: %s)" % (me, os.path.exists(killed_flag)))
        except Exception as e:  # noqa: BLE001 - any error fails the run
            errors.append("%s: %r" % (me, e))
        finally:
            zk.stop()
            zk.close()

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(CONTENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, deadline - time.monotonic()))
    for e in errors:
        fail("lock contender raised " + e)
    if any(t.is_alive() for t in threads):
        fail("a lock contender is still running at the deadline")
    retry(setup.sync, COUNTER)  # reads are a member's state: see every write first
    data, _ = retry(setup.get, COUNTER)
    value = int(data.split()[0])
    total = sum(made)
    if value != total:
        fail("lost update: the counter is %d but the contenders made %d increments %s" % (value, total, made))
    if not os.path.exists(killed_flag):
        fail("the lock phase ended before the leader was killed")
    say("lock: %d contenders, %d fenced increments %s, counter %d" % (CONTENDERS, total, made, value))
    return setup


def election_phase(hosts):
    leaders = []
    inside = {"n": 0, "max": 0}
    guard = threading.Lock()
    clients = [client(hosts) for _ in range(3)]

    def run(i):
        e = clients[i].Election(ROOT + "/election", "cand-%d" % i)

        def lead():
            with guard:
                inside["n"] += 1
                inside["max"] = max(inside["max"], inside["n"])
                leaders.append(i)
            time.sleep(0.2)
            with guard:
                inside["n"] -= 1

        e.run(lead)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if any(t.is_alive() for t in threads):
        fail("election: a candidate never led within 30 s")
    if sorted(leaders) != [0, 1, 2] or inside["max"] != 1:
        fail("election: leaders %r, at most %d at once (want each once, one at a time)" % (leaders, inside["max"]))
    for c in clients:
        c.stop()
        c.close()
    say("election: 3 candidates led one at a time in order %r" % leaders)


def barrier_phase(zk, hosts):
    b = zk.Barrier(ROOT + "/barrier")
    b.create()
    other = client(hosts)
    released = []
    t = threading.Thread(target=lambda: released.append(other.Barrier(ROOT + "/barrier").wait(20)))
    t.start()
    time.sleep(0.3)
    if released:
        fail("barrier: a waiter passed a barrier that was up")
    b.remove()
    t.join(25)
    if released != [True]:
        fail("barrier: the waiter was not released when the barrier went: %r" % released)
    other.stop()
    other.close()
    say("barrier: held, then released")


def counter_phase(hosts):
    clients = [client(hosts) for _ in range(3)]
    per = 10

    def bump(c):
        k = c.Counter(ROOT + "/counter")
        for _ in range(per):
            k += 1

    threads = [threading.Thread(target=bump, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    clients[0].sync(ROOT + "/counter")
    value = clients[0].Counter(ROOT + "/counter").value
    if value != 3 * per:
        fail("counter: %d after 3 x %d increments" % (value, per))
    for c in clients:
        c.stop()
        c.close()
    say("counter: %d" % value)


def queue_phase(zk, hosts):
    q = zk.Queue(ROOT + "/queue")
    items = [b"item-%02d" % i for i in range(10)]
    for it in items:
        q.put(it)
    if len(q) != 10:
        fail("queue: length %d after 10 puts" % len(q))
    other = client(hosts)
    other.sync(ROOT + "/queue")
    q2 = other.Queue(ROOT + "/queue")
    got = []
    for _ in range(10):
        got.append((q if len(got) % 2 else q2).get())
    if got != items:
        fail("queue: got %r, want FIFO %r" % (got, items))
    if q.get() is not None:
        fail("queue: an item after all 10 were taken")
    other.stop()
    other.close()
    say("queue: 10 items FIFO across 2 sessions")


def party_phase(hosts):
    clients = [client(hosts) for _ in range(3)]
    parties = [c.Party(ROOT + "/party", "member-%d" % i) for i, c in enumerate(clients)]
    for p in parties:
        p.join()
    for c in clients:
        c.sync(ROOT + "/party")
    if len(parties[0]) != 3 or sorted(parties[1]) != ["member-0", "member-1", "member-2"]:
        fail("party: %d members %r after 3 joins" % (len(parties[0]), sorted(parties[1])))
    parties[2].leave()
    clients[1].stop()  # a member whose session closes leaves too
    clients[1].close()
    if not wait_for("party down to 1", lambda: len(parties[0]) == 1, 15):
        return
    if list(parties[0]) != ["member-0"]:
        fail("party: %r after a leave and a close" % list(parties[0]))
    for c in (clients[0], clients[2]):
        c.stop()
        c.close()
    say("party: 3 joined, 1 left, 1 closed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", required=True, help="host:port,... of every member's ZooKeeper port")
    ap.add_argument("--leader", required=True, help="host:port of the leader's ZooKeeper port")
    ap.add_argument("--killed-flag", required=True, help="a file that appears once the leader is dead")
    ap.add_argument("--deadline", type=float, default=75.0, help="seconds for the whole run")
    a = ap.parse_args()
    deadline = time.monotonic() + a.deadline

    # 1. watchers, on a client that starts on the leader.
    w = client(a.leader + "," + a.hosts, randomize=False)
    w.ensure_path(ROOT + "/watched")
    seen_data = []
    seen_children = []

    @w.DataWatch(ROOT + "/watched")
    def on_data(data, stat):
        seen_data.append(data)

    @w.ChildrenWatch(ROOT + "/watched")
    def on_children(children):
        seen_children.append(sorted(children))

    if not wait_for("the watchers' first call", lambda: seen_data and seen_children, 10):
        return finish()
    # Plain one-shot watches too. kazoo sends no setWatches: on a lost
    # connection it fires them with a NONE event (and its DataWatch and
    # ChildrenWatch read again once reconnected). Both must see the loss.
    states = []
    w.add_listener(lambda st: states.append(st))
    fired = []
    w.ensure_path(ROOT + "/oneshot")
    w.get(ROOT + "/oneshot", watch=lambda e: fired.append((e.type, e.path)))
    if w.exists(ROOT + "/later", watch=lambda e: fired.append((e.type, e.path))) is not None:
        fail("%s/later exists before it is made" % ROOT)
    w.set(ROOT + "/watched", b"before")
    wait_for("DataWatch sees 'before'", lambda: seen_data[-1:] == [b"before"], 10)
    say("watchers: registered on %s" % a.leader)

    # 2. the lock contenders, through the kill.
    setup = lock_phase(a.hosts, a.leader, a.killed_flag, deadline)

    # 3. after the kill: the watchers (re-set on another member) see new changes.
    retry(setup.set, ROOT + "/watched", b"after-kill")
    retry(setup.create, ROOT + "/watched/child-a")
    retry(setup.create, ROOT + "/watched/child-b")
    wait_for("DataWatch sees 'after-kill'", lambda: seen_data[-1:] == [b"after-kill"], 20)
    wait_for("ChildrenWatch sees both children", lambda: seen_children[-1:] == [["child-a", "child-b"]], 20)
    wait_for("one-shot watches told of the lost connection", lambda: fired == [("NONE", None)] * 2, 20)
    if "SUSPENDED" not in states or "LOST" in states or w.state != "CONNECTED":
        fail("the watchers' client should lose its connection at the kill and keep its session: %r" % states)
    say("watchers: after the kill saw data %r, children %r, one-shot %r; client states %r"
        % (seen_data[-1], seen_children[-1], sorted(fired), states))
    w.stop()
    w.close()

    election_phase(a.hosts)
    barrier_phase(setup, a.hosts)
    counter_phase(a.hosts)
    queue_phase(setup, a.hosts)
    party_phase(a.hosts)
    setup.stop()
    setup.close()
    if time.monotonic() > deadline:
        fail("the run took longer than %ss" % a.deadline)
    return finish()


def finish():
    if failures:
        print("FAIL: %d failure(s); first: %s" % (len(failures), failures[0]), flush=True)
        return 1
    say("ALL OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
