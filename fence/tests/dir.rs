//! The directory fence on this machine's filesystem.

use std::sync::{Arc, Mutex};

use baton_fence::dir::DirFence;
use baton_fence::FenceError;

#[test]
fn a_paused_holder_loses_an_update_unless_fenced() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Unfenced (the control): plain writes, last one wins.
    let plain = tmp.path().join("plain");
    std::fs::write(&plain, b"99 by B").expect("B");
    std::fs::write(&plain, b"99 by A").expect("A, stale");
    assert_eq!(std::fs::read(&plain).expect("read"), b"99 by A");

    let f = DirFence::open(tmp.path().join("fenced")).expect("open");
    assert_eq!(f.read("stock").expect("read"), None);
    f.write("stock", 8, b"99 by B").expect("B");
    let err = f.write("stock", 5, b"99 by A").expect_err("A is stale");
    assert!(matches!(err, FenceError::Stale { token: 5, current: 8, .. }), "{err:?}");
    assert_eq!(f.read("stock").expect("read").as_deref(), Some(&b"99 by B"[..]));
    f.write("stock", 8, b"98 by B").expect("same token");
    // The record survives reopening (it is a file, synced).
    let again = DirFence::open(tmp.path().join("fenced")).expect("reopen");
    assert_eq!(again.current("stock").expect("current"), Some(8));
    assert!(again.write("stock", 7, b"x").expect_err("still stale").is_stale());
    assert_eq!(again.read("stock").expect("read").as_deref(), Some(&b"98 by B"[..]));
    assert!(matches!(again.write("../escape", 9, b"x"), Err(FenceError::Invalid(_))));
    // A corrupt record refuses rather than passes.
    std::fs::write(tmp.path().join("fenced/.stock.fence"), b"garbage").expect("corrupt");
    assert!(matches!(again.write("stock", 100, b"x"), Err(FenceError::Invalid(_))));
}

#[test]
fn racing_writers_never_apply_an_older_token_after_a_newer_one() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let f = DirFence::open(tmp.path()).expect("open");
    let applied = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..6u64)
        .map(|w| {
            let f = f.clone();
            let applied = applied.clone();
            std::thread::spawn(move || {
                for i in 0..30u64 {
                    let token = 1 + ((i * 6 + w) * 7919) % 150;
                    match f.write("r", token, token.to_string().as_bytes()) {
                        // Recorded under the same lock order as the write:
                        // read back what is there now.
                        Ok(()) => applied.lock().expect("lock").push(token),
                        Err(e) => assert!(e.is_stale(), "{e}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer");
    }
    let applied = applied.lock().expect("lock");
    let max = *applied.iter().max().expect("some applied");
    assert_eq!(f.current("r").expect("current"), Some(max));
    assert_eq!(
        f.read("r").expect("read"),
        Some(max.to_string().into_bytes()),
        "the file holds the newest token's write"
    );
    assert!(applied.len() < 180, "some were refused: {}", applied.len());
}
