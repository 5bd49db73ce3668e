//! Deliberate bugs, for proving the Jepsen harness's checkers (a checker is
//! only trusted once it has caught a broken server).
//!
//! Compiled only with the `fault-injection` cargo feature (binary
//! `batond-faulty`), and active only when named with `--server-fault`.
//! Release builds of `batond` contain none of this: without the feature,
//! every query below is a constant `false` the compiler removes.

/// Which bugs are switched on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Serve linearizable reads from local state, without ReadIndex.
    pub stale_reads: bool,
    /// Answer a write once it is in the local log, before it commits.
    pub ack_before_commit: bool,
    /// `check_fence` always passes.
    pub no_fence_check: bool,
    /// `children` hides other sessions' ephemeral nodes, so a lock waiter
    /// sees no predecessor and is granted at once.
    pub grant_without_predecessor: bool,
    /// A new leader expires sessions at once instead of granting a fresh
    /// timeout.
    pub expire_without_grace: bool,
}

/// The names `--server-fault` accepts.
pub const NAMES: [&str; 5] =
    ["stale-reads", "ack-before-commit", "no-fence-check", "grant-without-predecessor", "expire-without-grace"];

impl Faults {
    /// Parses fault names (comma-separated or repeated).
    pub fn parse(names: &[String]) -> Result<Faults, String> {
        let mut f = Faults::default();
        for name in names.iter().flat_map(|n| n.split(',')).map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "stale-reads" => f.stale_reads = true,
                "ack-before-commit" => f.ack_before_commit = true,
                "no-fence-check" => f.no_fence_check = true,
                "grant-without-predecessor" => f.grant_without_predecessor = true,
                "expire-without-grace" => f.expire_without_grace = true,
                other => return Err(format!("unknown server fault {other:?} (known: {})", NAMES.join(", "))),
            }
        }
        Ok(f)
    }

    pub fn any(&self) -> bool {
        *self != Faults::default()
    }
}

macro_rules! query {
    ($name:ident) => {
        /// True when this fault is active (always false without the feature).
        #[inline]
        pub fn $name(&self) -> bool {
            cfg!(feature = "fault-injection") && self.$name
        }
    };
}

impl Faults {
    query!(stale_reads);
    query!(ack_before_commit);
    query!(no_fence_check);
    query!(grant_without_predecessor);
    query!(expire_without_grace);
}
