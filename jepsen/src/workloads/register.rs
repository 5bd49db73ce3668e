//! The register workload: read / write / compare-and-set (by version) on
//! [`KEYS`] keys, each a node created as "0" at version 0; checked for
//! linearizability per key (`baton_checker::register`).
//!
//! History: `read` (ok `{"value", "version"}`), `write` (invoke
//! `{"value"}`), `cas` (invoke `{"expected_version", "value"}`); writes
//! and cas complete ok with `{"version"}`, the new version. Written values
//! are unique across the run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_checker::history::{role::MAIN, History};
use baton_checker::register::RegisterState;
use baton_checker::CheckResult;
use baton_client::Client;

use crate::door::DoorClient;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{create, new_process};
use crate::record::{retire, Call, Run};

/// Keys the workload reads and writes.
pub const KEYS: usize = 5;

/// The next value written (unique across the run, so a read names the
/// write it saw).
static NEXT_VALUE: AtomicI64 = AtomicI64::new(1);

const REGISTERS: &str = "/jepsen/registers";

fn key_path(k: &str) -> String {
    format!("{REGISTERS}/{k}")
}

pub(super) async fn setup(c: &Client) -> anyhow::Result<()> {
    for k in 0..KEYS {
        create(c, &key_path(&format!("k{k}")), "0").await?;
    }
    Ok(())
}

/// The register checker: keys start as "0" at version 0, as `setup`
/// creates them.
pub fn check(h: &History) -> CheckResult {
    baton_checker::register::check(h, RegisterState { value: Some(0), version: 0 })
}

/// One client slot: a random key, then a read (9 in 10 for a `reader`,
/// else half), a write or a cas against the version last seen.
pub(super) async fn worker(run: Arc<Run>, slot: usize, reader: bool, mut rng: StdRng) {
    let Some((mut c, mut p)) = new_process(&run, slot, MAIN).await else { return };
    let mut versions: HashMap<String, i32> = HashMap::new();
    while !run.stopped() {
        run.checkpoint(slot).await;
        let k = format!("k{}", rng.gen_range(0..KEYS));
        let path = key_path(&k);
        let roll = if reader && rng.gen_bool(0.9) { 0 } else { rng.gen_range(0..10) };
        let replace = if roll < 5 {
            let read = async {
                let (d, version) = c.get(&path).await?;
                let v: Option<i64> = std::str::from_utf8(&d).ok().and_then(|t| t.parse().ok());
                Ok((version, json!({"value": v, "version": version})))
            };
            if let Ok(version) = run.op(p, Call::new("read", &k), read).await {
                versions.insert(k, version);
            }
            false
        } else {
            let v = NEXT_VALUE.fetch_add(1, Ordering::SeqCst);
            let (f, expected) =
                if roll < 8 { ("write", None) } else { ("cas", Some(versions.get(&k).copied().unwrap_or(0))) };
            let args = match expected {
                None => json!({"value": v}),
                Some(ev) => json!({"expected_version": ev, "value": v}),
            };
            let write = async {
                let version = c.set(&path, v.to_string().as_bytes(), expected).await?;
                Ok((version, json!({"version": version})))
            };
            match run.op(p, Call::new(f, &k).args(args), write).await {
                Ok(version) => {
                    versions.insert(k, version);
                    false
                }
                Err(e) => e.may_have_happened() || DoorClient::session_gone(&e),
            }
        };
        if replace {
            // Jepsen's rule: a process with an unfinished op is retired
            // (and one whose session expired needs a new one anyway).
            retire(c);
            let Some(next) = new_process(&run, slot, MAIN).await else { return };
            (c, p) = next;
        }
        run.sleep(Duration::from_millis(rng.gen_range(2..15))).await;
    }
    retire(c);
}
