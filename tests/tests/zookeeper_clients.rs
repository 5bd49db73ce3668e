//! The ZooKeeper port with the two most used client libraries nobody here
//! wrote, each running its own recipes through a leader kill -9:
//!
//! t50: kazoo (Python, from PyPI into the virtualenv `make zk-clients-deps`
//! makes): tests/zk/kazoo_recipes.py runs Lock (4 sessions, a fenced
//! counter), DataWatch and ChildrenWatch, then Election, Barrier, Counter,
//! Queue and Party after the kill.
//! t60: Curator 5 (Debian's, on the 3.8 Java client): tests/zk/CuratorRecipes.java,
//! compiled here, as 4 InterProcessMutex worker processes with a fenced
//! counter and one process with LeaderLatch (3 candidates) and CuratorCache,
//! then a transaction (multi) and a TTL node after the kill.
//!
//! t70: kazoo 2.11's own test suite, unmodified (tests/zk/kazoo_suite.py
//! points kazoo's harness at the members instead of a Java ZooKeeper):
//! its lock, election, barrier, counter, queue, party, watchers, cache,
//! lease and partitioner tests, 121 in all, every one passing.
//!
//! t80: the recipes that interoperate (docs/zookeeper.md): one lock at
//! /interop/lock taken by 2 Curator InterProcessMutex processes and 2
//! kazoo processes on the ZooKeeper port and 2 baton-client tasks on the
//! native port, each incrementing one fenced counter (its lock node's
//! czxid the token); a Curator LeaderLatch queued behind a Baton
//! election candidate at the same path, leading once it resigns; and a
//! Curator LeaderSelector queued behind a Baton `LeaderSelector::start_at`
//! at the same path, leading once the Baton term ends; a Curator
//! InterProcessReadWriteLock beside `client.rw_lock_at` at one path; and a
//! Curator InterProcessSemaphoreV2 sharing its permits with
//! `client.semaphore_at`.
//!
//! t50 and t60: this side waits until the lock holders' counter (read through
//! Baton's own port) reaches a third of the way, kills the leader with
//! SIGKILL, then creates a flag file that tells the clients it happened.
//! The clients assert their recipes' outcomes themselves (mutual
//! exclusion, no lost update, watchers that see changes made after the
//! kill) and exit non-zero with a "FAIL:" line; this side asserts their
//! exit codes and that the counter ends at the sum of the increments each
//! holder reports.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_tests::{Cluster, Procs};

/// Where `make zk-clients-deps` makes kazoo's virtualenv (override:
/// `BATON_KAZOO_VENV`).
const KAZOO_VENV: &str = "/var/cache/baton-kazoo-venv";
/// Curator's jar (its manifest's Class-Path names guava, slf4j-api and
/// ZooKeeper's jars) and a logging binding for slf4j.
const CURATOR_JAR: &str = "/usr/share/java/curator-recipes.jar";
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";
/// The counter value at which the leader is killed.
const KILL_AT: u64 = 12;

fn need(path: &Path, what: &str) {
    assert!(
        path.exists(),
        "{} is missing ({what}): run `make zk-clients-deps` (make test runs it first)",
        path.display()
    );
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A client process's stdout, collected by a thread (and echoed to stderr
/// for a failing test's log).
struct Output(Arc<Mutex<Vec<String>>>);

impl Output {
    fn capture(child: &mut Child, tag: &'static str) -> Output {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("piped stdout");
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("[{tag}] {line}");
                l.lock().expect("lines").push(line);
            }
        });
        Output(lines)
    }

    fn text(&self) -> String {
        self.0.lock().expect("lines").join("\n")
    }

    /// Until a line holds `line` (at most 40 s); a "FAIL" line from `who`
    /// fails the test at once.
    async fn wait_for(&self, line: &str, who: &str) {
        let until = Instant::now() + Duration::from_secs(40);
        while !self.text().contains(line) {
            assert!(!self.text().contains("FAIL"), "{}", self.text());
            assert!(Instant::now() < until, "no {line:?} from {who} in 40 s:\n{}", self.text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The first number of the counter node's data ("value owner n"), read
/// through Baton's own port; None while it does not exist.
async fn counter(c: &Cluster, path: &str) -> Option<u64> {
    let client = tokio::time::timeout(Duration::from_secs(10), c.client()).await.ok()?;
    let got = tokio::time::timeout(Duration::from_secs(5), client.get(path)).await.ok().and_then(Result::ok);
    let _ = client.close().await;
    let (data, _) = got?;
    String::from_utf8_lossy(&data).split(' ').next()?.parse().ok()
}

/// Waits until `path`'s counter reaches [`KILL_AT`] and every `ready`
/// output has printed its line (bounded; fails early if a client process
/// exits first), kills `leader` with SIGKILL and creates `flag`. A client
/// that must see the kill (its watches and listeners set first) names its
/// ready line: without it the kill could come before them.
async fn kill_leader_midway(
    c: &mut Cluster,
    procs: &mut Procs,
    path: &str,
    leader: u64,
    flag: &Path,
    out: &[&Output],
    ready: &[(&Output, &str)],
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if ready.iter().all(|(o, line)| o.text().contains(line)) && counter(c, path).await.is_some_and(|v| v >= KILL_AT)
        {
            break;
        }
        for p in &mut procs.0 {
            if let Ok(Some(st)) = p.try_wait() {
                let text: Vec<String> = out.iter().map(|o| o.text()).collect();
                panic!("a client exited ({st}) before the kill:\n{}", text.join("\n---\n"));
            }
        }
        assert!(
            Instant::now() < deadline,
            "the counter {path} never reached {KILL_AT} (or a client was not ready) within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.kill(leader);
    std::fs::write(flag, b"killed").expect("flag file");
    eprintln!("killed leader {leader} (kill -9) at counter >= {KILL_AT}");
}

/// Waits (bounded) for every process to exit; their exit codes.
fn wait_all(procs: &mut Procs, limit: Duration) -> Vec<Option<i32>> {
    let deadline = Instant::now() + limit;
    let mut codes = vec![None; procs.0.len()];
    let mut done = vec![false; procs.0.len()];
    while done.iter().any(|d| !d) && Instant::now() < deadline {
        for (i, p) in procs.0.iter_mut().enumerate() {
            if !done[i] {
                if let Ok(Some(st)) = p.try_wait() {
                    codes[i] = st.code();
                    done[i] = true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    codes
}

/// A class of tests/zk compiled against Curator, to run as processes.
struct Java {
    classes: tempfile::TempDir,
    class: &'static str,
}

impl Java {
    fn compile(class: &'static str) -> Java {
        need(Path::new(CURATOR_JAR), "Debian's libcurator-recipes-java");
        need(Path::new("/usr/bin/javac"), "default-jdk-headless");
        need(Path::new(SLF4J_SIMPLE), "Debian's libslf4j-java");
        let classes = tempfile::Builder::new().prefix("baton-curator-").tempdir().expect("tempdir");
        let javac = Command::new("/usr/bin/javac")
            .arg("-d")
            .arg(classes.path())
            .args(["-cp", CURATOR_JAR])
            .arg(repo_file(&format!("zk/{class}.java")))
            .output()
            .expect("javac runs");
        assert!(javac.status.success(), "javac failed:\n{}", String::from_utf8_lossy(&javac.stderr));
        Java { classes, class }
    }

    /// `java CLASS args...`, its stdout piped.
    fn spawn(&self, args: Vec<String>) -> Child {
        let cp = format!("{}:{CURATOR_JAR}:{SLF4J_SIMPLE}", self.classes.path().display());
        Command::new("java")
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"])
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .args(["-cp", &cp, self.class])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("java runs")
    }
}

/// The virtualenv's python, once `imports` import in it.
fn kazoo_python(imports: &str) -> PathBuf {
    let venv = PathBuf::from(std::env::var("BATON_KAZOO_VENV").unwrap_or_else(|_| KAZOO_VENV.into()));
    let python = venv.join("bin/python");
    need(&python, "kazoo's virtualenv");
    let check = Command::new(&python).args(["-c", &format!("import {imports}")]).output().expect("python runs");
    assert!(
        check.status.success(),
        "{imports} do not import in {}: run `make zk-clients-deps` (make test runs it first)\n{}",
        venv.display(),
        String::from_utf8_lossy(&check.stderr)
    );
    python
}

/// kazoo's own tests (kazoo/tests of the pinned kazoo 2.11.0) in this
/// many test functions; all must pass.
const KAZOO_SUITE_TESTS: usize = 121;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_kazoos_own_test_suite_passes() {
    let python = kazoo_python("kazoo, pytest, pytest_timeout, objgraph, jks, OpenSSL");
    // kazoo's tests ask the server's version with the `envi` word, which
    // ZooKeeper's own test clusters allow too.
    let c = Cluster::start_zk(3, &["--zk-4lw-whitelist=*"]).await;
    let eps = c.zk_endpoints().join(",");
    let child = Command::new(&python)
        .arg(repo_file("zk/kazoo_suite.py"))
        .arg(&eps)
        .current_dir(c.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python runs kazoo's suite");
    let mut procs = Procs(vec![child]);
    let out = Output::capture(&mut procs.0[0], "kazoo-suite");
    let codes = tokio::task::block_in_place(|| wait_all(&mut procs, Duration::from_secs(600)));
    let text = out.text();
    let summary = text.lines().rev().find(|l| l.contains(" passed") || l.contains(" failed")).unwrap_or_default();
    eprintln!("t70: {summary}");
    assert_eq!(codes, vec![Some(0)], "kazoo's suite failed (or hung past 600 s): {summary}");
    // pytest's closing line: "121 passed, 119 warnings in 69.0s".
    let words: Vec<&str> = summary.split_whitespace().collect();
    let passed: usize =
        words.windows(2).find(|w| w[1].trim_end_matches(',') == "passed").and_then(|w| w[0].parse().ok()).unwrap_or(0);
    assert_eq!(passed, KAZOO_SUITE_TESTS, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_kazoo_recipes_through_a_leader_kill() {
    let python = kazoo_python("kazoo");
    let script = repo_file("zk/kazoo_recipes.py");
    let mut c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let flag = c.dir.path().join("killed");
    let started = Instant::now();
    let child = Command::new(&python)
        .arg(&script)
        .args(["--hosts", &eps.join(","), "--leader", &eps[leader as usize - 1]])
        .arg("--killed-flag")
        .arg(&flag)
        .args(["--deadline", "75"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python runs the kazoo script");
    let mut procs = Procs(vec![child]);
    let out = Output::capture(&mut procs.0[0], "kazoo");
    kill_leader_midway(&mut c, &mut procs, "/kazoo/fenced", leader, &flag, &[&out], &[]).await;
    let codes = tokio::task::block_in_place(|| wait_all(&mut procs, Duration::from_secs(100)));
    let text = out.text();
    assert_eq!(codes, vec![Some(0)], "the kazoo script failed (or hung past 100 s):\n{text}");
    assert!(text.contains("ALL OK"), "{text}");
    for phase in
        ["watchers: after the kill", "election: 3 candidates", "barrier:", "counter: 30", "queue: 10 items", "party:"]
    {
        assert!(text.contains(phase), "no {phase:?} line:\n{text}");
    }
    // The counter ends at the sum the contenders report, past the kill.
    let total: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("lock: 4 contenders, "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no lock line:\n{text}"));
    assert!(total > KILL_AT, "increments after the kill: {total}");
    assert_eq!(counter(&c, "/kazoo/fenced").await, Some(total), "the fenced counter read through Baton's port");
    eprintln!("t50: kazoo run took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_curator_recipes_through_a_leader_kill() {
    let java = Java::compile("CuratorRecipes");

    let mut c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints();
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let flag = c.dir.path().join("killed");
    let started = Instant::now();
    let java = |args: Vec<String>| java.spawn(args);
    let flag_s = flag.display().to_string();
    let connect = eps.join(",");
    let mut procs = Procs(Vec::new());
    let mut outs = Vec::new();
    for i in 0..4 {
        let mut p = java(vec!["mutex".into(), connect.clone(), format!("w{i}"), flag_s.clone(), "80".into()]);
        outs.push(Output::capture(&mut p, "curator-mutex"));
        procs.0.push(p);
    }
    let mut p =
        java(vec!["main".into(), connect.clone(), eps[leader as usize - 1].clone(), flag_s.clone(), "80".into()]);
    outs.push(Output::capture(&mut p, "curator-main"));
    procs.0.push(p);
    let refs: Vec<&Output> = outs.iter().collect();
    // The cache's client listens for its connection states from this line
    // on: the kill must come after it.
    let ready = [(&outs[4], "latch+cache: ready before the kill")];
    kill_leader_midway(&mut c, &mut procs, "/curator/fenced", leader, &flag, &refs, &ready).await;
    let codes = tokio::task::block_in_place(|| wait_all(&mut procs, Duration::from_secs(100)));
    let texts: Vec<String> = outs.iter().map(Output::text).collect();
    assert_eq!(codes, vec![Some(0); 5], "a Curator process failed (or hung past 100 s):\n{}", texts.join("\n---\n"));
    let main = &texts[4];
    for line in [
        "latch+cache: ready before the kill",
        "cache: ",
        "watches: one-shot",
        "latch: 3 candidates led in turn",
        "multi: [CREATE /curator/tx/a, SET_DATA /curator/tx, CHECK /curator/tx, DELETE /curator/tx/a]",
        "ttl: a 500 ms TTL node was deleted",
        "MAIN OK",
    ] {
        assert!(main.contains(line), "no {line:?} line:\n{main}");
    }
    // Each worker's increments, summed: what the counter holds.
    let total: u64 = texts[..4]
        .iter()
        .map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("DONE "))
                .and_then(|l| l.split(' ').nth(1))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("a worker printed no DONE line:\n{t}"))
        })
        .sum();
    assert!(total >= KILL_AT + 4 * 3, "each worker made 3 increments after the kill: {total}");
    assert_eq!(counter(&c, "/curator/fenced").await, Some(total), "the fenced counter read through Baton's port");
    eprintln!("t60: Curator run took {:?}", started.elapsed());
}

const INTEROP_COUNTER: &str = "/interop/counter";

/// One baton-client holder of the shared lock: the same increments as
/// CuratorInterop.java's and kazoo_interop.py's, on the native port.
async fn native_holder(c: baton_client::Client, who: String, flag: PathBuf) -> Result<u64, String> {
    let m = c.mutex("/interop/lock").map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut made = 0u64;
    while !flag.exists() {
        if Instant::now() > deadline {
            return Err(format!("{who}: no flag before the deadline ({made} made)"));
        }
        let g = tokio::time::timeout(Duration::from_secs(30), m.lock())
            .await
            .map_err(|_| format!("{who}: the lock was not acquired in 30 s"))?
            .map_err(|e| format!("{who}: lock: {e}"))?;
        let token = g.fencing_token();
        let (data, stat) = c.get(INTEROP_COUNTER).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&data).to_string();
        let f: Vec<&str> = text.split(' ').collect();
        let (value, last): (u64, u64) =
            (f[0].parse().map_err(|_| text.clone())?, f[1].parse().map_err(|_| text.clone())?);
        if last >= token {
            return Err(format!("{who}: fence: the counter's token {last} ({}) is not below ours {token}", f[2]));
        }
        let next = format!("{} {token} {who}", value + 1);
        match c.set(INTEROP_COUNTER, next, Some(stat.version)).await {
            Ok(_) => made += 1,
            Err(e) if e.kind() == baton_client::ErrorKind::BadVersion => {
                return Err(format!("{who}: lost update: the counter changed under our lock"));
            }
            Err(e) => return Err(format!("{who}: set: {e}")),
        }
        let tally = format!("/interop/tally/{who}");
        let opts = baton_client::CreateOptions::persistent().with_parents();
        if let Err(e) = c.create(&tally, made.to_string(), opts).await {
            if !e.is_node_exists() {
                return Err(format!("{who}: tally: {e}"));
            }
            c.set(&tally, made.to_string(), None).await.map_err(|e| e.to_string())?;
        }
        g.release().await.map_err(|e| e.to_string())?;
    }
    Ok(made)
}

/// Issue 28, U3: one lock across three libraries and two ports, and a
/// Curator LeaderLatch in a Baton election (see the module doc, t80).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t80_curator_kazoo_and_baton_client_share_one_lock_and_one_election() {
    let java = Java::compile("CuratorInterop");
    let python = kazoo_python("kazoo");
    let c = Cluster::start_zk(3, &[]).await;
    let eps = c.zk_endpoints().join(",");
    c.wait_leader(Duration::from_secs(20)).await;
    let native = c.client().await;
    let started = Instant::now();

    // The election: a Baton candidate leads; a Curator latch queues behind
    // it, leads once it resigns, and Baton reads it as the leader.
    let election = native.election("/interop/election").expect("election");
    let lead = election.campaign("baton").await.expect("campaign");
    let latch_flag = c.dir.path().join("latch-done");
    let mut procs = Procs(vec![java.spawn(vec![
        "latch".into(),
        eps.clone(),
        "curator-latch".into(),
        latch_flag.display().to_string(),
        "60".into(),
    ])]);
    let latch = Output::capture(&mut procs.0[0], "curator-latch");
    latch.wait_for("LATCH not leader", "the latch").await;
    let now = election.leader().await.expect("leader").expect("a leader");
    assert_eq!((now.value.as_slice(), now.fencing_token), (&b"baton"[..], lead.fencing_token()));
    let latch_node = native.children("/interop/election").await.expect("candidates");
    assert_eq!(latch_node.len(), 2, "the latch queued in the same election: {latch_node:?}");
    lead.resign().await.expect("resign");
    latch.wait_for("LATCH leader", "the latch").await;
    let now = election.leader().await.expect("leader").expect("a leader");
    assert_eq!(now.value, b"curator-latch", "Baton reads the latch as the leader");
    assert!(now.path.contains("-latch-"), "{}", now.path);
    std::fs::write(&latch_flag, b"done").expect("flag");
    let codes = tokio::task::block_in_place(|| wait_all(&mut procs, Duration::from_secs(30)));
    assert_eq!(codes, vec![Some(0)], "the latch process:\n{}", latch.text());
    assert_eq!(election.leader().await.expect("leader"), None, "a closed latch leaves no leader");

    // The selector: a Baton LeaderSelector::start_at leads; a Curator
    // LeaderSelector queued behind it at the same path does not lead until
    // the Baton term ends, then leads, and each reads the other's id as
    // the leader's; the Baton selector, queued again, leads after it.
    let (term_tx, mut terms) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let end_term = Arc::new(tokio::sync::Notify::new());
    let selector = {
        let (tx, end) = (term_tx.clone(), end_term.clone());
        baton_client::LeaderSelector::start_at(&native, "/interop/selector", "baton-sel", move |term| {
            let (tx, end) = (tx.clone(), end.clone());
            async move {
                let _ = tx.send(term.fencing_token);
                end.notified().await;
            }
        })
    };
    let first = tokio::time::timeout(Duration::from_secs(20), terms.recv()).await.expect("a first term in 20 s");
    let first = first.expect("terms");
    let sel_flag = c.dir.path().join("selector-done");
    let spec = vec!["selector".into(), eps.clone(), "curator-sel".into(), sel_flag.display().to_string(), "60".into()];
    let mut procs = Procs(vec![java.spawn(spec)]);
    let sel = Output::capture(&mut procs.0[0], "curator-selector");
    sel.wait_for("SELECTOR not leader", "the selector").await;
    let at = native.election("/interop/selector").expect("the selector's queue");
    let now = at.leader().await.expect("leader").expect("a leader");
    assert_eq!((now.value.as_slice(), now.fencing_token), (&b"baton-sel"[..], first));
    let queued = native.children("/interop/selector").await.expect("candidates");
    assert_eq!(queued.len(), 2, "one queue: {queued:?}");
    assert!(queued.iter().all(|n| n.contains("-lock-")), "Curator's LeaderSelector layout: {queued:?}");
    end_term.notify_one();
    sel.wait_for("SELECTOR leader curator-sel", "the selector").await;
    let now = at.leader().await.expect("leader").expect("a leader");
    assert_eq!(now.value, b"curator-sel", "Baton reads the Curator selector as the leader");
    assert!(terms.try_recv().is_err(), "the Baton selector led beside the Curator one");
    std::fs::write(&sel_flag, b"done").expect("flag");
    let second = tokio::time::timeout(Duration::from_secs(20), terms.recv()).await.expect("a second term in 20 s");
    assert!(second.expect("terms") > first, "the next term's token is higher");
    let codes = tokio::task::block_in_place(|| wait_all(&mut procs, Duration::from_secs(30)));
    assert_eq!(codes, vec![Some(0)], "the Curator selector:\n{}", sel.text());
    selector.close().await;
    assert_eq!(at.leader().await.expect("leader"), None, "a closed selector leaves no leader");

    // The read-write lock: Curator's InterProcessReadWriteLock and
    // baton-client's rw_lock_at at one path exclude each other's writers
    // and share with each other's readers.
    let rw = native.rw_lock_at("/interop/rwlock").expect("rw lock");
    let w = rw.write().await.expect("a Baton writer");
    let rw_flag = c.dir.path().join("rw-reads");
    let spec = vec!["rwlock".into(), eps.clone(), "curator-rw".into(), rw_flag.display().to_string(), "60".into()];
    let mut procs = Procs(vec![java.spawn(spec)]);
    let rwo = Output::capture(&mut procs.0[0], "curator-rwlock");
    rwo.wait_for("RW read blocked by writer", "the rwlock").await;
    w.release().await.expect("release");
    let r = rw.read().await.expect("a Baton reader");
    std::fs::write(&rw_flag, b"go").expect("flag");
    rwo.wait_for("RW read shared", "the rwlock").await;
    rwo.wait_for("RW write blocked by reader", "the rwlock").await;
    r.release().await.expect("release");
    rwo.wait_for("RW write", "the rwlock").await;
    assert!(rw.try_read().await.expect("try_read").is_none(), "a Baton reader beside a Curator writer");
    assert!(rw.try_write().await.expect("try_write").is_none(), "a Baton writer beside a Curator writer");
    std::fs::write(c.dir.path().join("rw-reads.2"), b"go").expect("flag");
    let codes = tokio::task::block_in_place(|| wait_all(&mut procs, Duration::from_secs(30)));
    assert_eq!(codes, vec![Some(0)], "the Curator read-write lock:\n{}", rwo.text());
    let w = tokio::time::timeout(Duration::from_secs(10), rw.write()).await.expect("free again").expect("write");
    w.release().await.expect("release");

    // The semaphore: Curator's InterProcessSemaphoreV2 and baton-client's
    // semaphore_at of 2 at one path share their 2 permits.
    // (One task holds one permit of a semaphore per client: the second
    // holder is another client.)
    let sem = native.semaphore_at("/interop/semaphore", 2).expect("semaphore");
    let second = c.client().await;
    let p1 = sem.acquire().await.expect("a first permit");
    let p2 = second.semaphore_at("/interop/semaphore", 2).expect("semaphore").acquire().await.expect("a second");
    let sem_flag = c.dir.path().join("sem-done");
    let spec = vec!["semaphore".into(), eps.clone(), "curator-sem".into(), sem_flag.display().to_string(), "60".into()];
    let mut procs = Procs(vec![java.spawn(spec)]);
    let so = Output::capture(&mut procs.0[0], "curator-semaphore");
    so.wait_for("SEM blocked", "the semaphore").await;
    assert!(p1.fencing_token() < p2.fencing_token());
    p1.release().await.expect("release");
    so.wait_for("SEM leased", "the semaphore").await;
    assert!(sem.try_acquire().await.expect("try_acquire").is_none(), "a third holder beside Curator's lease and ours");
    std::fs::write(&sem_flag, b"done").expect("flag");
    let codes = tokio::task::block_in_place(|| wait_all(&mut procs, Duration::from_secs(30)));
    assert_eq!(codes, vec![Some(0)], "the Curator semaphore:\n{}", so.text());
    let p3 = sem.try_acquire().await.expect("try_acquire").expect("a permit once Curator's lease is returned");
    p3.release().await.expect("release");
    p2.release().await.expect("release");
    second.close().await.expect("close");

    // The lock: two holders of each library, one fenced counter.
    native
        .create(INTEROP_COUNTER, "0 0 init", baton_client::CreateOptions::persistent().with_parents())
        .await
        .expect("counter");
    let flag = c.dir.path().join("enough");
    let mut procs = Procs(Vec::new());
    let mut outs = Vec::new();
    for who in ["curator-1", "curator-2"] {
        let mut p = java.spawn(vec!["mutex".into(), eps.clone(), who.into(), flag.display().to_string(), "90".into()]);
        outs.push(Output::capture(&mut p, "curator-mutex"));
        procs.0.push(p);
    }
    for who in ["kazoo-1", "kazoo-2"] {
        let mut p = Command::new(&python)
            .arg(repo_file("zk/kazoo_interop.py"))
            .args(["--hosts", &eps, "--who", who, "--deadline", "90"])
            .arg("--flag")
            .arg(&flag)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python runs");
        outs.push(Output::capture(&mut p, "kazoo-lock"));
        procs.0.push(p);
    }
    let mut natives = Vec::new();
    for who in ["baton-1", "baton-2"] {
        let cl = c.client().await;
        natives.push(tokio::spawn(native_holder(cl, who.to_string(), flag.clone())));
    }
    // Enough once every holder made 5 increments: they took turns.
    let who = ["curator-1", "curator-2", "kazoo-1", "kazoo-2", "baton-1", "baton-2"];
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let mut low = Vec::new();
        for w in who {
            let n = match native.get(&format!("/interop/tally/{w}")).await {
                Ok((d, _)) => String::from_utf8_lossy(&d).parse::<u64>().unwrap_or(0),
                Err(_) => 0,
            };
            if n < 5 {
                low.push((w, n));
            }
        }
        if low.is_empty() {
            break;
        }
        for (i, p) in procs.0.iter_mut().enumerate() {
            if let Ok(Some(st)) = p.try_wait() {
                panic!("{} exited ({st}) early:\n{}", who[i], outs[i].text());
            }
        }
        assert!(natives.iter().all(|t| !t.is_finished()), "a baton-client holder ended early");
        assert!(Instant::now() < until, "not every holder made 5 increments in 90 s: {low:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&flag, b"enough").expect("flag");
    let codes = tokio::task::block_in_place(|| wait_all(&mut procs, Duration::from_secs(60)));
    let texts: Vec<String> = outs.iter().map(Output::text).collect();
    assert_eq!(codes, vec![Some(0); 4], "a Curator or kazoo holder failed:\n{}", texts.join("\n---\n"));
    let mut total = 0u64;
    for t in &texts {
        total += t
            .lines()
            .find_map(|l| l.strip_prefix("DONE "))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("a holder printed no DONE line:\n{t}"));
    }
    for t in natives {
        total += t.await.expect("task").unwrap_or_else(|e| panic!("a baton-client holder failed: {e}"));
    }
    let (data, _) = native.get(INTEROP_COUNTER).await.expect("counter");
    let value: u64 = String::from_utf8_lossy(&data).split(' ').next().and_then(|v| v.parse().ok()).expect("a value");
    assert_eq!(value, total, "every increment of every holder is in the counter (none lost, none doubled)");
    eprintln!("t80: {total} increments by 6 holders of 3 libraries, {:?}", started.elapsed());
}
