// Curator 5 on Baton's ZooKeeper port sharing recipes with baton-client on
// the native port (and kazoo): run by tests/tests/zookeeper_clients.rs
// (t80), which compiles this with javac.
//
//   java CuratorInterop mutex CONNECT WHO FLAG DEADLINE_S
//   java CuratorInterop latch CONNECT WHO FLAG DEADLINE_S
//   java CuratorInterop selector CONNECT WHO FLAG DEADLINE_S
//   java CuratorInterop rwlock CONNECT WHO FLAG DEADLINE_S
//   java CuratorInterop semaphore CONNECT WHO FLAG DEADLINE_S
//
// mutex: InterProcessMutex on /interop/lock, the same lock as
//   baton-client's client.mutex("/interop/lock") and a kazoo Lock naming
//   its nodes as Curator does. Under it, the fenced counter /interop/counter
//   ("value token who"): the holder's token is its lock node's czxid (its
//   node is the first participant, and its session owns it); a counter
//   whose token is not below ours is a fence going backwards, a BadVersion
//   on the versioned set a lost update. After each increment the worker's
//   tally goes to /interop/tally/WHO. It stops once FLAG exists and prints
//   "DONE WHO made".
// latch: a LeaderLatch with id WHO on /interop/election, where a Baton
//   client already leads (client.election(path).campaign): it prints
//   "LATCH waiting" once it has queued, "LATCH not leader" if it still is
//   not leader 2 s later, "LATCH leader" when it leads (after the Baton
//   leader resigned), then closes the latch once FLAG exists.
// selector: a LeaderSelector with id WHO on /interop/selector, where a
//   Baton LeaderSelector::start_at already leads: "SELECTOR waiting" once
//   it has queued, "SELECTOR not leader" if it still does not lead 2 s
//   later, "SELECTOR leader LEADER_ID" once takeLeadership runs (after the
//   Baton selector's term ended; LEADER_ID is getLeader()'s id then), and
//   it gives up leadership (returns) once FLAG exists.
// rwlock: an InterProcessReadWriteLock on /interop/rwlock, where a Baton
//   client holds the write side (client.rw_lock_at(path).write()): its read
//   lock is refused for 2 s ("RW read blocked by writer"); once FLAG
//   exists (the Baton writer released and a Baton reader holds) its read
//   lock is granted beside the Baton reader ("RW read shared"), released;
//   its write lock is refused for 2 s ("RW write blocked by reader"), then
//   granted once the Baton reader releases ("RW write"); it releases once
//   FLAG.2 exists.
// semaphore: an InterProcessSemaphoreV2 of 2 leases on /interop/semaphore,
//   where a Baton client holds both permits (client.semaphore_at(path, 2)):
//   no lease within 2 s ("SEM blocked"); a lease once a Baton permit is
//   released ("SEM leased"), returned once FLAG exists.
//
// Any failure prints "FAIL: ..." and exits 1; every wait is bounded.

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.data.Stat;

public class CuratorInterop {
    static final String LOCK = "/interop/lock";
    static final String COUNTER = "/interop/counter";
    static final String ELECTION = "/interop/election";
    static final String SELECTOR = "/interop/selector";

    static void fail(String msg) {
        System.out.println("FAIL: " + msg);
        System.out.flush();
        System.exit(1);
    }

    public static void main(String[] a) throws Exception {
        String mode = a[0], connect = a[1], who = a[2];
        Path flag = Path.of(a[3]);
        long deadline = System.currentTimeMillis() + Long.parseLong(a[4]) * 1000;
        CuratorFramework c = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryNTimes(50, 200));
        c.start();
        if (!c.blockUntilConnected(30, TimeUnit.SECONDS)) {
            fail(who + ": not connected in 30 s");
        }
        if (mode.equals("mutex")) {
            mutex(c, who, flag, deadline);
        } else if (mode.equals("selector")) {
            selector(c, who, flag, deadline);
        } else if (mode.equals("rwlock")) {
            rwlock(c, who, flag, deadline);
        } else if (mode.equals("semaphore")) {
            semaphore(c, who, flag, deadline);
        } else {
            latch(c, who, flag, deadline);
        }
        c.close();
        System.exit(0);
    }

    static void mutex(CuratorFramework c, String who, Path flag, long deadline) throws Exception {
        InterProcessMutex m = new InterProcessMutex(c, LOCK);
        long session = c.getZookeeperClient().getZooKeeper().getSessionId();
        int made = 0;
        while (!Files.exists(flag)) {
            if (System.currentTimeMillis() > deadline) {
                fail(who + ": no FLAG before the deadline (" + made + " made)");
            }
            if (!m.acquire(30, TimeUnit.SECONDS)) {
                fail(who + ": the lock was not acquired in 30 s");
            }
            try {
                List<String> nodes = new ArrayList<>(m.getParticipantNodes());
                Stat mine = c.checkExists().forPath(nodes.get(0));
                if (mine == null || mine.getEphemeralOwner() != session) {
                    fail(who + ": holds the lock, but the first node " + nodes.get(0) + " is not its own");
                }
                long token = mine.getCzxid();
                Stat st = new Stat();
                String[] f = new String(c.getData().storingStatIn(st).forPath(COUNTER), StandardCharsets.UTF_8).split(" ");
                long value = Long.parseLong(f[0]);
                long last = Long.parseLong(f[1]);
                if (last >= token) {
                    fail(who + ": fence: the counter's token " + last + " (" + f[2] + ") is not below ours " + token);
                }
                byte[] next = (value + 1 + " " + token + " " + who).getBytes(StandardCharsets.UTF_8);
                try {
                    c.setData().withVersion(st.getVersion()).forPath(COUNTER, next);
                } catch (KeeperException.BadVersionException e) {
                    fail(who + ": lost update: the counter changed under our lock (version " + st.getVersion() + ")");
                }
                made++;
                byte[] tally = String.valueOf(made).getBytes(StandardCharsets.UTF_8);
                c.create().orSetData().creatingParentsIfNeeded().forPath("/interop/tally/" + who, tally);
            } finally {
                m.release();
            }
        }
        System.out.println("DONE " + who + " " + made);
    }

    static void latch(CuratorFramework c, String who, Path flag, long deadline) throws Exception {
        LeaderLatch l = new LeaderLatch(c, ELECTION, who);
        l.start();
        long until = System.currentTimeMillis() + 10000;
        while (l.getParticipants().stream().noneMatch(p -> p.getId().equals(who))) {
            if (System.currentTimeMillis() > until) {
                fail(who + ": the latch did not queue in 10 s");
            }
            Thread.sleep(50);
        }
        System.out.println("LATCH waiting");
        Thread.sleep(2000);
        if (l.hasLeadership()) {
            fail(who + ": the latch leads while the Baton candidate ahead of it does");
        }
        System.out.println("LATCH not leader");
        System.out.flush();
        if (!l.await(30, TimeUnit.SECONDS)) {
            fail(who + ": the latch did not lead within 30 s of queueing");
        }
        System.out.println("LATCH leader");
        System.out.flush();
        while (!Files.exists(flag)) {
            if (System.currentTimeMillis() > deadline) {
                fail(who + ": no FLAG before the deadline");
            }
            Thread.sleep(50);
        }
        l.close();
    }

    static void selector(CuratorFramework c, String who, Path flag, long deadline) throws Exception {
        java.util.concurrent.CountDownLatch led = new java.util.concurrent.CountDownLatch(1);
        LeaderSelector sel = new LeaderSelector(c, SELECTOR, new LeaderSelectorListenerAdapter() {
            @Override
            public void takeLeadership(CuratorFramework cf) throws Exception {
                led.countDown();
                while (!Files.exists(flag) && System.currentTimeMillis() < deadline) {
                    Thread.sleep(50);
                }
            }
        });
        sel.setId(who);
        sel.start();
        long until = System.currentTimeMillis() + 10000;
        while (sel.getParticipants().stream().noneMatch(p -> p.getId().equals(who))) {
            if (System.currentTimeMillis() > until) {
                fail(who + ": the selector did not queue in 10 s");
            }
            Thread.sleep(50);
        }
        System.out.println("SELECTOR waiting");
        Thread.sleep(2000);
        if (sel.hasLeadership()) {
            fail(who + ": the selector leads while the Baton selector ahead of it does");
        }
        System.out.println("SELECTOR not leader");
        System.out.flush();
        if (!led.await(30, TimeUnit.SECONDS)) {
            fail(who + ": the selector did not lead within 30 s of queueing");
        }
        System.out.println("SELECTOR leader " + sel.getLeader().getId());
        System.out.flush();
        while (!Files.exists(flag)) {
            if (System.currentTimeMillis() > deadline) {
                fail(who + ": no FLAG before the deadline");
            }
            Thread.sleep(50);
        }
        sel.close();
    }

    static void waitFor(Path flag, long deadline, String who) throws Exception {
        while (!Files.exists(flag)) {
            if (System.currentTimeMillis() > deadline) {
                fail(who + ": no " + flag + " before the deadline");
            }
            Thread.sleep(50);
        }
    }

    static void rwlock(CuratorFramework c, String who, Path flag, long deadline) throws Exception {
        InterProcessReadWriteLock rw = new InterProcessReadWriteLock(c, "/interop/rwlock");
        if (rw.readLock().acquire(2, TimeUnit.SECONDS)) {
            fail(who + ": a read lock granted while a Baton writer holds");
        }
        System.out.println("RW read blocked by writer");
        System.out.flush();
        waitFor(flag, deadline, who);
        if (!rw.readLock().acquire(10, TimeUnit.SECONDS)) {
            fail(who + ": the read lock not granted beside a Baton reader");
        }
        System.out.println("RW read shared");
        System.out.flush();
        rw.readLock().release();
        if (rw.writeLock().acquire(2, TimeUnit.SECONDS)) {
            fail(who + ": the write lock granted while a Baton reader holds");
        }
        System.out.println("RW write blocked by reader");
        System.out.flush();
        if (!rw.writeLock().acquire(30, TimeUnit.SECONDS)) {
            fail(who + ": the write lock not granted within 30 s");
        }
        System.out.println("RW write");
        System.out.flush();
        waitFor(Path.of(flag.toString() + ".2"), deadline, who);
        rw.writeLock().release();
    }

    static void semaphore(CuratorFramework c, String who, Path flag, long deadline) throws Exception {
        InterProcessSemaphoreV2 sem = new InterProcessSemaphoreV2(c, "/interop/semaphore", 2);
        Lease early = sem.acquire(2, TimeUnit.SECONDS);
        if (early != null) {
            fail(who + ": a lease granted while two Baton permits are held");
        }
        System.out.println("SEM blocked");
        System.out.flush();
        Lease l = sem.acquire(30, TimeUnit.SECONDS);
        if (l == null) {
            fail(who + ": no lease within 30 s of a Baton permit's release");
        }
        System.out.println("SEM leased");
        System.out.flush();
        waitFor(flag, deadline, who);
        sem.returnLease(l);
    }
}
