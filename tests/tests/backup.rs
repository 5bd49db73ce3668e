//! Backups: `baton snapshot save` under load, `batond restore` into a new
//! one-member cluster that grows by `member add` (server/src/backup.rs).

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_client::{Client, ClientConfig, CreateOptions, Error};
use baton_tests::{baton_bin, batond_bin, distinct_ports, eventually, Cluster, Procs};

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn batond(args: &[String], log: &std::path::Path) -> std::process::Child {
    let log = std::fs::File::create(log).expect("log");
    Command::new(batond_bin())
        .args(args)
        .arg("--insecure-open-admin")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn batond")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b10_save_under_load_restore_and_grow() {
    let c = Cluster::start(3, &[]).await;
    let dir = tempfile::Builder::new().prefix("baton-backup-").tempdir().expect("tempdir");
    let file = dir.path().join("baton.backup");
    // A lock's fencing token before the backup.
    let holder = c.client().await;
    let g = holder.lock("job").await.expect("lock");
    let old_token = g.fencing_token();
    g.release().await.expect("release");
    // Writes go on while the backup is taken.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let w = c.client().await;
    w.create("/acked", Vec::new(), CreateOptions::persistent()).await.expect("parent");
    let writer = {
        let (stop, acked) = (stop.clone(), acked.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let p = format!("/acked/w-{n}");
                match w.create(&p, vec![b'v'; 64], CreateOptions::persistent()).await {
                    Ok(_) => acked.lock().unwrap().push(p),
                    Err(Error::SessionExpired) => return,
                    Err(_) => {}
                }
            }
        })
    };
    eventually(SECS(10), "writes flowing", || async { (acked.lock().unwrap().len() > 50).then_some(()) }).await;
    let before: Vec<String> = acked.lock().unwrap().clone();
    let out = Command::new(baton_bin())
        .arg(format!("--endpoints={}", c.endpoint(2)))
        .args(["snapshot", "save"])
        .arg(&file)
        .output()
        .expect("baton snapshot save");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("saved"));
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(SECS(10), writer).await;
    drop(c);

    // A damaged file is refused.
    let mut bad = std::fs::read(&file).expect("backup");
    let n = bad.len();
    bad[n - 10] ^= 0xff;
    let bad_file = dir.path().join("bad.backup");
    std::fs::write(&bad_file, bad).expect("write");
    let out = Command::new(batond_bin())
        .args(["restore", &bad_file.display().to_string(), "--data-dir", &dir.path().join("x").display().to_string()])
        .output()
        .expect("batond restore");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("checksum"), "{out:?}");

    // Restore into a new one-member cluster.
    let d1 = dir.path().join("member-1");
    let out = Command::new(batond_bin())
        .args(["restore", &file.display().to_string(), "--data-dir", &d1.display().to_string(), "--id", "1"])
        .output()
        .expect("batond restore");
    assert!(out.status.success(), "{out:?}");
    let ports = distinct_ports(4);
    let (c1, p1, c2, p2) = (ports[0], ports[1], ports[2], ports[3]);
    let mut procs = Procs(Vec::new());
    procs.0.push(batond(
        &[
            "--id=1".into(),
            format!("--data-dir={}", d1.display()),
            format!("--client-addr=127.0.0.1:{c1}"),
            format!("--peer-addr=127.0.0.1:{p1}"),
            format!("--peers=1=127.0.0.1:{p1}"),
        ],
        &dir.path().join("member-1.log"),
    ));
    let ep1 = format!("127.0.0.1:{c1}");
    let r = eventually(SECS(20), "the restored member serves", || async {
        Client::connect_with(ClientConfig::new(vec![ep1.clone()]).op_timeout(SECS(2))).await.ok()
    })
    .await;
    // Every write acknowledged before the save is there.
    let have: BTreeSet<String> =
        r.children("/acked").await.expect("children").into_iter().map(|n| format!("/acked/{n}")).collect();
    for p in &before {
        assert!(have.contains(p), "{p} acknowledged before the backup is missing");
    }
    // Fencing tokens go on growing past every token handed out before.
    let g = r.lock("job").await.expect("lock after restore");
    assert!(g.fencing_token() > old_token, "token {} after restore, {old_token} before", g.fencing_token());
    g.release().await.expect("release");
    // The new cluster grows by member add.
    let out = Command::new(baton_bin())
        .arg(format!("--endpoints={ep1}"))
        .args(["member", "add", "2", "--peer-addr", &format!("127.0.0.1:{p2}"), "--client-addr"])
        .arg(format!("127.0.0.1:{c2}"))
        .output()
        .expect("member add");
    assert!(out.status.success(), "{out:?}");
    procs.0.push(batond(
        &[
            "--id=2".into(),
            format!("--data-dir={}", dir.path().join("member-2").display()),
            format!("--client-addr=127.0.0.1:{c2}"),
            format!("--peer-addr=127.0.0.1:{p2}"),
            format!("--join=1=127.0.0.1:{p1}"),
        ],
        &dir.path().join("member-2.log"),
    ));
    let ep2 = format!("127.0.0.1:{c2}");
    eventually(SECS(30), "member 2 caught up and promoted", || async {
        let s = baton_client::member_status(&ep2, SECS(1)).await.ok()?;
        (s.voters.contains(&2) && s.applied_index >= r.last_zxid().await).then_some(())
    })
    .await;
    let on2 = Client::connect_with(ClientConfig::new(vec![ep2.clone()]).op_timeout(SECS(5))).await.expect("client");
    assert_eq!(on2.children("/acked").await.expect("children").len(), have.len());
}

/// Finding A1 (backups) and A4: a backup holds no session's secret or
/// cached replies, so its reader cannot resume or close a session of the
/// live cluster; `batond restore --cluster-id` refuses the backup's own id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b20_a_backup_holds_no_session_secret_and_restore_refuses_the_old_cluster_id() {
    use prost::Message as _;
    let c = Cluster::start(3, &[]).await;
    let dir = tempfile::Builder::new().prefix("baton-backup-").tempdir().expect("tempdir");
    let file = dir.path().join("baton.backup");
    let holder = c.client().await;
    holder.create("/mine", "x", CreateOptions::ephemeral()).await.expect("ephemeral");
    holder.set("/mine", "y", None).await.expect("a write, so the session has a cached reply");
    let out = Command::new(baton_bin())
        .arg(format!("--endpoints={}", c.endpoint(1)))
        .args(["snapshot", "save"])
        .arg(&file)
        .output()
        .expect("baton snapshot save");
    assert!(out.status.success(), "{out:?}");
    let f = baton_server::backup::decode(&std::fs::read(&file).expect("backup")).expect("a valid backup");
    let snap = baton_proto::Snapshot::decode(&f.state[..]).expect("its state");
    assert!(
        snap.sessions.iter().any(|s| s.id == holder.session_id()),
        "the live session is in the backup (it expires on a restored cluster)"
    );
    for s in &snap.sessions {
        assert!(s.secret.is_empty(), "session {:#x}'s secret is in the backup", s.id);
        assert!(s.replies.is_empty(), "session {:#x}'s cached replies are in the backup", s.id);
    }
    // The old cluster id is refused; a new one is taken.
    let d1 = dir.path().join("member-1");
    let restore = |extra: &[&str]| {
        Command::new(batond_bin())
            .args(["restore", &file.display().to_string(), "--data-dir", &d1.display().to_string()])
            .args(extra)
            .output()
            .expect("batond restore")
    };
    let out = restore(&["--cluster-id", &f.cluster_id]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("own cluster id"), "{out:?}");
    let out = restore(&["--cluster-id", "a-new-one"]);
    assert!(out.status.success(), "{out:?}");
}

/// Finding A1: with no `--superuser`, anyone who reached a client port could
/// take a backup (every node) and change the membership. Now a cluster
/// with no admin identity refuses both unless a member runs with
/// `--insecure-open-admin` (what `batond cluster` does on plaintext); with
/// a `--superuser digest:NAME:HASH` the first admin logs in by name and
/// password on a plaintext cluster (docs/operations.md, The first admin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b30_admin_operations_need_an_admin_identity() {
    let dir = tempfile::Builder::new().prefix("baton-backup-").tempdir().expect("tempdir");
    let file = dir.path().join("f.backup");
    let run = |c: &Cluster, user: Option<&str>, args: &[&str]| {
        let mut cmd = Command::new(baton_bin());
        cmd.arg(format!("--endpoints={}", c.endpoints().join(",")));
        if let Some(u) = user {
            cmd.args(["--user", u]).env("BATON_PASSWORD", "root-pw");
        }
        cmd.args(args).output().expect("baton")
    };
    let save = ["snapshot", "save", file.to_str().expect("path")];
    let add = ["member", "add", "4", "--peer-addr", "127.0.0.1:9", "--client-addr", "127.0.0.1:9", "--learner"];
    {
        let c = Cluster::start(3, &["--insecure-open-admin=false"]).await;
        for args in [&save[..], &add[..]] {
            let out = run(&c, None, args);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("admin identity") && err.contains("--superuser"), "{args:?}: {err}");
        }
        assert!(!file.exists(), "a refused backup wrote a file");
    }
    let root = baton_server::acl::digest("root", "root-pw");
    let c = Cluster::start(3, &[&format!("--superuser={root}")]).await;
    let out = run(&c, None, &save);
    assert_eq!(out.status.code(), Some(1), "anonymous: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("need a superuser"), "{out:?}");
    let out = run(&c, Some("root"), &save);
    assert!(out.status.success(), "the digest superuser: {out:?}");
    assert!(file.exists());
    let out = run(&c, Some("root"), &add);
    assert!(out.status.success(), "the digest superuser adds a learner: {out:?}");
    let out = run(&c, Some("root"), &["member", "remove", "4"]);
    assert!(out.status.success(), "{out:?}");
    // A wrong password gains nothing.
    let out = Command::new(baton_bin())
        .arg(format!("--endpoints={}", c.endpoints().join(",")))
        .args(["--user", "root"])
        .env("BATON_PASSWORD", "wrong")
        .args(save)
        .output()
        .expect("baton");
    assert_ne!(out.status.code(), Some(0), "{out:?}");
}
