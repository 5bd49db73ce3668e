// Curator 5's recipes against Baton's ZooKeeper port, through a leader
// kill -9. Run by tests/tests/zookeeper_clients.rs (t60), which compiles
// this with javac, starts a 3-member cluster and then:
//
//   java CuratorRecipes mutex CONNECT ID FLAG DEADLINE_S      (4 processes)
//   java CuratorRecipes main CONNECT LEADER FLAG DEADLINE_S   (1 process)
//
// It kills the leader (SIGKILL) once the mutex workers' counter reaches
// KILL_AT (read through Baton's own port), then creates the file FLAG.
//
// mutex: InterProcessMutex on /curator/lock; under it a fenced counter
//   (/curator/fenced, "value owner n", set with the version read) and an
//   ephemeral holder node only the holder may create. A BadVersion or a
//   holder node that is not ours is a broken lock. The worker goes on
//   until FLAG exists and it made AFTER_KILL more increments, then prints
//   "DONE ID made".
// main: LeaderLatch with 3 candidates (exactly one leads; a closed
//   leader's latch hands over) and a CuratorCache on /curator/cache that
//   sees changes made before and after the kill, on a client that starts
//   on the leader; on that client also one-shot watches set before the
//   kill fire after it (the Java client re-sets them with setWatches),
//   and its session survives (SUSPENDED, RECONNECTED, never LOST).
//   Then a Curator transaction (ZooKeeper's multi): all ops' results, and
//   a failing check that leaves nothing behind; and a TTL node that the
//   cluster deletes once its TTL has passed.
//
// Any failure prints "FAIL: ..." and exits 1; every wait is bounded.

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.api.transaction.CuratorTransactionResult;
import org.apache.curator.framework.recipes.cache.ChildData;
import org.apache.curator.framework.recipes.cache.CuratorCache;
import org.apache.curator.framework.recipes.cache.CuratorCacheListener;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.data.Stat;

public class CuratorRecipes {
    static final int AFTER_KILL = 3;
    static final String LOCK = "/curator/lock";
    static final String COUNTER = "/curator/fenced";
    static final String HOLDER = "/curator/holder";
    static final String CACHE = "/curator/cache";

    static void fail(String msg) {
        System.out.println("FAIL: " + msg);
        System.out.flush();
        System.exit(1);
    }

    static void say(String msg) {
        System.out.println(msg);
        System.out.flush();
    }

    static void waitFor(String what, BooleanSupplier cond, long timeoutMs) throws InterruptedException {
        long end = System.currentTimeMillis() + timeoutMs;
        while (System.currentTimeMillis() < end) {
            if (cond.getAsBoolean()) return;
            Thread.sleep(50);
        }
        fail("timed out after " + timeoutMs + " ms waiting for " + what);
    }

    static CuratorFramework client(String connect) throws InterruptedException {
        return client(connect, false);
    }

    /**
     * A client whose operations retry on connection loss (Curator's
     * default with a retry policy); 10 s sessions outlive a leader election.
     * inOrder: the servers are tried in the order given (the Java client
     * shuffles them otherwise), so the first one is where it starts.
     */
    static CuratorFramework client(String connect, boolean inOrder) throws InterruptedException {
        CuratorFrameworkFactory.Builder b = CuratorFrameworkFactory.builder()
            .connectString(connect)
            .sessionTimeoutMs(10000)
            .connectionTimeoutMs(10000)
            .retryPolicy(new RetryNTimes(60, 250));
        if (inOrder) {
            b.zookeeperFactory((cs, timeout, watcher, ro) ->
                new org.apache.zookeeper.ZooKeeper(cs, timeout, watcher, ro, new InOrder(cs)));
        }
        CuratorFramework c = b.build();
        c.start();
        if (!c.blockUntilConnected(20, TimeUnit.SECONDS)) fail("no connection to " + connect + " within 20 s");
        return c;
    }

    /** ZooKeeper's HostProvider without the shuffle: the servers in turn. */
    static final class InOrder implements org.apache.zookeeper.client.HostProvider {
        private final List<java.net.InetSocketAddress> servers = new ArrayList<>();
        private int next = 0;

        InOrder(String connect) {
            for (String hp : connect.split(",")) {
                int colon = hp.lastIndexOf(':');
                servers.add(new java.net.InetSocketAddress(hp.substring(0, colon), Integer.parseInt(hp.substring(colon + 1))));
            }
        }

        public int size() {
            return servers.size();
        }

        public java.net.InetSocketAddress next(long spinDelay) {
            java.net.InetSocketAddress a = servers.get(next);
            next = (next + 1) % servers.size();
            if (next == 0 && spinDelay > 0) {
                // Every server tried: wait a little, as ZooKeeper's own provider does.
                try {
                    Thread.sleep(spinDelay);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            return a;
        }

        public void onConnected() {}

        public boolean updateServerList(java.util.Collection<java.net.InetSocketAddress> list, java.net.InetSocketAddress current) {
            return false;
        }
    }

    static String str(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 5) fail("usage: CuratorRecipes mutex|main CONNECT ID|LEADER FLAG DEADLINE_S");
        long deadline = System.currentTimeMillis() + Long.parseLong(args[4]) * 1000;
        Path flag = Path.of(args[3]);
        if (args[0].equals("mutex")) mutex(args[1], args[2], flag, deadline);
        else if (args[0].equals("main")) mainRole(args[1], args[2], flag, deadline);
        else fail("unknown role " + args[0]);
        System.exit(0);
    }

    // ---- mutex worker ----

    static void mutex(String connect, String id, Path flag, long deadline) throws Exception {
        CuratorFramework zk = client(connect);
        String me = id + "-" + UUID.randomUUID().toString().substring(0, 6);
        try {
            zk.create().creatingParentContainersIfNeeded().forPath(COUNTER, "0 nobody 0".getBytes(StandardCharsets.UTF_8));
        } catch (KeeperException.NodeExistsException e) {
            // another worker made it
        }
        InterProcessMutex lock = new InterProcessMutex(zk, LOCK);
        int made = 0, after = 0;
        while (true) {
            if (System.currentTimeMillis() > deadline) fail(me + ": deadline passed (killed flag: " + Files.exists(flag) + ")");
            boolean killed = Files.exists(flag);
            if (killed && after >= AFTER_KILL) break;
            if (!lock.acquire(30, TimeUnit.SECONDS)) fail(me + " did not get the lock within 30 s");
            try {
                increment(zk, me, made + 1);
                made++;
                if (killed) after++;
            } finally {
                lock.release();
            }
        }
        zk.close();
        say("DONE " + id + " " + made);
    }

    static void increment(CuratorFramework zk, String me, int n) throws Exception {
        byte[] mark = me.getBytes(StandardCharsets.UTF_8);
        try {
            zk.create().withMode(CreateMode.EPHEMERAL).forPath(HOLDER, mark);
        } catch (KeeperException.NodeExistsException e) {
            // Ours if a retried create had landed before the connection went.
            byte[] other = zk.getData().forPath(HOLDER);
            if (!str(other).equals(me)) fail("mutual exclusion: " + me + " holds the lock but " + str(other) + "'s holder node exists");
        }
        Stat st = new Stat();
        byte[] data = zk.getData().storingStatIn(st).forPath(COUNTER);
        long value = Long.parseLong(str(data).split(" ")[0]);
        byte[] mine = ((value + 1) + " " + me + " " + n).getBytes(StandardCharsets.UTF_8);
        try {
            zk.setData().withVersion(st.getVersion()).forPath(COUNTER, mine);
        } catch (KeeperException.BadVersionException e) {
            // Curator retries a set whose connection was lost: it may have
            // landed the first time. Anything but ours is another writer.
            byte[] now = zk.getData().forPath(COUNTER);
            if (!str(now).equals(str(mine))) fail("lost update: the counter changed under " + me + "'s lock: " + str(now));
        }
        try {
            zk.delete().forPath(HOLDER);
        } catch (KeeperException.NoNodeException e) {
            // a retried delete whose first try landed
        }
    }

    // ---- LeaderLatch and CuratorCache ----

    static void mainRole(String connect, String leader, Path flag, long deadline) throws Exception {
        // The cache's client starts on the leader: its connection dies at
        // the kill and its watches come back on another member.
        CuratorFramework cz = client(leader + "," + connect, true);
        cz.create().orSetData().creatingParentContainersIfNeeded().forPath(CACHE, "start".getBytes(StandardCharsets.UTF_8));
        Map<String, String> seen = new ConcurrentHashMap<>();
        List<String> events = java.util.Collections.synchronizedList(new ArrayList<>());
        CuratorCache cache = CuratorCache.build(cz, CACHE);
        cache.listenable().addListener(CuratorCacheListener.builder()
            .forCreates(n -> { seen.put(n.getPath(), str(n.getData())); events.add("create " + n.getPath()); })
            .forChanges((o, n) -> { seen.put(n.getPath(), str(n.getData())); events.add("change " + n.getPath()); })
            .forDeletes(o -> { seen.remove(o.getPath()); events.add("delete " + o.getPath()); })
            .build());
        cache.start();
        waitFor("the cache's initial view", () -> "start".equals(seen.get(CACHE)), 15000);

        List<CuratorFramework> cands = new ArrayList<>();
        List<LeaderLatch> latches = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            CuratorFramework c = client(connect);
            LeaderLatch l = new LeaderLatch(c, "/curator/latch", "cand-" + i);
            l.start();
            cands.add(c);
            latches.add(l);
        }
        waitFor("exactly one LeaderLatch leader", () -> leaders(latches) == 1, 20000);
        agree(latches);
        CuratorFramework w = client(connect);
        w.setData().forPath(CACHE, "before".getBytes(StandardCharsets.UTF_8));
        waitFor("the cache sees 'before'", () -> "before".equals(seen.get(CACHE)), 15000);
        // Plain one-shot watches on the cache's client: Curator leaves them
        // to the ZooKeeper client, which re-sets them after a reconnect
        // (setWatches). Its connection states: suspended, then reconnected.
        List<String> fired = java.util.Collections.synchronizedList(new ArrayList<>());
        List<String> states = java.util.Collections.synchronizedList(new ArrayList<>());
        cz.getConnectionStateListenable().addListener((c, st) -> states.add(st.toString()));
        cz.create().orSetData().forPath("/curator/oneshot", "0".getBytes(StandardCharsets.UTF_8));
        cz.getData().usingWatcher((org.apache.zookeeper.Watcher) e -> fired.add(e.getType() + " " + e.getPath()))
            .forPath("/curator/oneshot");
        if (cz.checkExists().usingWatcher((org.apache.zookeeper.Watcher) e -> fired.add(e.getType() + " " + e.getPath()))
            .forPath("/curator/later") != null) fail("/curator/later exists before it is made");
        say("latch+cache: ready before the kill");

        waitFor("the leader's kill (" + flag + ")", () -> Files.exists(flag), Math.max(1000, deadline - System.currentTimeMillis()));
        w.setData().forPath(CACHE, "after-kill".getBytes(StandardCharsets.UTF_8));
        w.create().forPath(CACHE + "/child", "c1".getBytes(StandardCharsets.UTF_8));
        waitFor("the cache sees 'after-kill' and the child",
            () -> "after-kill".equals(seen.get(CACHE)) && "c1".equals(seen.get(CACHE + "/child")), 30000);
        w.delete().forPath(CACHE + "/child");
        waitFor("the cache sees the child's delete", () -> !seen.containsKey(CACHE + "/child"), 15000);
        ChildData top = cache.get(CACHE).orElse(null);
        if (top == null || !str(top.getData()).equals("after-kill")) fail("the cache's node after the kill: " + top);
        say("cache: " + events.size() + " events, last " + events.get(events.size() - 1));
        w.setData().forPath("/curator/oneshot", "1".getBytes(StandardCharsets.UTF_8));
        w.create().forPath("/curator/later");
        waitFor("one-shot watches set before the kill fire after it",
            () -> fired.contains("NodeDataChanged /curator/oneshot") && fired.contains("NodeCreated /curator/later"), 20000);
        if (!states.contains("SUSPENDED") || !states.contains("RECONNECTED") || states.contains("LOST"))
            fail("the cache's client should lose its connection at the kill and keep its session: " + states);
        say("watches: one-shot " + fired + ", client states " + states);

        // After the kill: one leader again, all agree; hand over twice.
        waitFor("exactly one LeaderLatch leader after the kill", () -> leaders(latches) == 1, 30000);
        agree(latches);
        List<String> order = new ArrayList<>();
        for (int round = 0; round < 2; round++) {
            int at = leaderIndex(latches);
            order.add("cand-" + at);
            latches.get(at).close();
            latches.set(at, null);
            waitFor("a new leader after cand-" + at + " closed", () -> leaders(latches) == 1, 20000);
            agree(latches);
        }
        order.add("cand-" + leaderIndex(latches));
        say("latch: 3 candidates led in turn " + order);
        for (LeaderLatch l : latches) if (l != null) l.close();

        // multi, through the Java client: Curator's transaction.
        w.create().forPath("/curator/tx", "0".getBytes(StandardCharsets.UTF_8));
        Collection<CuratorTransactionResult> tx = w.transaction().forOperations(
            w.transactionOp().create().forPath("/curator/tx/a", "a".getBytes(StandardCharsets.UTF_8)),
            w.transactionOp().setData().withVersion(0).forPath("/curator/tx", "1".getBytes(StandardCharsets.UTF_8)),
            w.transactionOp().check().withVersion(1).forPath("/curator/tx"),
            w.transactionOp().delete().forPath("/curator/tx/a"));
        List<String> kinds = new ArrayList<>();
        for (CuratorTransactionResult r : tx) kinds.add(r.getType() + " " + r.getForPath());
        if (!kinds.toString().equals("[CREATE /curator/tx/a, SET_DATA /curator/tx, CHECK /curator/tx, DELETE /curator/tx/a]"))
            fail("a transaction's results: " + kinds);
        try {
            w.transaction().forOperations(
                w.transactionOp().create().forPath("/curator/tx/b"),
                w.transactionOp().check().withVersion(99).forPath("/curator/tx"));
            fail("a transaction with a failing check committed");
        } catch (KeeperException.BadVersionException e) {
            // expected: all or nothing
        }
        if (w.checkExists().forPath("/curator/tx/b") != null) fail("a failed transaction left its create behind");
        say("multi: " + kinds + "; a failing check leaves nothing");

        // A TTL node (createTTL): the cluster deletes it once its TTL passed.
        w.create().withTtl(500).withMode(CreateMode.PERSISTENT_WITH_TTL).forPath("/curator/ttl");
        waitFor("the TTL node's deletion", () -> {
            try {
                return w.checkExists().forPath("/curator/ttl") == null;
            } catch (Exception e) {
                return false;
            }
        }, 20000);
        say("ttl: a 500 ms TTL node was deleted");
        cache.close();
        for (CuratorFramework c : cands) c.close();
        w.close();
        cz.close();
        say("MAIN OK");
    }

    static int leaders(List<LeaderLatch> latches) {
        int n = 0;
        for (LeaderLatch l : latches) if (l != null && l.hasLeadership()) n++;
        return n;
    }

    static int leaderIndex(List<LeaderLatch> latches) {
        for (int i = 0; i < latches.size(); i++) if (latches.get(i) != null && latches.get(i).hasLeadership()) return i;
        fail("no leader");
        return -1;
    }

    /**
     * Every open latch names the one that believes it leads (within 10 s:
     * each reads its own member's state, which may lag a moment).
     */
    static void agree(List<LeaderLatch> latches) throws Exception {
        String id = latches.get(leaderIndex(latches)).getId();
        long end = System.currentTimeMillis() + 10000;
        for (LeaderLatch l : latches) {
            if (l == null) continue;
            String theirs = l.getLeader().getId();
            while (!theirs.equals(id) && System.currentTimeMillis() < end) {
                Thread.sleep(50);
                theirs = l.getLeader().getId();
            }
            if (!theirs.equals(id)) fail("latch " + l.getId() + " sees leader " + theirs + ", but " + id + " leads");
        }
    }
}
