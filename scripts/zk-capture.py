#!/usr/bin/env python3
r"""zk-capture.py - record the ZooKeeper wire frames between a client and a server.

A TCP proxy on a loopback port: every connection it accepts is forwarded to
the server, and each direction's length-prefixed frames are written to the
output file as hex, one frame per line. It is how
proto/tests/captures/zk38-zkcli.txt and zk38-java.txt were made (the fixtures that
proto/tests/jute_captures.rs decodes); the tests only read the fixtures and
never run this script.

Output, one line per frame (the 4-byte length prefix is not written):

    <conn> <dir> <label> <hex>

  conn   1, 2, ...: the proxied connection (a client that reconnects opens a
         new one)
  dir    C (client to server) or S (server to client)
  label  the opcode's name: for C frames from the request header (the first
         frame is "connect"); for S frames the name of the request whose xid
         the reply carries, or notification (xid -1), ping (-2), auth (-4),
         setWatches (-8); the first S frame is "connect"
Lines starting with # are comments (the header says what was recorded).

Usage:
  zk-capture.py --listen 127.0.0.1:PORT --server 127.0.0.1:PORT --out FILE
      [--cli-script FILE [--zkcli PATH] [--timeout MS] | --run CMD...] [--note TEXT]

Without --cli-script it proxies until interrupted (point any client at the
listen port). With --cli-script it runs zkCli.sh against the listen port with
the script's lines on stdin and exits when zkCli does. In the script, lines
starting with # are directives or comments:
  #sleep N   wait until every request was answered and the link has been
             quiet for a second, then sleep N seconds (with a short session
             timeout, long enough for the client to send a ping)
  #drop      wait as for #sleep, then close the client's connection (the
             client reconnects with its session id and re-sets its watches
             with setWatches2)
  # ...      a comment
Commands are otherwise handed to zkCli as they stand.

With --run, the rest of the command line is a command to run instead of
zkCli (its arguments' {listen} becomes the listen address); the proxy exits
when it does. zk38-java.txt is made that way with
proto/tests/captures/Zk38Client.java (see its header).

Regenerating the fixtures (Debian 12's zookeeper 3.8.0 package and its JDK):

  mkdir -p /tmp/zkcap/data
  printf '%s\n' tickTime=2000 dataDir=/tmp/zkcap/data clientPort=51307 \
      clientPortAddress=127.0.0.1 admin.enableServer=false >/tmp/zkcap/zoo.cfg
  java -Dzookeeper.extendedTypesEnabled=true -Djava.net.preferIPv4Stack=true \
      -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-simple.jar \
      org.apache.zookeeper.server.ZooKeeperServerMain /tmp/zkcap/zoo.cfg &
  scripts/zk-capture.py --listen 127.0.0.1:51308 --server 127.0.0.1:51307 \
      --cli-script proto/tests/captures/zk38-zkcli.cmds \
      --out proto/tests/captures/zk38-zkcli.txt --timeout 4000
  scripts/zk-capture.py --listen 127.0.0.1:51308 --server 127.0.0.1:51307 \
      --out proto/tests/captures/zk38-java.txt --run java -cp \
      /usr/share/java/zookeeper.jar:/usr/share/java/zookeeper-jute.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-nop.jar \
      proto/tests/captures/Zk38Client.java {listen}
  kill %1; rm -rf /tmp/zkcap

(extendedTypesEnabled lets the server take `create -t`; a fresh data dir
keeps the zxids and sequence numbers the tests expect. The tests check what
the commands sent, so an edited .cmds file means editing the tests too.)
"""

import argparse
import os
import socket
import struct
import subprocess
import sys
import threading
import time

OPS = {
    0: "notification", 1: "create", 2: "delete", 3: "exists", 4: "getData",
    5: "setData", 6: "getACL", 7: "setACL", 8: "getChildren", 9: "sync",
    11: "ping", 12: "getChildren2", 13: "check", 14: "multi", 15: "create2",
    16: "reconfig", 17: "checkWatches", 18: "removeWatches",
    19: "createContainer", 20: "deleteContainer", 21: "createTTL",
    22: "multiRead", 100: "auth", 101: "setWatches", 102: "sasl",
    103: "getEphemerals", 104: "getAllChildrenNumber", 105: "setWatches2",
    106: "addWatch", 107: "whoAmI", -10: "createSession", -11: "closeSession",
}
SPECIAL_XIDS = {-1: "notification", -2: "ping", -4: "auth", -8: "setWatches"}


def addr(s):
    host, _, port = s.rpartition(":")
    return host, int(port)


class Recorder:
    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()
        self.last = time.monotonic()
        self.pending = {}  # (conn, xid) -> op name
        self.conns = {}  # conn -> (client socket, server socket)
        self.connected = 0  # connect responses seen

    def frame(self, conn, direction, index, data):
        with self.lock:
            self.last = time.monotonic()
            if index == 0:
                label = "connect"
                if direction == "S":
                    self.connected += 1
            elif direction == "C" and len(data) >= 8:
                xid, op = struct.unpack(">ii", data[:8])
                label = OPS.get(op, "op%d" % op)
                if xid not in SPECIAL_XIDS:
                    self.pending[(conn, xid)] = label
            elif direction == "S" and len(data) >= 4:
                (xid,) = struct.unpack(">i", data[:4])
                label = SPECIAL_XIDS.get(xid) or self.pending.pop((conn, xid), "xid%d" % xid)
            else:
                label = "short"
            self.out.write("%d %s %s %s\n" % (conn, direction, label, data.hex()))
            self.out.flush()

    def quiet(self, secs=1.0, limit=30.0):
        """Waits until every request has a reply and nothing moved for secs."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            with self.lock:
                idle = time.monotonic() - self.last
                busy = bool(self.pending)
            if not busy and idle >= secs:
                return True
            time.sleep(0.1)
        return False


def pump(rec, conn, direction, src, dst):
    buf = b""
    index = 0
    try:
        while True:
            chunk = src.recv(65536)
            if not chunk:
                break
            dst.sendall(chunk)
            buf += chunk
            while len(buf) >= 4:
                (n,) = struct.unpack(">i", buf[:4])
                if n < 0 or len(buf) < 4 + n:
                    break
                rec.frame(conn, direction, index, buf[4 : 4 + n])
                index += 1
                buf = buf[4 + n :]
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(rec, listener, server):
    n = 0
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        n += 1
        upstream = socket.create_connection(server)
        with rec.lock:
            rec.conns[n] = (client, upstream)
        for d, a, b in (("C", client, upstream), ("S", upstream, client)):
            threading.Thread(target=pump, args=(rec, n, d, a, b), daemon=True).start()


def drive(rec, args, listen):
    with open(args.cli_script) as f:
        lines = f.read().splitlines()
    cmd = [args.zkcli, "-timeout", str(args.timeout), "-server", "%s:%d" % listen]
    cli = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=sys.stderr, stderr=subprocess.STDOUT, text=True)
    for line in lines:
        if line.startswith("#sleep") or line.startswith("#drop"):
            if not rec.quiet():
                print("zk-capture: requests still unanswered before %r" % line, file=sys.stderr)
            if line.startswith("#sleep"):
                time.sleep(float(line.split()[1]))
            else:
                with rec.lock:
                    seen = rec.connected
                    socks = list(rec.conns.values())
                    rec.conns.clear()
                for pair in socks:
                    for s in pair:
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                end = time.monotonic() + 30
                while rec.connected == seen and time.monotonic() < end:
                    time.sleep(0.1)
                rec.quiet()
            continue
        if line.startswith("#") or not line.strip():
            continue
        cli.stdin.write(line + "\n")
        cli.stdin.flush()
    rec.quiet()
    cli.stdin.close()
    return cli.wait(timeout=60)


def main():
    p = argparse.ArgumentParser(description="Record ZooKeeper frames through a TCP proxy.")
    p.add_argument("--listen", required=True, type=addr)
    p.add_argument("--server", required=True, type=addr)
    p.add_argument("--out", required=True)
    p.add_argument("--cli-script")
    p.add_argument("--zkcli", default="/usr/share/zookeeper/bin/zkCli.sh")
    p.add_argument("--timeout", type=int, default=4000, help="zkCli's session timeout, ms")
    p.add_argument("--note", default="", help="a line for the output's header")
    p.add_argument("--run", nargs=argparse.REMAINDER, help="a client command to run ({listen}: the listen address)")
    args = p.parse_args()
    if args.listen[0] not in ("127.0.0.1", "localhost", "::1"):
        p.error("--listen must be a loopback address")

    out = open(args.out, "w")
    out.write("# ZooKeeper frames recorded by scripts/zk-capture.py (%s)\n" % time.strftime("%Y-%m-%d"))
    out.write("# format: <conn> <C|S> <label> <hex of the frame without its length prefix>\n")
    if args.cli_script:
        out.write("# client: %s, commands: %s\n" % (args.zkcli, os.path.basename(args.cli_script)))
    elif args.run:
        out.write("# client: %s\n" % " ".join(os.path.basename(a) for a in args.run if ":" not in a))
    if args.note:
        out.write("# %s\n" % args.note)
    rec = Recorder(out)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(args.listen)
    listener.listen(8)
    threading.Thread(target=serve, args=(rec, listener, args.server), daemon=True).start()
    if args.run:
        listen = "%s:%d" % args.listen
        rc = subprocess.call([a.replace("{listen}", listen) for a in args.run], stdout=sys.stderr)
        rec.quiet(secs=0.5, limit=5)
        out.close()
        return rc
    if not args.cli_script:
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
    rc = drive(rec, args, args.listen)
    rec.quiet(secs=0.5, limit=5)
    listener.close()
    out.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
