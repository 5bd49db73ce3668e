//! A damaged data dir is detected when read, and the member refuses to
//! serve or vote from it (server/src/kv.rs, "Integrity").

use std::time::Duration;

use baton_client::CreateOptions;
use baton_tests::{batond_bin, distinct_ports, eventually, Cluster, Procs};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The member's RocksDB files holding `needle`, and where.
fn find(dir: &std::path::Path, needle: &[u8]) -> Vec<(std::path::PathBuf, usize)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.join("db")).expect("db dir").flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.ends_with(".log") || name.ends_with(".sst")) {
            continue;
        }
        let bytes = std::fs::read(&p).expect("read");
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            out.push((p, at));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i10_a_flipped_byte_stops_the_member_not_the_cluster() {
    let mut c = Cluster::start(3, &[]).await;
    let cl = c.client().await;
    let needle = b"9f1c3a77e2d84b05a6e1c0d2b3f4e5a6".to_vec();
    let (_, stat) = cl.create("/precious", needle.clone(), CreateOptions::persistent()).await.expect("create");
    c.wait_applied(3, stat.mzxid, SECS(10)).await;
    c.kill(3);
    let hits = find(&c.data_dir(3), &needle);
    assert!(!hits.is_empty(), "the value is on member 3's disk");
    let mut originals = Vec::new();
    for (path, at) in &hits {
        let mut bytes = std::fs::read(path).expect("read");
        originals.push((path.clone(), bytes.clone()));
        bytes[at + 5] ^= 0x20;
        std::fs::write(path, bytes).expect("damage");
    }
    c.start_member(3);
    let code = c.wait_exit(3, SECS(10)).await;
    assert_eq!(code, Some(3), "member 3 must refuse its damaged data dir: {}", c.log(3));
    assert!(c.log(3).contains("damaged"), "{}", c.log(3));
    // The others go on: writes commit and the value reads back intact.
    cl.create("/after", Vec::new(), CreateOptions::persistent()).await.expect("write with 2 of 3");
    assert_eq!(&cl.get("/precious").await.expect("get").0[..], &needle[..]);
    // The same files undamaged: the member starts and catches up.
    for (path, bytes) in originals {
        std::fs::write(path, bytes).expect("repair");
    }
    c.start_member(3);
    let commit = c.status(c.wait_leader(SECS(10)).await).await.map(|s| s.commit_index).unwrap_or(0);
    c.wait_applied(3, commit, SECS(20)).await;
    eventually(SECS(10), "member 3 serving", || async { c.status(3).await.map(|_| ()) }).await;
}

/// A data dir another member holds open is "in use", not damaged: the second
/// process exits 1 saying so, never 3 (which tells the operator to wipe the
/// dir and replace the member). Found by review: any open error was called
/// corrupt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i20_a_data_dir_in_use_is_not_called_damaged() {
    let c = Cluster::start(3, &[]).await;
    let ports = distinct_ports(2);
    let peer = format!("127.0.0.1:{}", ports[1]);
    let second = std::process::Command::new(batond_bin())
        .arg("--id=1")
        .arg(format!("--data-dir={}", c.data_dir(1).display()))
        .arg(format!("--client-addr=127.0.0.1:{}", ports[0]))
        .arg(format!("--peer-addr={peer}"))
        .arg(format!("--peers=1={peer}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn a second batond");
    // Killed on drop if it never exits (the assertion below then fails).
    let mut procs = Procs(vec![second]);
    let status = eventually(SECS(20), "the second batond to exit", || {
        let s = procs.0[0].try_wait().expect("try_wait");
        async move { s }
    })
    .await;
    let mut err = String::new();
    std::io::Read::read_to_string(procs.0[0].stderr.as_mut().expect("stderr"), &mut err).expect("stderr");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("in use") && !err.contains("damaged"), "{err}");
    // The member that holds it is untouched.
    assert!(c.status(1).await.is_some(), "member 1 stopped answering");
}
