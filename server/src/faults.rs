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
    /// `children` hides other sessions' ephemeral nodes, and a queue
    /// create's answer says it is first (the pushed grant), so a lock
    /// waiter sees no predecessor and is granted at once.
    pub grant_without_predecessor: bool,
    /// A new leader expires sessions at once instead of granting a fresh
    /// timeout.
    pub expire_without_grace: bool,
    /// Keepalives are answered from local state alone: a member cut off
    /// from the leader keeps its clients `Connected` (finding S1's class).
    pub contact_from_local_answers: bool,
    /// The leader answers keepalives without a quorum confirming it still
    /// leads: a deposed leader keeps its clients `Connected` (S4's class).
    pub keepalive_without_quorum: bool,
    /// Expiry is decided from the cached role, forwarded if raft-rs has
    /// stepped down, with no drain or tick-gap check: a leader resuming
    /// from a pause expires live sessions through the new leader (S2).
    pub expire_from_stale_role: bool,
    /// ReadIndex contexts start at 1 on every start: an answer to a read
    /// from before a restart serves a new read (S7).
    pub read_ctx_restarts: bool,
    /// Attach is answered from local state, without a ReadIndex or a live
    /// leader (S3).
    pub attach_from_local_state: bool,
    /// A new leader never lowers its fresh deadlines from the members'
    /// records: under frequent leader changes a dead client's session
    /// never expires (L1).
    pub no_deadline_rebuild: bool,
    /// RocksDB's default point-in-time WAL recovery and no value checksums:
    /// a damaged WAL loses its tail silently and the member serves.
    pub lenient_storage: bool,
    /// The ZooKeeper port answers an unknown outcome or a member with no
    /// leader with a CONNECTION_LOSS reply, as it did before, instead of
    /// closing the connection (zk/mod.rs).
    pub zk_loss_reply: bool,
    /// The ZooKeeper port resumes a session without claiming it through
    /// the log, numbering its writes from the applied state's next free
    /// sequence number plus 2^20, as it did before (finding Z2).
    pub zk_resume_without_claim: bool,
    /// A cached reply is returned for a matching sequence number without
    /// comparing its op's digest, as before (finding Z2).
    pub reply_without_digest: bool,
    /// The ZooKeeper port writes replies, events and ping answers without
    /// a vouched-for keepalive (zk/vouch.rs), as it did before: a member
    /// cut off from its peers keeps its ZooKeeper clients connected
    /// (finding Z1).
    pub zk_speak_unvouched: bool,
    /// Not a bug: the member behaves as one from before FIRST watches (a
    /// rolling upgrade with clients first): a create's `first_watch_id`
    /// is ignored and a FIRST watch is refused `BAD_REQUEST` as an unknown
    /// kind, so a test can prove a new client's lock still works on it.
    pub no_first_watch: bool,
    /// The leader answers a keepalive for a session it has not applied yet
    /// (a follower applied the `NewSession` entry first) `SESSION_EXPIRED`,
    /// as it did before 2026-12-06: a new client's first keepalive through
    /// a fast follower ends its session (sessions.rs, "not yet applied is
    /// not expired").
    pub not_yet_applied_expired: bool,
    /// When a queue node is deleted, its successor's FIRST watch fires
    /// `NODE_FIRST` whether or not the successor is now first: a waiter
    /// leaving from the middle of a queue (it gave up, or its session
    /// expired) wakes the one behind it while the holder still holds (the
    /// "watch the predecessor, then trust its deletion" bug of the classic
    /// recipe, on the pushed grant's path).
    pub first_to_successor: bool,
}

/// The names `--server-fault` accepts.
pub const NAMES: [&str; 19] = [
    "stale-reads",
    "ack-before-commit",
    "no-fence-check",
    "grant-without-predecessor",
    "expire-without-grace",
    "contact-from-local-answers",
    "keepalive-without-quorum",
    "expire-from-stale-role",
    "read-ctx-restarts",
    "attach-from-local-state",
    "no-deadline-rebuild",
    "lenient-storage",
    "zk-loss-reply",
    "zk-resume-without-claim",
    "reply-without-digest",
    "zk-speak-unvouched",
    "no-first-watch",
    "not-yet-applied-expired",
    "first-to-successor",
];

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
                "contact-from-local-answers" => f.contact_from_local_answers = true,
                "keepalive-without-quorum" => f.keepalive_without_quorum = true,
                "expire-from-stale-role" => f.expire_from_stale_role = true,
                "read-ctx-restarts" => f.read_ctx_restarts = true,
                "attach-from-local-state" => f.attach_from_local_state = true,
                "no-deadline-rebuild" => f.no_deadline_rebuild = true,
                "lenient-storage" => f.lenient_storage = true,
                "zk-loss-reply" => f.zk_loss_reply = true,
                "zk-resume-without-claim" => f.zk_resume_without_claim = true,
                "reply-without-digest" => f.reply_without_digest = true,
                "zk-speak-unvouched" => f.zk_speak_unvouched = true,
                "no-first-watch" => f.no_first_watch = true,
                "not-yet-applied-expired" => f.not_yet_applied_expired = true,
                "first-to-successor" => f.first_to_successor = true,
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
    query!(contact_from_local_answers);
    query!(keepalive_without_quorum);
    query!(expire_from_stale_role);
    query!(read_ctx_restarts);
    query!(attach_from_local_state);
    query!(no_deadline_rebuild);
    query!(lenient_storage);
    query!(zk_loss_reply);
    query!(zk_resume_without_claim);
    query!(reply_without_digest);
    query!(zk_speak_unvouched);
    query!(no_first_watch);
    query!(not_yet_applied_expired);
    query!(first_to_successor);
}
