//! Linearizability checking in the style of Wing & Gong, as refined by Lowe
//! ("Testing for linearizability", 2017) — the search Knossos calls "wgl"
//! and Porcupine uses — of one object's operations against any sequential
//! [`Model`]. [`crate::register`] applies it with P-compositionality: every
//! key is an independent object, so each key's sub-history is checked on
//! its own (and keys are checked in parallel).
//!
//! # The search
//!
//! Every determinate operation contributes two entries, its call and its
//! return, to a doubly linked list ordered by time (a call sorts before a
//! return at the same instant, so touching operations count as concurrent).
//! The search repeatedly looks at the calls that precede the first return in
//! the list: those operations are "minimal" and may take effect next. Taking
//! one ("lift") applies it to the model, removes its call and return from the
//! list and pushes a frame on a stack; if nothing can be taken before the
//! first return, the search backtracks ("unlift": pop, restore the model
//! state, put the entries back) and tries the next candidate. A cache of
//! (set of linearized operations, model state) prunes configurations already
//! explored. The history is linearizable iff the list empties.
//!
//! Indeterminate operations (`info`, or never completed) have their return at
//! infinity: they may take effect at any point after their call, or never.
//! They are kept in a second list of calls only; they are offered as
//! candidates after the determinate ones (so they are linearized lazily, when
//! something needs them), they are never *required*, and the search succeeds
//! as soon as every determinate operation is linearized.
//!
//! Refinements over the plain search, each of which keeps every verdict
//! (they are cross-checked against brute force in the tests):
//! - Candidates are tried in order of return time, so short operations go
//!   before long ones that span many others.
//! - An operation that leaves the state unchanged (a read of the current
//!   value) is lifted at once without trying alternatives: moving it to the
//!   front of any valid completion keeps it valid.
//! - Interchangeable operations are tried once: of pending determinate
//!   operations with equal input and output only the one returning first, of
//!   pending indeterminate operations with equal inputs only the earliest.
//! - [`Model::still_possible`] lets a model declare a pending operation
//!   impossible from here on (a read of version 7 once the register is at
//!   version 8); a lift that would strand a pending operation is pruned.
//! - The register adapter ([`crate::register`]) gives every written value
//!   that no read observes one common value, so states that no read can
//!   tell apart coincide.
//!
//! Definite failures (`fail`) had no effect and are excluded.
//!
//! [`Search`] holds the lists, the path of lifted operations and the cache,
//! and walks the configurations depth first, one named step at a time
//! (enter a configuration, try its next candidate, note a dead end,
//! backtrack).
//!
//! # Budget
//!
//! The search is exponential in the worst case. [`CheckOptions::max_states`]
//! bounds the number of distinct configurations cached per key; a key whose
//! search exceeds it is reported as [`Validity::Unknown`].

use std::hash::Hash;

use crate::verdict::Validity;

mod bits;
mod search;

pub use search::Search;

/// A sequential specification. Implementations must be deterministic: a
/// state and an operation determine the next state.
pub trait Model: Clone + Eq + Hash {
    /// An operation's input (its arguments).
    type In: Eq + Hash;
    /// An operation's observed output.
    type Out: Eq + Hash;

    /// Applies an operation that returned `output`. `None` means that output
    /// is impossible from this state.
    fn step(&self, input: &Self::In, output: &Self::Out) -> Option<Self>;

    /// Applies an operation whose output is unknown (indeterminate): the
    /// state after it takes effect with whatever output the model produces.
    /// `None` means it cannot take effect from this state.
    fn step_unknown(&self, input: &Self::In) -> Option<Self>;

    /// Pruning hint: may return `false` only if the operation can be
    /// linearized neither from this state nor from any state reachable from
    /// it (e.g. versions only grow). The default never prunes.
    fn still_possible(&self, input: &Self::In, output: Option<&Self::Out>) -> bool {
        let _ = (input, output);
        true
    }
}

/// One operation of a single object's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation<I, O> {
    /// Caller's identifier (e.g. an index into the history); reported back.
    pub id: usize,
    /// Invocation time.
    pub call: u64,
    /// Completion time; `u64::MAX` for an indeterminate operation, which may
    /// take effect at any time after `call`, or never.
    pub ret: u64,
    pub input: I,
    /// The observed output; `None` = unknown (not checked, see
    /// [`Model::step_unknown`]).
    pub output: Option<O>,
}

/// Search limits.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Maximum number of distinct (linearized set, state) configurations
    /// explored per key before giving up with [`Validity::Unknown`]. Each
    /// costs about 130 bytes of cache (for ~10k-operation keys) and about
    /// 2 µs, so the default of 1,000,000 bounds a key at roughly 130 MB and
    /// 2-3 s; memory is per concurrently checked key (see `threads`).
    pub max_states: u64,
    /// Worker threads for checking keys in parallel; 0 = available cores.
    pub threads: usize,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { max_states: 1_000_000, threads: 0 }
    }
}

/// Why one object's history is not linearizable (or, for `Unknown`, how far
/// the search got).
#[derive(Debug, Clone)]
pub struct Failure<M> {
    /// The longest linearizable prefix found: operation ids in linearization
    /// order.
    pub prefix: Vec<usize>,
    /// The model state after that prefix.
    pub state: M,
    /// The operation that returned without a possible linearization point
    /// after that prefix.
    pub op: usize,
    /// Other operations that were pending (could have been linearized next)
    /// at that point; at most 32 indeterminate ones are listed.
    pub pending: Vec<usize>,
}

/// The result of checking one object.
#[derive(Debug, Clone)]
pub struct Outcome<M> {
    pub validity: Validity,
    /// Distinct configurations explored.
    pub states: u64,
    /// For `Valid`: a witness, the ids of the operations that took effect, in
    /// linearization order (indeterminate operations that never took effect
    /// are absent).
    pub linearization: Vec<usize>,
    /// For `Invalid` (and, as partial information, `Unknown`).
    pub failure: Option<Failure<M>>,
}

/// Checks one object's operations for linearizability from `initial`
/// (the WGL search described in the module documentation). Only
/// `opts.max_states` is used here.
pub fn check_operations<M: Model>(initial: &M, ops: &[Operation<M::In, M::Out>], opts: &CheckOptions) -> Outcome<M> {
    Search::new(initial, ops, opts).run()
}
