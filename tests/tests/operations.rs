//! Operating a cluster as docs/operations.md says: settings from a config
//! file, `BATON_*` variables and flags (in that order of strength), host
//! names instead of IP addresses, and a rolling restart under load.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_client::{Client, ClientConfig, CreateOptions, Error, Op};
use baton_tests::{baton_bin, batond_bin, distinct_ports, eventually, http_get, Cluster, Procs};

const SECS: fn(u64) -> Duration = Duration::from_secs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o20_config_file_environment_flags_and_host_names() {
    let dir = tempfile::Builder::new().prefix("baton-ops-").tempdir().expect("tempdir");
    let ports = distinct_ports(9);
    let (client, peer, http) = (&ports[0..3], &ports[3..6], &ports[6..9]);
    let peers = (0..3).map(|i| format!("{}=localhost:{}", i + 1, peer[i])).collect::<Vec<_>>().join(",");
    let mut procs = Procs(Vec::new());
    for i in 0..3 {
        let id = i + 1;
        // The file sets everything; two of its settings are wrong on
        // purpose and must lose: `tick-ms` to the command line, and
        // `http-addr` (a name that cannot resolve) to the environment.
        let file = dir.path().join(format!("member-{id}.toml"));
        let toml = format!(
            "id = {id}\n\
             data-dir = \"{}\"\n\
             client-addr = \"127.0.0.1:{}\"\n\
             advertise-client-addr = \"localhost:{}\"\n\
             peer-addr = \"127.0.0.1:{}\"\n\
             advertise-peer-addr = \"localhost:{}\"\n\
             peers = \"{peers}\"\n\
             tick-ms = 5000\n\
             http-addr = \"nowhere.invalid:1\"\n\
             superuser = [\"user:root\", \"x509:admin\"]\n\
             log-format = \"json\"\n",
            dir.path().join(format!("member-{id}")).display(),
            client[i],
            client[i],
            peer[i],
            peer[i],
        );
        std::fs::write(&file, toml).expect("config file");
        let log = std::fs::File::create(dir.path().join(format!("member-{id}.log"))).expect("log");
        let child = Command::new(batond_bin())
            .arg(format!("--config={}", file.display()))
            .arg("--tick-ms=50")
            .arg("--insecure-open-admin")
            .env("BATON_HTTP_ADDR", format!("127.0.0.1:{}", http[i]))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn batond");
        procs.0.push(child);
    }
    // Clients reach the members by name too.
    let endpoints: Vec<String> = client.iter().map(|p| format!("localhost:{p}")).collect();
    let c = eventually(SECS(20), "a session (a leader was elected with 50 ms ticks)", || async {
        Client::connect_with(ClientConfig::new(endpoints.clone()).op_timeout(SECS(2))).await.ok()
    })
    .await;
    c.create("/configured", Vec::new(), CreateOptions::persistent()).await.expect("write");
    // The environment's HTTP address won over the file's.
    for (i, p) in http.iter().enumerate() {
        let (_, text) = http_get(&format!("127.0.0.1:{p}"), "/health").await.expect("health on the env's address");
        assert!(text.contains(&format!("\"id\":{}", i + 1)), "member {}: {text}", i + 1);
    }
    // Each member recorded the names it advertises; the CLI finds them all
    // from one name.
    eventually(SECS(10), "every member's reported name", || async {
        let out = Command::new(baton_bin())
            .arg(format!("--endpoints={}", endpoints[0]))
            .args(["--json", "member", "list"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        client.iter().all(|p| text.contains(&format!("\"client_addr\":\"localhost:{p}\""))).then_some(())
    })
    .await;
    // The file's repeatable setting arrived whole: both superusers are in
    // force, so an anonymous membership change is refused.
    let out = Command::new(baton_bin())
        .arg(format!("--endpoints={}", endpoints[0]))
        .args(["member", "remove", "3"])
        .output()
        .expect("baton");
    assert!(String::from_utf8_lossy(&out.stderr).contains("superuser"), "{out:?}");
    // JSON logs, from the file.
    let log = std::fs::read_to_string(dir.path().join("member-1.log")).expect("log");
    assert!(log.lines().filter(|l| !l.trim().is_empty()).all(|l| l.starts_with('{')), "{log}");
    // A bad key is refused, naming the file and the key.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "id = 1\ndata-dri = \"/tmp/x\"\n").expect("bad file");
    let out = Command::new(batond_bin()).arg(format!("--config={}", bad.display())).output().expect("batond");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown setting `data-dri`"), "{out:?}");
}

/// Restarts every member in turn (SIGTERM, start again, wait until it has
/// caught up) while clients take a lock and write: grants keep flowing and
/// no acknowledged write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o30_rolling_restart_under_the_lock_workload() {
    let mut c = Cluster::start(3, &[]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let setup = c.client().await;
    setup.create("/rolling", Vec::new(), CreateOptions::persistent()).await.expect("parent");
    let mut tasks = Vec::new();
    for w in 0..3 {
        let cl = c.client_with(c.config().session_timeout(SECS(10))).await;
        let (stop, grants, acked) = (stop.clone(), grants.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let g = match tokio::time::timeout(SECS(10), cl.lock("rolling")).await {
                    Ok(Ok(g)) => g,
                    Ok(Err(Error::SessionExpired)) => panic!("worker {w}: session expired in a rolling restart"),
                    _ => continue,
                };
                n += 1;
                let path = format!("/rolling/w{w}-{n}");
                let op =
                    Op::Create { path: path.clone(), data: Default::default(), options: CreateOptions::persistent() };
                let fenced = g.fenced("rolling", &[op]).await;
                if fenced.is_ok() {
                    acked.lock().unwrap().push(path);
                    grants.fetch_add(1, Ordering::Relaxed);
                }
                let _ = g.release().await;
            }
        }));
    }
    let grants_now = || grants.load(Ordering::Relaxed);
    eventually(SECS(10), "first grants", || async { (grants_now() >= 3).then_some(()) }).await;
    for id in 1..=3 {
        c.stop(id);
        c.start_member(id);
        let before = grants_now();
        eventually(SECS(30), "grants after restarting a member", || async {
            (grants_now() >= before + 3).then_some(())
        })
        .await;
        let leader = c.wait_leader(SECS(10)).await;
        let commit = c.status(leader).await.map(|s| s.commit_index).unwrap_or(0);
        c.wait_applied(id, commit, SECS(30)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(SECS(30), t).await.expect("worker stops").expect("worker did not panic");
    }
    let have: BTreeSet<String> =
        setup.children("/rolling").await.expect("children").into_iter().map(|n| format!("/rolling/{n}")).collect();
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 9, "only {} grants", acked.len());
    for a in &acked {
        assert!(have.contains(a), "acknowledged {a} lost in the rolling restart");
    }
}

/// A clean stop answers what it accepted (shutdown.rs): a write that cannot
/// commit (the other members are paused) gets TIMEOUT, "may have
/// happened", on its connection before the member exits; it is never left
/// unanswered by a closed connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o40_sigterm_answers_pending_writes_before_exiting() {
    use baton_proto::{request, CreateOp, ErrorCode, Request};
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.wait_leader(SECS(10)).await;
    let mut raw = baton_tests::raw::RawConn::connect(&c.endpoint(leader)).await;
    raw.create_session(1, 10_000).await;
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    for id in &others {
        c.pause(*id, true);
    }
    let create = CreateOp { path: "/pending".into(), ..Default::default() };
    raw.send(Request { id: 2, seq: 1, body: Some(request::Body::Create(create)), ..Default::default() }).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = std::time::Instant::now();
    c.stop(leader);
    let stopped_in = t.elapsed();
    for id in &others {
        c.pause(*id, false);
    }
    let r = raw.recv().await.expect("the pending write was left unanswered");
    assert_eq!((r.id, r.error), (2, ErrorCode::Timeout as i32), "{r:?}");
    assert!(stopped_in < SECS(5), "a clean stop took {stopped_in:?}");
}

/// Issue 28, U9: `batond`'s start-up errors as an operator meets them:
/// every missing flag in one message, printed once; a bad value from the
/// config file names the file; a port in use leaves no data dir behind;
/// a clean SIGTERM with nothing pending does not warn about writes.
#[test]
fn o25_start_up_errors_are_whole_single_and_leave_nothing_behind() {
    let dir = tempfile::Builder::new().prefix("baton-ops-").tempdir().expect("tempdir");
    let run = |args: &[&str]| Command::new(batond_bin()).args(args).output().expect("batond");
    let err = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).to_string();

    let o = run(&[]);
    assert_eq!(o.status.code(), Some(1));
    let e = err(&o);
    assert!(
        e.contains(
            "missing --id, --data-dir, --client-addr, --peer-addr, --peers (a new cluster) or --join (a running one)"
        ),
        "{e}"
    );
    assert_eq!(e.matches("missing").count(), 1, "printed once: {e}");

    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "id = 1\ntick-ms = \"fast\"\n").expect("file");
    let o = run(&[&format!("--config={}", file.display())]);
    assert_eq!(o.status.code(), Some(2), "a bad value is a usage error");
    let e = err(&o);
    assert!(e.contains(&format!("the value of `tick-ms` comes from the config file {}", file.display())), "{e}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let in_use = taken.local_addr().expect("addr").to_string();
    let ports = distinct_ports(1);
    let peer = format!("127.0.0.1:{}", ports[0]);
    let data = dir.path().join("new-member");
    let o = run(&[
        "--id=1",
        &format!("--data-dir={}", data.display()),
        &format!("--client-addr={in_use}"),
        &format!("--peer-addr={peer}"),
        &format!("--peers=1={peer}"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = err(&o);
    assert_eq!(e.matches(&format!("binding client address {in_use}")).count(), 1, "named once: {e}");
    assert!(!data.exists(), "a failed start left {} behind", data.display());

    // A member that served and had nothing pending stops without the warning.
    let ports = distinct_ports(2);
    let (client, peer) = (format!("127.0.0.1:{}", ports[0]), format!("127.0.0.1:{}", ports[1]));
    let log = dir.path().join("member.log");
    let mut child = Command::new(batond_bin())
        .args(["--id=1", &format!("--data-dir={}", dir.path().join("m").display())])
        .args([format!("--client-addr={client}"), format!("--peer-addr={peer}"), format!("--peers=1={peer}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("batond");
    let deadline = std::time::Instant::now() + SECS(30);
    while std::net::TcpStream::connect(&client).is_err() {
        assert!(std::time::Instant::now() < deadline, "the member did not serve");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let deadline = std::time::Instant::now() + SECS(15);
    let code = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break st.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("no exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0));
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("no write was pending"), "{text}");
    assert!(!text.contains("may or may not happen"), "{text}");
}
