//! The `baton` CLI through its real binary: exit codes, values in and out
//! (stdin, files, hex, base64, non-UTF-8 through --json), subtrees (ls -R,
//! rm -r), txn, the lock kinds (--shared, --limit, --nonblock), signals,
//! a holder killed -9 taking its command's whole group with it (t35),
//! failing fast without a cluster, and `watch`. Every cluster address is
//! given as `localhost:PORT` (host names must work).
//!
//! Every `baton` run is bounded ([`RUN_LIMIT`]) and killed past it; every
//! wait polls a bounded number of times.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use baton_client::{Client, CreateOptions};
use baton_tests::{baton_bin, distinct_ports, eventually, Cluster};

const SECS: fn(u64) -> Duration = Duration::from_secs;
/// The longest one `baton` run may take in these tests.
const RUN_LIMIT: Duration = Duration::from_secs(20);

/// The cluster's endpoints with host names (`localhost:PORT`).
fn endpoints(c: &Cluster) -> String {
    c.endpoints().iter().map(|e| e.replace("127.0.0.1", "localhost")).collect::<Vec<_>>().join(",")
}

/// `baton --endpoints EPS ARGS`, stderr piped.
fn command(eps: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(baton_bin());
    cmd.arg(format!("--endpoints={eps}")).args(args).stderr(Stdio::piped());
    cmd
}

/// Runs `baton --endpoints EPS ARGS` with `input` on stdin; killed after
/// [`RUN_LIMIT`].
fn baton_in(eps: &str, args: &[&str], input: &[u8]) -> Output {
    let mut child = command(eps, args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn baton");
    let pid = child.id() as i32;
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    std::thread::spawn(move || stdin.write_all(&input));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(RUN_LIMIT) {
        Ok(out) => out.expect("wait for baton"),
        Err(_) => {
            signal(pid, libc::SIGKILL);
            panic!("baton {args:?} ran over {RUN_LIMIT:?}");
        }
    }
}

fn baton(eps: &str, args: &[&str]) -> Output {
    baton_in(eps, args, b"")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Asserts the exit code; returns stdout.
fn expect(o: Output, code: i32, what: &str) -> String {
    assert_eq!(o.status.code(), Some(code), "{what}: stdout {:?}, stderr {:?}", stdout(&o), stderr(&o));
    stdout(&o)
}

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}"))).collect()
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: signalling a process this test spawned.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// `baton --endpoints EPS ARGS` in the background (stdout discarded).
fn spawn_baton(eps: &str, args: &[&str]) -> Child {
    command(eps, args).stdin(Stdio::null()).stdout(Stdio::null()).spawn().expect("spawn baton")
}

/// The exit code of `child` (128+N for signal N), waiting at most `limit`.
async fn exit_of(child: &mut Child, limit: Duration) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("baton did not exit within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn queue_len(c: &Client, dir: &str) -> usize {
    c.children(dir).await.map(|k| k.len()).unwrap_or(0)
}

/// Values in every way, and their exit codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_values_round_trip_and_missing_nodes_exit_4() {
    let c = Cluster::start(3, &[]).await;
    let eps = &endpoints(&c);
    let dir = tempfile::tempdir().expect("tempdir");
    expect(baton(eps, &["create", "/v", "top"]), 0, "create");
    // stdin, as DATA `-` and as --file -.
    expect(baton_in(eps, &["create", "/v/stdin", "-"], b"from stdin\n"), 0, "create -");
    let got = json_lines(&expect(baton(eps, &["--json", "get", "/v/stdin"]), 0, "get"));
    assert_eq!(got[0]["data"], "from stdin\n");
    expect(baton_in(eps, &["set", "/v/stdin", "--file", "-"], b"again"), 0, "set --file -");
    assert_eq!(expect(baton(eps, &["get", "/v/stdin"]), 0, "get"), "again\n");
    // A binary file in, the same bytes out; --json never corrupts them.
    let bytes = [0u8, 0xff, b'\n', 0x80];
    let (input, output) = (dir.path().join("in.bin"), dir.path().join("out.bin"));
    std::fs::write(&input, bytes).expect("write");
    expect(baton(eps, &["create", "/v/bin", "--file", input.to_str().unwrap()]), 0, "create --file");
    expect(baton(eps, &["get", "/v/bin", "--file", output.to_str().unwrap()]), 0, "get --file");
    assert_eq!(std::fs::read(&output).expect("read"), bytes);
    let got = json_lines(&expect(baton(eps, &["--json", "get", "/v/bin"]), 0, "get --json"));
    assert_eq!(got[0]["data_base64"], "AP8KgA==", "{got:?}");
    assert!(got[0].get("data").is_none(), "a non-UTF-8 value as `data`: {got:?}");
    // Hex and base64, in and out.
    assert_eq!(expect(baton(eps, &["get", "/v/bin", "--hex"]), 0, "get --hex"), "00ff0a80\n");
    expect(baton(eps, &["set", "/v/bin", "--hex", "deadbeef"]), 0, "set --hex");
    assert_eq!(expect(baton(eps, &["get", "/v/bin", "--base64"]), 0, "get --base64"), "3q2+7w==\n");
    expect(baton_in(eps, &["set", "/v/bin", "--base64", "-"], b"AP8KgA==\n"), 0, "set --base64 -");
    assert_eq!(expect(baton(eps, &["get", "/v/bin", "--hex"]), 0, "get --hex"), "00ff0a80\n");
    let got = json_lines(&expect(baton(eps, &["--json", "get", "/v/bin", "--hex"]), 0, "get --json --hex"));
    assert_eq!(got[0]["data_hex"], "00ff0a80");
    expect(baton(eps, &["set", "/v/bin", "--hex", "zz"]), 2, "undecodable --hex");
    // Not found: 4, from every command that reads or changes a node.
    for args in [
        &["get", "/nope"][..],
        &["set", "/nope", "x"],
        &["rm", "/nope"],
        &["rm", "-r", "/nope"],
        &["ls", "/nope"],
        &["ls", "-R", "/nope"],
        &["stat", "/nope"],
    ] {
        expect(baton(eps, args), 4, &format!("{args:?} on a missing node"));
    }
    // Refused by the server: 1. A bad path: 2.
    expect(baton(eps, &["create", "/v", "again"]), 1, "create an existing node");
    expect(baton(eps, &["set", "/v", "x", "--version", "9"]), 1, "set at a wrong version");
    expect(baton(eps, &["get", "v"]), 2, "a relative path");
}

/// stat's readable times and owner; container and TTL nodes reaped; ls -R,
/// ls --stat, rm -r; txn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_subtrees_stat_and_txn() {
    let c = Cluster::start(3, &[]).await;
    let eps = &endpoints(&c);
    for p in ["/t/a/b", "/t/c"] {
        expect(baton(eps, &["create", p, "--parents"]), 0, "create --parents");
    }
    let tree = expect(baton(eps, &["ls", "-R", "/t"]), 0, "ls -R");
    assert_eq!(tree.lines().collect::<Vec<_>>(), ["/t", "/t/a", "/t/a/b", "/t/c"]);
    let paths: Vec<_> = json_lines(&expect(baton(eps, &["--json", "ls", "-R", "/t"]), 0, "ls -R --json"))
        .iter()
        .map(|v| v["path"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(paths, ["/t", "/t/a", "/t/a/b", "/t/c"]);
    let long = expect(baton(eps, &["ls", "--stat", "/t"]), 0, "ls --stat");
    assert!(long.lines().next().unwrap_or_default().starts_with("VERSION"), "{long}");
    assert!(long.lines().nth(1).unwrap_or_default().ends_with(" a") && long.lines().count() == 3, "{long}");
    // An ephemeral node: stat shows its owner in hex and readable times.
    let owner = c.client().await;
    owner.create("/t/eph", "x", CreateOptions::ephemeral()).await.expect("create");
    let stat = expect(baton(eps, &["stat", "/t/eph"]), 0, "stat");
    assert!(stat.contains(&format!("ephemeral_owner = {:#x}", owner.session_id())), "{stat}");
    let ctime = stat.lines().find(|l| l.starts_with("ctime = ")).expect("ctime line");
    let (utc, ms) = ctime["ctime = ".len()..].split_once(' ').expect("time and ms");
    assert!(is_rfc3339(utc) && ms.ends_with(" ms)"), "{ctime}");
    let j = json_lines(&expect(baton(eps, &["--json", "stat", "/t/eph"]), 0, "stat --json"));
    assert!(is_rfc3339(j[0]["stat"]["mtime_utc"].as_str().unwrap_or_default()), "{j:?}");
    assert_eq!(j[0]["stat"]["ephemeral_owner"], owner.session_id());
    // Container and TTL nodes: stat shows them; the cluster deletes them
    // once due (the container once its last child goes).
    expect(baton(eps, &["create", "/box", "--container"]), 0, "create --container");
    expect(baton(eps, &["create", "/box/item"]), 0, "a child");
    expect(baton(eps, &["create", "/lease", "--ttl", "300"]), 0, "create --ttl");
    assert!(expect(baton(eps, &["stat", "/box"]), 0, "stat").contains("container = true"));
    let j = json_lines(&expect(baton(eps, &["--json", "stat", "/lease"]), 0, "stat --json"));
    assert_eq!(j[0]["stat"]["ttl_ms"], 300, "{j:?}");
    // An ephemeral TTL node is a usage error now, before any request (the
    // cluster refuses one too: state tests).
    let bad = baton(eps, &["create", "/bad", "--ephemeral", "--ttl", "300"]);
    assert!(stderr(&bad).contains("cannot be used with"), "{}", stderr(&bad));
    expect(bad, 2, "an ephemeral TTL node");
    expect(baton(eps, &["rm", "/box/item"]), 0, "delete the child");
    eventually(SECS(20), "/box and /lease reaped", || async {
        let (b, l) = (owner.exists("/box").await.ok()?, owner.exists("/lease").await.ok()?);
        (b.is_none() && l.is_none()).then_some(())
    })
    .await;
    // rm -r: the whole subtree, children first (another session's
    // ephemeral node included); rm -r / is refused.
    let out = json_lines(&expect(baton(eps, &["--json", "rm", "-r", "/t"]), 0, "rm -r"));
    assert_eq!(out[0]["nodes"], 5, "{out:?}");
    assert_eq!(owner.exists("/t").await.expect("exists"), None);
    expect(baton(eps, &["rm", "-r", "/"]), 2, "rm -r /");
    // txn: all applied, each result printed.
    let ops =
        ["create /x/a 1 --parents", "set /x/a 2 --version 0", "check /x/a --version 1", "create /x/s- --sequential"];
    let text = expect(baton(eps, &[&["txn"][..], &ops].concat()), 0, "txn");
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines[..3], ["created /x/a", "set /x/a version 1", "checked /x/a"], "{text}");
    assert!(lines[3].starts_with("created /x/s-") && lines[3].len() == "created /x/s-".len() + 10, "{text}");
    // A failing op: named, nothing applied, the exit code of its error.
    let out = baton(eps, &["txn", "create /x/b 1", "set /x/a 3 --version 9"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("txn op 2 of 2 `set /x/a 3 --version 9` failed"), "{}", stderr(&out));
    // One numbering (issue 28, U8): not also the server's 0-based `#1`.
    assert!(!stderr(&out).contains('#'), "{}", stderr(&out));
    assert_eq!(owner.exists("/x/b").await.expect("exists"), None, "a refused txn was applied in part");
    expect(baton_in(eps, &["txn"], b"# from stdin\ncreate /x/c\n\nrm /nope\n"), 4, "txn op on a missing node");
    let out = baton_in(eps, &["--json", "txn"], b"create /x/c 'a b'\nrm /x/c\n");
    let lines = json_lines(&expect(out, 0, "txn from stdin"));
    assert_eq!((lines[0]["op"].as_str(), lines[1]["op"].as_str()), (Some("create"), Some("rm")));
    expect(baton(eps, &["txn", "create /x/d --bogus"]), 2, "a malformed op");
    owner.close().await.expect("close");
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|x| x.iter().all(u8::is_ascii_digit));
    b.len() == 24
        && digits(0..4)
        && digits(5..7)
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && digits(14..16)
        && digits(17..19)
        && digits(20..23)
        && b[23] == b'Z'
}

/// Shell script: touch `mine`, then wait (up to 10 s) for `other` to
/// exist; exit 0 if it did, 9 if not.
fn meet(dir: &Path, mine: &str, other: &str) -> String {
    let (m, o) = (dir.join(mine), dir.join(other));
    format!("touch {m:?}; for i in $(seq 200); do [ -e {o:?} ] && exit 0; sleep 0.05; done; exit 9")
}

/// --shared holders together; --limit 2 admits two and queues a third;
/// --nonblock and --timeout exit 7; SIGTERM ends a wait (143, no node left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_lock_kinds_nonblock_and_signals() {
    let c = Cluster::start(3, &[]).await;
    let eps = &endpoints(&c);
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let watcher = c.client().await;
    // Two --shared holders at once: each waits for the other inside.
    let mut readers = [meet(d, "r1", "r2"), meet(d, "r2", "r1")]
        .map(|s| spawn_baton(eps, &["lock", "--shared", "rw", "--", "sh", "-c", &s]));
    for r in &mut readers {
        assert_eq!(exit_of(r, SECS(15)).await, 0, "the --shared holders did not hold together");
    }
    // A writer holds: a --shared try fails at once with 7.
    let writer = watcher.write_lock("rw").await.expect("write lock");
    let t = Instant::now();
    expect(baton(eps, &["lock", "--shared", "rw", "--nonblock", "--", "true"]), 7, "--shared -n under a writer");
    assert!(t.elapsed() < SECS(5), "--nonblock waited {:?}", t.elapsed());
    writer.release().await.expect("release");
    expect(baton(eps, &["lock", "--shared", "rw", "-n", "--", "true"]), 0, "--shared -n on a free lock");
    // --limit 2: two holders; a third is refused (-n, --timeout), or waits.
    let mut holders = [meet(d, "p1", "release"), meet(d, "p2", "release")]
        .map(|s| spawn_baton(eps, &["lock", "--limit", "2", "pool", "--", "sh", "-c", &s]));
    eventually(SECS(10), "two permits held", || async {
        (d.join("p1").exists() && d.join("p2").exists()).then_some(())
    })
    .await;
    expect(baton(eps, &["lock", "--limit", "2", "pool", "-n", "--", "true"]), 7, "a third permit, -n");
    let t = Instant::now();
    expect(baton(eps, &["lock", "--limit", "2", "pool", "--timeout", "500ms", "--", "true"]), 7, "--timeout");
    assert!(t.elapsed() >= Duration::from_millis(500), "gave up early");
    // Finding A8: the size is stored with the semaphore; asking for 3
    // while two hold a 2-permit one is refused (usage), never a third.
    expect(baton(eps, &["lock", "--limit", "3", "pool", "-n", "--", "true"]), 2, "another size, -n");
    let third_ran = d.join("p3");
    let mut third = spawn_baton(eps, &["lock", "--limit", "2", "pool", "--", "touch", third_ran.to_str().unwrap()]);
    eventually(SECS(5), "the third waits in the queue", || async {
        (queue_len(&watcher, "/_baton/semaphores/pool/leases").await == 3).then_some(())
    })
    .await;
    assert!(!third_ran.exists(), "a third holder ran while two held");
    std::fs::write(d.join("release"), "").expect("release");
    for h in holders.iter_mut().chain([&mut third]) {
        assert_eq!(exit_of(h, SECS(15)).await, 0);
    }
    assert!(third_ran.exists(), "the third never ran");
    // The mutex: -n exits 7 while held; SIGTERM ends a waiter with 143
    // and leaves no node behind.
    let held = watcher.lock("m").await.expect("lock");
    expect(baton(eps, &["lock", "m", "-n", "--", "true"]), 7, "-n on a held lock");
    let mut waiter = spawn_baton(eps, &["lock", "m", "--", "true"]);
    eventually(SECS(5), "the waiter queued", || async {
        (queue_len(&watcher, "/_baton/locks/m").await == 2).then_some(())
    })
    .await;
    signal(waiter.id() as i32, libc::SIGTERM);
    assert_eq!(exit_of(&mut waiter, SECS(10)).await, 143, "SIGTERM while waiting");
    eventually(SECS(5), "the waiter's node gone", || async {
        (queue_len(&watcher, "/_baton/locks/m").await == 1).then_some(())
    })
    .await;
    held.release().await.expect("release");
    expect(baton(eps, &["--json", "lock", "m", "--", "true"]), 2, "--json with lock");
    // --path: the lock whose queue is a path's children, the same lock as
    // `client.mutex(path)` (and Curator's InterProcessMutex at that path).
    let at = watcher.mutex("/app/locks/db").expect("mutex");
    let held = at.lock().await.expect("lock at a path");
    expect(baton(eps, &["lock", "--path", "/app/locks/db", "-n", "--", "true"]), 7, "--path -n while held");
    let ran = d.join("path-lock");
    let script = format!("echo \"$BATON_LOCK_NAME $BATON_FENCE_TOKEN\" > {}", ran.display());
    let mut waiter = spawn_baton(eps, &["lock", "--path", "/app/locks/db", "--", "sh", "-c", &script]);
    eventually(SECS(5), "the --path waiter queued under the path", || async {
        (queue_len(&watcher, "/app/locks/db").await == 2).then_some(())
    })
    .await;
    let token = held.fencing_token();
    held.release().await.expect("release");
    assert_eq!(exit_of(&mut waiter, SECS(10)).await, 0, "the --path waiter ran");
    let out = std::fs::read_to_string(&ran).expect("the command's output");
    let (name, next) = out.trim().split_once(' ').expect("name and token");
    assert_eq!(name, "/app/locks/db");
    assert!(next.parse::<u64>().expect("a token") > token, "{next} after {token}");
    expect(baton(eps, &["lock", "--path", "/", "--", "true"]), 2, "--path /");
    expect(baton(eps, &["lock", "--path", "/a", "--write", "--", "true"]), 2, "--path with --write");
    watcher.close().await.expect("close");
}

/// Without a cluster: malformed endpoints are usage errors at once;
/// unreachable ones are each listed with why (exit 5, within the dial
/// timeout); a member that accepts but never answers fails within
/// --command-timeout, every endpoint's state listed.
/// True while process `pid` runs (exists and is not a zombie).
fn running(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    state.is_some_and(|s| s != "Z")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t35_a_holder_killed_9_takes_its_command_and_its_children_with_it() {
    // Finding Z3: `baton lock` killed -9 (the OOM killer) left its command
    // running while the next `baton lock` was granted the lock.
    let c = Cluster::start(3, &[]).await;
    let eps = &endpoints(&c);
    let dir = tempfile::tempdir().expect("tempdir");
    let (sh_file, bg_file) = (dir.path().join("sh"), dir.path().join("bg"));
    // A shell with a child of its own, as a job script has.
    let script = format!("sleep 60 & echo $! > {}; echo $$ > {}; wait", bg_file.display(), sh_file.display());
    let args = ["lock", "--session-timeout", "3s", "--grace", "1s", "job", "--", "sh", "-c", &script];
    let mut first = spawn_baton(eps, &args);
    let read_pid = |f: &Path| std::fs::read_to_string(f).ok().and_then(|s| s.trim().parse::<i32>().ok());
    let (sh, bg) = eventually(SECS(15), "the first holder's command runs", || async {
        Some((read_pid(&sh_file)?, read_pid(&bg_file)?))
    })
    .await;
    assert!(running(sh) && running(bg));
    signal(first.id() as i32, libc::SIGKILL);
    let _ = first.wait();
    // The next holder, once the session expired, finds nothing of the
    // first one's command running.
    let check = format!(
        "for p in {sh} {bg}; do s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1); \
         [ -n \"$s\" ] && [ \"$s\" != Z ] && echo \"alive $p\"; done; echo granted"
    );
    let out = expect(baton(eps, &["lock", "--timeout", "15s", "job", "--", "sh", "-c", &check]), 0, "the next holder");
    assert!(out.contains("granted"), "{out}");
    assert!(!out.contains("alive"), "the killed holder's command still ran when the lock passed on: {out}");
    assert!(!running(sh) && !running(bg));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_fail_fast_and_clearly_without_a_cluster() {
    for bad in ["foo", "localhost:99999", "localhost:0", "http://localhost:7101", "::1:7101", ""] {
        let t = Instant::now();
        let out = baton(bad, &["get", "/x"]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("HOST:PORT") || stderr(&out).contains("port"), "{bad:?}: {}", stderr(&out));
        assert!(t.elapsed() < SECS(2), "{bad:?} took {:?}", t.elapsed());
    }
    let ports = distinct_ports(3);
    let dead = [format!("127.0.0.1:{}", ports[0]), format!("localhost:{}", ports[1])];
    let t = Instant::now();
    let out = baton(&dead.join(","), &["get", "/x"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(dead.iter().all(|e| err.contains(e.as_str())) && err.contains("refused"), "{err}");
    assert_eq!(err.matches("no member answered").count(), 1, "printed more than once: {err}");
    assert!(t.elapsed() < SECS(3), "took {:?}", t.elapsed());
    // Accepts connections, never answers.
    let silent = tokio::net::TcpListener::bind(("127.0.0.1", ports[2])).await.expect("bind");
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            conns.push(s);
        }
    });
    let eps = format!("127.0.0.1:{},{}", ports[2], dead[0]);
    let t = Instant::now();
    let out = baton(&eps, &["--dial-timeout", "300ms", "--command-timeout", "1s", "get", "/x"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("each endpoint now") && err.contains(&dead[0]) && err.contains(&format!(":{}", ports[2])),
        "{err}"
    );
    assert!(t.elapsed() < SECS(5), "--command-timeout 1s took {:?}", t.elapsed());
    held.abort();
}

/// `baton watch` in the background with stdout piped to a file; returns
/// the child and the file.
/// Waits until it says (on stderr) that the watch is registered.
async fn spawn_watch(eps: &str, args: &[&str], dir: &Path, name: &str) -> (Child, std::path::PathBuf) {
    let file = dir.join(name);
    let err_file = dir.join(format!("{name}.err"));
    let out = std::fs::File::create(&file).expect("watch output file");
    let err = std::fs::File::create(&err_file).expect("watch stderr file");
    let child = command(eps, args).stdin(Stdio::null()).stdout(out).stderr(err).spawn().expect("spawn baton watch");
    eventually(SECS(10), "the watch to be registered", || async {
        std::fs::read_to_string(&err_file).unwrap_or_default().contains("watching").then_some(())
    })
    .await;
    (child, file)
}

/// `baton watch`: each change once, the changed node named, values on
/// data events (non-UTF-8 ones as base64 in --json), deeper nodes only with
/// --recursive, SIGTERM a clean stop (exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_watch_names_each_change_once_with_its_value() {
    let c = Cluster::start(3, &[]).await;
    let eps = endpoints(&c);
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut flat, flat_out) = spawn_watch(&eps, &["--json", "watch", "/w"], dir.path(), "flat").await;
    let (mut deep, deep_out) = spawn_watch(&eps, &["--json", "watch", "/w", "--recursive"], dir.path(), "deep").await;
    // Both registered before the changes: the first change shows in both.
    let client = c.client().await;
    client.create("/w", "top", CreateOptions::persistent()).await.expect("create /w");
    eventually(SECS(10), "both watches to see /w", || async {
        let seen = |f: &Path| std::fs::read_to_string(f).unwrap_or_default().contains("\"/w\"");
        (seen(&flat_out) && seen(&deep_out)).then_some(())
    })
    .await;
    client.create("/w/kid", vec![0xffu8, 0x00], CreateOptions::persistent()).await.expect("create kid");
    client.create("/w/kid/deep", "d", CreateOptions::persistent()).await.expect("create deep");
    client.delete("/w/kid/deep", None).await.expect("delete deep");
    client.set("/w", "top2", None).await.expect("set /w");
    client.delete("/w/kid", None).await.expect("delete kid");
    client.delete("/w", None).await.expect("delete /w");
    let want_flat = 5;
    eventually(SECS(10), "the flat watch to print every change", || async {
        (std::fs::read_to_string(&flat_out).unwrap_or_default().lines().count() >= want_flat).then_some(())
    })
    .await;
    eventually(SECS(10), "the recursive watch to print every change", || async {
        (std::fs::read_to_string(&deep_out).unwrap_or_default().lines().count() >= want_flat + 2).then_some(())
    })
    .await;
    for child in [&mut flat, &mut deep] {
        signal(child.id() as i32, libc::SIGTERM);
        assert_eq!(exit_of(child, SECS(10)).await, 0, "SIGTERM must stop a watch cleanly");
    }
    let flat = json_lines(&std::fs::read_to_string(&flat_out).expect("flat output"));
    let seen: Vec<(String, String)> = flat
        .iter()
        .map(|e| (e["type"].as_str().unwrap_or("").to_string(), e["path"].as_str().unwrap_or("").to_string()))
        .collect();
    let pair = |t: &str, p: &str| (t.to_string(), p.to_string());
    assert_eq!(
        seen,
        vec![
            pair("NODE_CREATED", "/w"),
            pair("NODE_CREATED", "/w/kid"),
            pair("NODE_DATA_CHANGED", "/w"),
            pair("NODE_DELETED", "/w/kid"),
            pair("NODE_DELETED", "/w"),
        ],
        "each change once, deeper ones left out"
    );
    assert_eq!(flat[0]["data"], "top");
    assert_eq!(flat[1]["data_base64"], "/wA=", "a non-UTF-8 value is base64 in --json");
    assert_eq!(flat[2]["data"], "top2");
    let deep = json_lines(&std::fs::read_to_string(&deep_out).expect("deep output"));
    let deep_paths: Vec<&str> = deep.iter().filter_map(|e| e["path"].as_str()).collect();
    assert_eq!(deep_paths, ["/w", "/w/kid", "/w/kid/deep", "/w/kid/deep", "/w", "/w/kid", "/w"]);
}

/// `get`, `ls` and `stat` read without a session: no Raft write (the
/// applied index does not move), and with `--stale` they answer on a member
/// cut off from the quorum, where a linearizable read is refused.
#[tokio::test]
async fn t70_reads_need_no_session_and_stale_reads_no_quorum() {
    let mut c = Cluster::start(3, &[]).await;
    let eps = endpoints(&c);
    let client = c.client().await;
    client.create("/r", "v1", CreateOptions::persistent()).await.unwrap();
    client.create("/r/kid", "k", CreateOptions::persistent()).await.unwrap();
    client.close().await.unwrap();
    let leader = c.wait_leader(SECS(10)).await;
    // The leader's own entries after an election (its cluster record: the
    // id, then who joined, at most once per election timeout) may still be
    // on their way: wait until every member is recorded as joined, then
    // until the applied index holds still.
    eventually(SECS(10), "every member recorded as joined", || async {
        c.status(leader).await.filter(|s| !s.cluster_id.is_empty() && s.joined.len() == 3).map(|_| ())
    })
    .await;
    // Members' address reports and the record are proposed at most once
    // per election timeout (500 ms): still for two looks 600 ms apart.
    let mut before = c.wait_applied(leader, 0, SECS(5)).await;
    let mut still = 0;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = c.status(leader).await.expect("leader status");
        still = if now.applied_index == before.applied_index { still + 1 } else { 0 };
        before = now;
        if still == 2 {
            break;
        }
    }
    assert_eq!(expect(baton(&eps, &["get", "/r"]), 0, "get"), "v1\n");
    assert_eq!(expect(baton(&eps, &["ls", "/r"]), 0, "ls"), "kid\n");
    assert!(expect(baton(&eps, &["stat", "/r"]), 0, "stat").contains("num_children = 1"));
    expect(baton(&eps, &["ls", "-R", "-l", "/r"]), 0, "ls -R -l");
    expect(baton(&eps, &["get", "/none"]), 4, "get of a missing node");
    let after = c.status(leader).await.expect("leader status");
    assert_eq!(after.sessions, before.sessions, "a read opened a session");
    assert_eq!(after.applied_index, before.applied_index, "reads made Raft writes");

    // Only member 3 left: no quorum.
    let survivor = 3;
    for id in [1, 2] {
        c.kill(id);
    }
    let alone = c.endpoint(survivor).replace("127.0.0.1", "localhost");
    let v = expect(baton(&alone, &["get", "--stale", "/r"]), 0, "stale get without a quorum");
    assert_eq!(v, "v1\n");
    expect(baton(&alone, &["ls", "--stale", "/r"]), 0, "stale ls without a quorum");
    expect(baton(&alone, &["stat", "--stale", "/r"]), 0, "stale stat without a quorum");
    let o = baton(&alone, &["--command-timeout", "2s", "get", "/r"]);
    expect(o, 5, "linearizable get without a quorum");
}

/// Issue 28, U6: with 2 of 3 members stopped (they accept connections and
/// never answer), `status` and `health` ask every member at once and give
/// each `--dial-timeout`, instead of a fixed 3 s per hung member one after
/// another (6.5 s before).
#[tokio::test]
async fn t75_status_and_health_give_hung_members_the_dial_timeout_at_once() {
    let mut c = Cluster::start(3, &[]).await;
    let eps = endpoints(&c);
    c.wait_leader(SECS(10)).await;
    for id in [1, 2] {
        c.pause(id, true);
    }
    for cmd in ["status", "health"] {
        let t = Instant::now();
        let o = baton(&eps, &["--dial-timeout", "300ms", cmd]);
        let took = t.elapsed();
        let (out, err) = (stdout(&o), stderr(&o));
        assert_eq!(o.status.code(), Some(1), "{cmd}: {out}{err}");
        let hung = out.lines().filter(|l| l.contains("no answer in 300ms")).count();
        assert_eq!(hung, 2, "{cmd}: each stopped member named, with the timeout: {out}");
        assert!(out.contains(&c.endpoint(3).replace("127.0.0.1", "localhost")), "{cmd}: {out}");
        // Questions to every member at once (300 ms), after the members
        // question (at once too, 300 ms): far below the 6 s of two 3 s waits.
        assert!(took < SECS(4), "{cmd} took {took:?}");
    }
    for id in [1, 2] {
        c.pause(id, false);
    }
}

/// Issue 28, U6: with the quorum lost (2 of 3 members stopped), a write, a
/// create and `lock --nonblock` stop with exit 5 and "no quorum" once the
/// quorum watch has seen it twice, not after `--command-timeout` (30 s
/// here; they waited it out before); nothing was applied.
#[tokio::test]
async fn t76_without_a_quorum_writes_fail_fast_and_definitely() {
    let mut c = Cluster::start(3, &[]).await;
    let eps = endpoints(&c);
    let client = c.client().await;
    client.create("/q", "before", CreateOptions::persistent()).await.unwrap();
    client.close().await.unwrap();
    for id in [1, 2] {
        c.pause(id, true);
    }
    let flags = ["--dial-timeout", "300ms", "--command-timeout", "30s"];
    let cases: [&[&str]; 5] = [
        &["set", "/q", "after"],
        &["create", "/q2", "x"],
        &["lock", "--nonblock", "job", "--", "true"],
        // A linearizable sessionless read too (it waited out the command
        // timeout on the first, paused member).
        &["get", "/q"],
        &["ls", "/"],
    ];
    for args in cases {
        let all: Vec<&str> = flags.iter().chain(args).copied().collect();
        let t = Instant::now();
        let o = baton(&eps, &all);
        let took = t.elapsed();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(5), "{args:?}: {err}");
        assert!(err.contains("no quorum: 1 of 3 voters answer and none sees a leader"), "{args:?}: {err}");
        assert!(took < SECS(15), "{args:?} took {took:?}: the quorum watch did not stop it");
    }
    for id in [1, 2] {
        c.pause(id, false);
    }
    // Nothing was applied.
    eventually(SECS(20), "the cluster serves again", || async {
        let o = baton(&eps, &["get", "/q"]);
        (o.status.code() == Some(0)).then(|| stdout(&o))
    })
    .await;
    assert_eq!(expect(baton(&eps, &["get", "/q"]), 0, "get"), "before\n");
    expect(baton(&eps, &["get", "/q2"]), 4, "the create was not applied");
}

/// Issue 28, U8: small edges. `--ttl 0`, and `--ttl` with `--ephemeral` or
/// `--container`, are usage errors (before any dial); a session timeout
/// the cluster clamped says so; durations are printed for people
/// (`300ms`, not `299.999999ms`); `snapshot save` names a path it cannot
/// write; `leader NAME` with no leader exits 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t52_ttl_usage_clamped_sessions_and_durations_for_people() {
    for args in [
        &["create", "/t", "x", "--ttl", "0"][..],
        &["create", "/t", "x", "--ttl", "5", "--ephemeral"],
        &["create", "/t", "x", "--ttl", "5", "--container"],
        &["create", "/t", "x", "--container", "--ephemeral"],
        // Malformed paths, found before any dial (cli.md's `baton get a`).
        &["get", "a"],
        &["ls", "/a//b"],
        &["txn", "set a 1"],
        &["watch", "/a/"],
    ] {
        expect(baton("127.0.0.1:1", args), 2, "a create-flags usage error");
    }
    let c = Cluster::start(1, &[]).await;
    let eps = endpoints(&c);
    let o = baton(&eps, &["lock", "--session-timeout", "1ms", "clamp", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("baton: --session-timeout 1ms was clamped to "), "{}", stderr(&o));
    let mut holder = spawn_baton(&eps, &["lock", "busy", "--", "sleep", "30"]);
    let client = c.client().await;
    eventually(SECS(10), "the holder holds", || async {
        (queue_len(&client, "/_baton/locks/busy").await == 1).then_some(())
    })
    .await;
    let o = baton(&eps, &["lock", "--timeout", "0.3s", "busy", "--", "true"]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    assert!(stderr(&o).contains("not acquired within 300ms"), "{}", stderr(&o));
    let _ = holder.kill();
    let _ = holder.wait();
    // A backup path that cannot be written is named (and found before the
    // cluster is asked).
    let o = baton(&eps, &["snapshot", "save", "/nonexistent-dir/b.backup"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("snapshot save: cannot write /nonexistent-dir/b.partial"), "{}", stderr(&o));
    // An election with no leader has an exit code of its own.
    let o = baton(&eps, &["leader", "nobody-campaigns"]);
    assert_eq!(o.status.code(), Some(6), "{}", stderr(&o));
    assert_eq!(stdout(&o), "(no leader)\n");
    assert!(stderr(&o).contains("election nobody-campaigns has no leader"), "{}", stderr(&o));
}

/// Issue 28, U8: an endpoint that is not a Baton client port (the HTTP
/// port, the peer port, the ZooKeeper port) is named as such, at once,
/// instead of a protocol error or a long wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t53_an_endpoint_that_is_not_a_client_port_says_so() {
    let c = Cluster::start_zk(1, &[]).await;
    c.wait_leader(SECS(20)).await;
    let cases = [
        ("HTTP", c.http_addr(1), "an HTTP port"),
        ("peer", c.peer_addr(1), "a Baton peer port"),
        ("ZooKeeper", c.zk_endpoints()[0].clone(), "a ZooKeeper port"),
    ];
    let mut wrong = Vec::new();
    for (what, ep, says) in cases {
        for args in [&["get", "/"][..], &["create", "/x"], &["status"]] {
            let started = Instant::now();
            let o = baton(&ep, args);
            let (err, took) = (stderr(&o), started.elapsed());
            eprintln!("{what} {args:?}: {:?} in {took:?}: {err}", o.status.code());
            if !(err.contains(says) && err.contains("not a Baton client port")) || took > SECS(8) {
                wrong.push(format!("{what} {args:?} ({took:?}): {err}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Issue 28, U8: `--json member list` carries what the text says, its
/// footer (cluster, term, leader, the member that answered) included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t54_member_list_json_and_text_say_the_same() {
    let c = Cluster::start(1, &[]).await;
    c.wait_leader(SECS(20)).await;
    let eps = endpoints(&c);
    // The first leader records the cluster id in an entry of its own: a
    // list taken before it applies says "cluster " and one after names it,
    // so both are taken once it has (a CI run compared one of each).
    eventually(SECS(10), "the cluster id recorded", || async {
        let json = expect(baton(&eps, &["--json", "member", "list"]), 0, "member list --json");
        json_lines(&json).iter().all(|r| r["cluster_id"].as_str().is_some_and(|id| !id.is_empty())).then_some(())
    })
    .await;
    let text = expect(baton(&eps, &["member", "list"]), 0, "member list");
    let footer = text.lines().last().expect("a footer");
    let json = expect(baton(&eps, &["--json", "member", "list"]), 0, "member list --json");
    let rows = json_lines(&json);
    assert_eq!(rows.len(), text.lines().count() - 2, "one object per member row:\n{text}\n{json}");
    for r in &rows {
        let said = format!(
            "cluster {} term {}, leader {} (*), answered by member {}",
            r["cluster_id"].as_str().expect("cluster_id"),
            r["term"].as_u64().expect("term"),
            r["leader_id"].as_u64().expect("leader_id"),
            r["answered_by"].as_u64().expect("answered_by")
        );
        assert_eq!(said, footer, "{json}");
        let id = r["id"].as_u64().expect("id");
        let row = text.lines().find(|l| l.split_whitespace().next() == Some(&id.to_string())).expect("a text row");
        for key in ["peer_addr", "client_addr"] {
            assert!(row.contains(r[key].as_str().expect(key)), "{key} of {id} in {row:?}");
        }
        assert_eq!(row.contains("auto-promote"), r["auto_promote"].as_bool() == Some(true), "{row}");
    }
}
