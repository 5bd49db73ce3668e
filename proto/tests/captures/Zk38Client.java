// Zk38Client.java - drives ZooKeeper's own 3.8 Java client through the
// operations zkCli.sh cannot send, for scripts/zk-capture.py --run
// (zk38-java.txt): create2, exists with a Stat, getChildren (8 and 12),
// multi (create, createTTL, setData, check, delete; and one that fails),
// multiRead (with a missing node), checkWatches, a data watch firing.
// proto/tests/jute_captures.rs checks the frames against this: edit both.
//
// Run (JDK 11+ source launch):
//   java -cp /usr/share/java/zookeeper.jar:/usr/share/java/zookeeper-jute.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-nop.jar \
//       proto/tests/captures/Zk38Client.java 127.0.0.1:PORT
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.Op;
import org.apache.zookeeper.OpResult;
import org.apache.zookeeper.WatchedEvent;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooDefs.Ids;
import org.apache.zookeeper.ZooKeeper;
import org.apache.zookeeper.data.Stat;

public class Zk38Client {
    static byte[] b(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        CountDownLatch connected = new CountDownLatch(1);
        CountDownLatch changed = new CountDownLatch(1);
        ZooKeeper zk = new ZooKeeper(args[0], 10000, (WatchedEvent e) -> {
            System.out.println("event: " + e);
            if (e.getState() == Watcher.Event.KeeperState.SyncConnected && e.getType() == Watcher.Event.EventType.None) {
                connected.countDown();
            }
            if (e.getType() == Watcher.Event.EventType.NodeDataChanged) {
                changed.countDown();
            }
        });
        if (!connected.await(20, TimeUnit.SECONDS)) {
            throw new RuntimeException("not connected");
        }
        Stat st = new Stat();
        zk.create("/j", b("j0"), Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT, st);
        zk.create("/j/e-", b(""), Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL_SEQUENTIAL, st);
        System.out.println("exists: " + zk.exists("/j", true));
        zk.setData("/j", b("j1"), 0);
        if (!changed.await(20, TimeUnit.SECONDS)) {
            throw new RuntimeException("no NodeDataChanged");
        }
        System.out.println("children2: " + zk.getChildren("/j", false, st) + " " + st);
        System.out.println("children: " + zk.getChildren("/j", false));
        List<OpResult> ok = zk.multi(Arrays.asList(
                Op.create("/j/m", b("m"), Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT),
                Op.create("/j/t", b("t"), Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT_WITH_TTL, 60000),
                Op.setData("/j", b("j2"), 1),
                Op.check("/j", 2),
                Op.delete("/j/m", 0)));
        System.out.println("multi: " + ok.size());
        try {
            zk.multi(Arrays.asList(
                    Op.create("/j/n", b("n"), Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT),
                    Op.check("/j", 7),
                    Op.delete("/j/t", -1)));
            throw new RuntimeException("the failing multi succeeded");
        } catch (KeeperException.BadVersionException e) {
            System.out.println("multi failed as meant: " + e.getResults().size());
        }
        List<OpResult> read = zk.multi(Arrays.asList(Op.getChildren("/j"), Op.getData("/j"), Op.getData("/j/none")));
        System.out.println("multiRead: " + read.size());
        Watcher w = (WatchedEvent e) -> System.out.println("w: " + e);
        zk.exists("/j/none", w);
        zk.removeWatches("/j/none", w, Watcher.WatcherType.Data, false);
        zk.delete("/j/t", -1);
        zk.close();
    }
}
