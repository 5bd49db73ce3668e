//! `member::start` (member.rs) as a library: three members assembled in
//! this process exactly as `batond` assembles one (real RocksDB, real TCP
//! on loopback, raft-rs), a client takes a lock and writes through them,
//! and every member stops in order when asked.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use baton_client::{Client, CreateOptions};
use baton_server::config::Config;
use baton_server::member::{self, Member, Options};
use baton_server::zk::ZkSettings;

fn options(id: u64, dir: &std::path::Path, ports: &[u16]) -> Options {
    let mut cfg = Config::defaults(id);
    let at = |p: u16| format!("127.0.0.1:{p}");
    cfg.data_dir = dir.join(format!("member-{id}"));
    cfg.client_addr = at(ports[(id as usize - 1) * 3]);
    cfg.peer_addr = at(ports[(id as usize - 1) * 3 + 1]);
    cfg.advertise_client_addr = cfg.client_addr.clone();
    cfg.advertise_peer_addr = cfg.peer_addr.clone();
    cfg.peers = (1..=3u64).map(|m| (m, at(ports[(m as usize - 1) * 3 + 1]))).collect();
    cfg.tick_ms = 20;
    cfg.open_admin = true;
    cfg.validate().expect("a valid config");
    let zk_addr = Some(at(ports[(id as usize - 1) * 3 + 2]));
    Options {
        cfg,
        http_addr: None,
        zk_addr,
        zk: ZkSettings::default(),
        client_tls: None,
        peer_tls: None,
        io_threads: 1,
    }
}

/// Runs a started member's loop on a thread of its own; its result comes
/// back on the channel.
fn run(m: Member) -> mpsc::Receiver<anyhow::Result<()>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(m.run());
    });
    rx
}

#[test]
fn three_members_started_in_process_serve_a_lock_and_stop_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = baton_kit::ports::distinct_ports(12);
    let mut stoppers = Vec::new();
    let mut done = Vec::new();
    let mut endpoints = Vec::new();
    for id in 1..=3 {
        let m = member::start(options(id, dir.path(), &ports)).expect("start");
        // Every port is bound when start returns.
        let a = m.addrs().clone();
        assert_eq!(a.client.port(), ports[(id as usize - 1) * 3]);
        assert!(a.zk.is_some() && a.http.is_none(), "{a:?}");
        std::net::TcpStream::connect(a.client).expect("the client port accepts before run");
        endpoints.push(a.client.to_string());
        stoppers.push(m.stopper());
        done.push(run(m));
    }

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let c = tokio::time::timeout(Duration::from_secs(30), Client::connect(endpoints.clone()))
            .await
            .expect("connect in time")
            .expect("connect");
        let guard =
            tokio::time::timeout(Duration::from_secs(30), c.lock("jobs")).await.expect("in time").expect("lock");
        assert!(guard.fencing_token() > 0);
        c.create("/assembled", "yes", CreateOptions::persistent()).await.expect("create");
        let (data, _) = c.get("/assembled").await.expect("get");
        assert_eq!(&data[..], b"yes");
        guard.release().await.expect("release");
        let _ = c.close().await;
    });

    // A port already taken is an error from start, before any task runs.
    let mut taken = options(4, dir.path(), &ports);
    taken.cfg.client_addr = endpoints[0].clone();
    let err = member::start(taken).err().expect("a bound port is refused");
    assert!(format!("{err:#}").contains("binding client address"), "{err:#}");

    for s in &stoppers {
        s.stop();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for (i, rx) in done.into_iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = rx.recv_timeout(left).unwrap_or_else(|_| panic!("member {} did not stop in time", i + 1));
        r.unwrap_or_else(|e| panic!("member {} stopped with {e:#}", i + 1));
    }
    // Stopped means closed: the client ports refuse connections.
    for e in &endpoints {
        assert!(std::net::TcpStream::connect(e).is_err(), "{e} still accepts");
    }
}

/// `batond cluster` passes the member flags it was given to every member
/// as given (each flag is written once, in main.rs's `Timing`), and adds
/// `--insecure-open-admin` only when no admin flag was given.
#[test]
fn batond_cluster_passes_its_member_flags_on_as_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_base();
    let cases: [(&[&str], &[&str], &[&str]); 2] = [
        (
            &["--tick-ms", "20", "--max-watches=7", "--superuser", "user:a,user:b"],
            &["--tick-ms=20", "--max-watches=7", "--superuser=user:a", "--superuser=user:b"],
            &["--insecure-open-admin", "--election-ticks"],
        ),
        (&["--insecure-open-admin"], &["--insecure-open-admin=true"], &["--tick-ms", "--superuser"]),
    ];
    for (i, (given, want, absent)) in cases.iter().enumerate() {
        let data = dir.path().join(format!("c{i}"));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_batond"));
        cmd.args(["cluster", "--nodes", "1", "--base-port", &base.to_string(), "--data-dir"]).arg(&data);
        cmd.args(given.iter()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().expect("batond cluster");
        let out = child.stdout.take().expect("stdout");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(out));
        let pid = lines
            .by_ref()
            .take(10)
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("member 1: pid ").and_then(|r| r.split(' ').next()?.parse::<u32>().ok()));
        // Right after its exec a process's command line can read empty
        // (the parent is released before the new image's arguments are
        // set up): read it until it is there, for up to 5 s.
        let read_cmdline = || pid.and_then(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok()).unwrap_or_default();
        let until = Instant::now() + Duration::from_secs(5);
        let mut cmdline = read_cmdline();
        while cmdline.is_empty() && Instant::now() < until {
            thread::sleep(Duration::from_millis(20));
            cmdline = read_cmdline();
        }
        // SIGTERM: batond cluster stops its members and exits.
        let _ = std::process::Command::new("kill").arg(child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        // The member too, if it outlived its cluster (seen once, 2026-12-07:
        // a SIGTERM before the cluster's handlers were in place; the test
        // below).
        if let Some(p) = pid {
            let _ = std::process::Command::new("kill").args(["-9", &p.to_string()]).status();
        }
        let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let log = std::fs::read_to_string(data.join("member-1.log")).unwrap_or_default();
        assert!(pid.is_some(), "no member pid printed (case {i})");
        assert!(args.len() > 1, "no member command line (case {i}); its log:\n{log}");
        for w in *want {
            assert!(args.iter().any(|a| a == w), "{w} not passed on in case {i}: {args:?}");
        }
        for a in *absent {
            assert!(!args.iter().any(|x| x.starts_with(a)), "{a} passed on in case {i}: {args:?}");
        }
    }
}

/// A `batond cluster` SIGTERMed while its members start stops them and
/// exits: before 2026-12-07 its signal handlers were installed only after
/// the banner, so a SIGTERM that came earlier killed it at once and left
/// its members running, orphaned (a member of the test above outlived its
/// cluster that way).
#[test]
fn batond_cluster_terminated_while_starting_leaves_no_member_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_base();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_batond"))
        .args(["cluster", "--nodes", "1", "--base-port", &base.to_string(), "--data-dir"])
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("batond cluster");
    // Its member, as soon as it is spawned (before it serves).
    let until = Instant::now() + Duration::from_secs(10);
    let mut member = None;
    while member.is_none() && Instant::now() < until {
        member = children_of(child.id()).into_iter().next();
        thread::sleep(Duration::from_millis(2));
    }
    let _ = std::process::Command::new("kill").arg(child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut exited = None;
    while exited.is_none() && Instant::now() < deadline {
        exited = child.try_wait().ok().flatten();
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    // A member left behind is re-parented and keeps running: give it a
    // moment to be gone, then kill it whatever the outcome.
    let gone = |p: u32| !std::path::Path::new(&format!("/proc/{p}")).exists() || is_zombie(p);
    let until = Instant::now() + Duration::from_secs(2);
    while member.is_some_and(|p| !gone(p)) && Instant::now() < until {
        thread::sleep(Duration::from_millis(20));
    }
    let survived = member.filter(|p| !gone(*p));
    if let Some(p) = member {
        let _ = std::process::Command::new("kill").args(["-9", &p.to_string()]).status();
    }
    let member = member.expect("batond cluster spawned no member within 10 s");
    let exited = exited.expect("batond cluster did not exit within 45 s of SIGTERM");
    assert!(survived.is_none(), "member {member} outlived its cluster (which exited {exited})");
    assert_eq!(exited.code(), Some(0), "a SIGTERMed cluster exits 0 after stopping its members: {exited}");
}

/// The pids whose parent is `pid` (from /proc/*/stat).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| stat_field(*p, 1).and_then(|f| f.parse::<u32>().ok()) == Some(pid))
        .collect()
}

/// Field `n` (0: the state) after the command name of /proc/PID/stat.
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(')')?.1.split_whitespace().nth(n)?.to_string())
}

fn is_zombie(pid: u32) -> bool {
    stat_field(pid, 0).as_deref() == Some("Z")
}

/// A base port whose client, peer and HTTP offsets (member 1) are free.
fn free_base() -> u16 {
    (0..200)
        .map(|_| baton_kit::free_port().saturating_sub(400))
        .find(|b| [1u16, 101, 201].iter().all(|o| std::net::TcpListener::bind(("127.0.0.1", b + o)).is_ok()))
        .expect("a free base port")
}

/// A `batond cluster --nodes 1` process: its stdout lines on a channel;
/// SIGTERM, then SIGKILL, when dropped.
struct LocalCluster {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl LocalCluster {
    fn start(data: &std::path::Path, base: u16) -> LocalCluster {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_batond"))
            .args(["cluster", "--nodes", "1", "--base-port", &base.to_string(), "--tick-ms", "20", "--data-dir"])
            .arg(data)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("batond cluster");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (err, into) = (child.stderr.take().expect("stderr"), stderr.clone());
        thread::spawn(move || {
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                into.lock().unwrap_or_else(|e| e.into_inner()).push_str(&(l + "\n"));
            }
        });
        LocalCluster { child, lines, stderr }
    }

    /// The first stdout line (within `bound`) that `f` accepts.
    fn line(&self, bound: Duration, f: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + bound;
        while let Ok(l) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if f(&l) {
                return Some(l);
            }
        }
        None
    }

    /// Its exit code, waiting up to `bound`.
    fn exit_code(&mut self, bound: Duration) -> Option<i32> {
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st.code().unwrap_or(-1));
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn terminate(&mut self) -> Option<i32> {
        let _ = std::process::Command::new("kill").arg(self.child.id().to_string()).status();
        self.exit_code(Duration::from_secs(15))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if self.terminate().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The pid in a `member N: pid P ...` line.
fn member_pid(line: &str) -> Option<u32> {
    line.split_once(": pid ")?.1.split(' ').next()?.parse().ok()
}

/// Issue 28, U5: started on ports or a data dir another cluster holds,
/// `batond cluster` says so and exits non-zero instead of printing its
/// banner over dead members.
#[test]
fn batond_cluster_fails_to_start_on_ports_or_a_data_dir_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_base();
    let mut first = LocalCluster::start(&dir.path().join("a"), base);
    let banner = first.line(Duration::from_secs(40), |l| l.starts_with("endpoints:"));
    assert!(banner.is_some(), "the first cluster did not start: {}", first.stderr());

    let mut same_ports = LocalCluster::start(&dir.path().join("b"), base);
    assert_eq!(same_ports.exit_code(Duration::from_secs(20)), Some(1), "same ports: must fail");
    let err = same_ports.stderr();
    assert!(err.contains(&format!("member 1's client port 127.0.0.1:{} is in use", base + 1)), "{err}");
    assert!(same_ports.line(Duration::from_millis(100), |l| l.starts_with("endpoints:")).is_none());

    let mut same_dir = LocalCluster::start(&dir.path().join("a"), free_base());
    assert_eq!(same_dir.exit_code(Duration::from_secs(40)), Some(1), "same data dir: must fail");
    let err = same_dir.stderr();
    assert!(err.contains("member 1 exited while starting (exit code 1)"), "{err}");
    assert!(err.contains("lock"), "the member's own error (RocksDB's lock) is shown: {err}");

    // The first cluster was left alone.
    assert_eq!(first.exit_code(Duration::from_millis(200)), None, "the first cluster still runs");
    assert!(std::net::TcpStream::connect(("127.0.0.1", base + 1)).is_ok());
    assert_eq!(first.terminate(), Some(0));
}

/// Issue 28, U5: a member killed -9 is reported and started again on its
/// data dir and ports, and serves.
#[test]
fn batond_cluster_restarts_a_member_killed_minus_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_base();
    let mut c = LocalCluster::start(dir.path(), base);
    let first = c.line(Duration::from_secs(40), |l| l.starts_with("member 1: pid ")).and_then(|l| member_pid(&l));
    let pid = first.unwrap_or_else(|| panic!("no member line: {}", c.stderr()));
    let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    let said = c.line(Duration::from_secs(20), |l| l.starts_with("member 1 exited"));
    assert_eq!(said.as_deref(), Some("member 1 exited (killed by a signal); started again:"));
    let again = c.line(Duration::from_secs(5), |l| l.starts_with("member 1: pid ")).and_then(|l| member_pid(&l));
    let again = again.expect("the new member line");
    assert_ne!(again, pid);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", base + 1)).is_err() {
        assert!(Instant::now() < deadline, "the restarted member does not serve");
        thread::sleep(Duration::from_millis(100));
    }
    assert!(std::path::Path::new(&format!("/proc/{again}")).exists());
    assert_eq!(c.terminate(), Some(0), "a SIGTERM stops the cluster cleanly: {}", c.stderr());
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{again}/stat")).is_ok_and(|s| !s.contains(") Z")) {
        assert!(Instant::now() < deadline, "the restarted member outlived its cluster");
        thread::sleep(Duration::from_millis(50));
    }
}
