//! Linearizability checking in the style of Wing & Gong, as refined by Lowe
//! ("Testing for linearizability", 2017) — the search Knossos calls "wgl"
//! and Porcupine uses — with P-compositionality: every key is an
//! independent object, so each key's sub-history is checked on its own
//! (and keys are checked in parallel).
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
//! - The register adapter gives every written value that no read observes
//!   one common value, so states that no read can tell apart coincide.
//!
//! Definite failures (`fail`) had no effect and are excluded.
//!
//! # Budget
//!
//! The search is exponential in the worst case. [`CheckOptions::max_states`]
//! bounds the number of distinct configurations cached per key; a key whose
//! search exceeds it is reported as [`Validity::Unknown`].

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use crate::verdict::Validity;

// ---------------------------------------------------------------------------
// Generic model and checker
// ---------------------------------------------------------------------------

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

const NIL: u32 = u32::MAX;

/// Where the scan of a configuration stands.
#[derive(Clone, Copy)]
enum Cursor {
    /// Next determinate candidate: this index into `cands` (the current
    /// level's candidates, ordered by return).
    Det(usize),
    /// Next indeterminate candidate: this node of the indeterminate list,
    /// while its call precedes the return node given second.
    Opt(u32, u32),
    /// Lifted without alternatives (it left the state unchanged).
    Forced,
}

struct Frame<M> {
    /// How to resume the parent configuration's scan.
    cursor: Cursor,
    op: u32,
    /// The lifted op's call node (determinate) or indeterminate-list node.
    node: u32,
    prev: M,
}

#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().unwrap()));
        }
        for &b in chunks.remainder() {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64)
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }
    fn write_i32(&mut self, x: i32) {
        self.write_u64(x as u32 as u64)
    }
    fn write_i64(&mut self, x: i64) {
        self.write_u64(x as u64)
    }
    fn write_u8(&mut self, x: u8) {
        self.write_u64(x as u64)
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxBuild = BuildHasherDefault<FxHasher>;

/// The set of linearized operations: determinate ops occupy the first
/// `det_words` words (numbered in call order, so the set is mostly a prefix),
/// indeterminate ops the rest.
struct Bits {
    words: Vec<u64>,
    det_words: usize,
    d: usize,
}

impl Bits {
    fn new(d: usize, m: usize) -> Bits {
        let det_words = d.div_ceil(64);
        Bits { words: vec![0; det_words + m.div_ceil(64)], det_words, d }
    }
    #[inline]
    fn slot(&self, i: u32) -> (usize, u64) {
        let i = i as usize;
        let b = if i < self.d { i } else { self.det_words * 64 + (i - self.d) };
        (b / 64, 1u64 << (b % 64))
    }
    #[inline]
    fn set(&mut self, i: u32) {
        let (w, m) = self.slot(i);
        self.words[w] |= m;
    }
    #[inline]
    fn clear(&mut self, i: u32) {
        let (w, m) = self.slot(i);
        self.words[w] &= !m;
    }
    #[inline]
    fn get(&self, i: u32) -> bool {
        let (w, m) = self.slot(i);
        self.words[w] & m != 0
    }
    /// A compact, exact encoding: the count of leading all-ones determinate
    /// words, the determinate window up to its last non-zero word, and the
    /// indeterminate words.
    fn key(&self) -> Box<[u64]> {
        let dw = &self.words[..self.det_words];
        let lead = dw.iter().take_while(|&&w| w == u64::MAX).count();
        let mut end = dw.len();
        while end > lead && dw[end - 1] == 0 {
            end -= 1;
        }
        let mut v = Vec::with_capacity(1 + end - lead + self.words.len() - self.det_words);
        v.push(((lead as u64) << 32) | (end - lead) as u64);
        v.extend_from_slice(&dw[lead..end]);
        v.extend_from_slice(&self.words[self.det_words..]);
        v.into_boxed_slice()
    }
}

/// Unlinks a determinate call node and its return from the list.
fn lift_det(next: &mut [u32], prev: &mut [u32], node_match: &[u32], e: u32) {
    let e = e as usize;
    let r = node_match[e] as usize;
    next[prev[e] as usize] = next[e];
    prev[next[e] as usize] = prev[e];
    next[prev[r] as usize] = next[r];
    prev[next[r] as usize] = prev[r];
}

/// The first pending determinate operation in the window (the calls up to
/// and including the first return, skipping op `skip`) that can no longer
/// be linearized from `s` according to [`Model::still_possible`].
fn window_blocker<M: Model>(
    s: &M,
    skip: u32,
    next: &[u32],
    node_op: &[u32],
    node_call: &[bool],
    ops: &[Operation<M::In, M::Out>],
    orig: &[usize],
) -> Option<u32> {
    let mut c = next[0];
    loop {
        let i = node_op[c as usize];
        if i == NIL {
            return None; // tail
        }
        if i != skip {
            let o = &ops[orig[i as usize]];
            if !s.still_possible(&o.input, o.output.as_ref()) {
                return Some(i);
            }
            if !node_call[c as usize] {
                return None;
            }
        }
        c = next[c as usize];
    }
}

/// The operations called before the first return (of an op other than
/// `skip`), excluding `skip`, and that return node.
fn window_calls(skip: u32, next: &[u32], node_op: &[u32], node_call: &[bool]) -> (Vec<u32>, u32) {
    let mut calls = Vec::new();
    let mut c = next[0];
    loop {
        let i = node_op[c as usize];
        if i == NIL || (!node_call[c as usize] && i != skip) {
            return (calls, c);
        }
        if node_call[c as usize] && i != skip {
            calls.push(i);
        }
        c = next[c as usize];
    }
}

/// The deepest dead end found, for the report. `prefix[..stable]` always
/// equals the ops of `stack[..stable]`, so recording copies only what changed.
struct Best<M> {
    depth: Option<usize>,
    prefix: Vec<u32>,
    stable: usize,
    extra: Option<u32>,
    state: Option<M>,
    culprit: u32,
    pending: Vec<u32>,
}

impl<M: Clone> Best<M> {
    fn wants(&self, depth: usize) -> bool {
        self.depth.is_none_or(|d| depth > d)
    }
    fn record(&mut self, stack: &[Frame<M>], extra: Option<u32>, state: &M, culprit: u32, pending: Vec<u32>) {
        self.prefix.truncate(self.stable);
        self.prefix.extend(stack[self.stable..].iter().map(|f| f.op));
        self.stable = stack.len();
        self.depth = Some(stack.len() + extra.is_some() as usize);
        self.extra = extra;
        self.state = Some(state.clone());
        self.culprit = culprit;
        self.pending = pending;
    }
}

/// Checks one object's operations for linearizability from `initial`
/// (the WGL search described in the module documentation). Only
/// `opts.max_states` is used here.
pub fn check_operations<M: Model>(initial: &M, ops: &[Operation<M::In, M::Out>], opts: &CheckOptions) -> Outcome<M> {
    // Internal numbering: determinate ops 0..d by call time, then
    // indeterminate ones d..d+m by call time.
    let mut det: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].ret != u64::MAX).collect();
    let mut opt: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].ret == u64::MAX).collect();
    det.sort_by_key(|&i| (ops[i].call, i));
    opt.sort_by_key(|&i| (ops[i].call, i));
    let (d, m) = (det.len(), opt.len());
    let orig: Vec<usize> = det.iter().chain(opt.iter()).copied().collect();
    let op_of = |i: u32| &ops[orig[i as usize]];

    // Global event order: (time, call=0 before return=1, internal op).
    let mut events: Vec<(u64, u8, u32)> = Vec::with_capacity(2 * d + m);
    for (k, &i) in det.iter().enumerate() {
        events.push((ops[i].call, 0, k as u32));
        events.push((ops[i].ret.max(ops[i].call), 1, k as u32));
    }
    for (k, &i) in opt.iter().enumerate() {
        events.push((ops[i].call, 0, (d + k) as u32));
    }
    events.sort_unstable();

    // Determinate list: node 0 = head, 1..=2d entries in time order, 2d+1 = tail.
    let head = 0u32;
    let tail = (2 * d + 1) as u32;
    let nodes = 2 * d + 2;
    let mut next: Vec<u32> = (1..=nodes as u32).collect();
    let mut prev: Vec<u32> = (0..nodes as u32).map(|i| i.wrapping_sub(1)).collect();
    next[tail as usize] = NIL;
    prev[head as usize] = NIL;
    let mut node_op = vec![NIL; nodes];
    let mut node_call = vec![false; nodes];
    let mut node_pos = vec![0u32; nodes];
    let mut node_match = vec![NIL; nodes];
    // Indeterminate list: node 0 = head, k+1 = op d+k, m+1 = tail.
    let ihead = 0u32;
    let itail = (m + 1) as u32;
    let mut inext: Vec<u32> = (1..=(m + 2) as u32).collect();
    let mut iprev: Vec<u32> = (0..(m + 2) as u32).map(|i| i.wrapping_sub(1)).collect();
    inext[itail as usize] = NIL;
    iprev[ihead as usize] = NIL;
    let mut ipos = vec![0u32; m + 2];
    let mut call_node = vec![NIL; d];
    {
        let mut node = 1usize;
        for (pos, &(_, kind, i)) in events.iter().enumerate() {
            if (i as usize) < d {
                node_op[node] = i;
                node_call[node] = kind == 0;
                node_pos[node] = pos as u32;
                if kind == 0 {
                    call_node[i as usize] = node as u32;
                } else {
                    node_match[call_node[i as usize] as usize] = node as u32;
                }
                node += 1;
            } else {
                ipos[i as usize - d + 1] = pos as u32;
            }
        }
    }
    // Among indeterminate ops with equal inputs, the previous one in call order.
    let mut prev_same = vec![NIL; m];
    {
        let mut last: HashMap<&M::In, u32> = HashMap::new();
        for k in 0..m {
            if let Some(p) = last.insert(&ops[opt[k]].input, (d + k) as u32) {
                prev_same[k] = p;
            }
        }
    }

    // Determinate ops with equal input and output are interchangeable: of
    // two such pending candidates, the one returning first can always take
    // effect first (swap them in any linearization), so only it is tried.
    // Classes of at least two members, each sorted by return.
    let mut class_of = vec![NIL; d];
    let mut class_members: Vec<Vec<u32>> = Vec::new();
    {
        type ClassKey<'a, M> = (&'a <M as Model>::In, &'a Option<<M as Model>::Out>);
        let mut classes: HashMap<ClassKey<'_, M>, Vec<u32>> = HashMap::new();
        for (k, &i) in det.iter().enumerate() {
            classes.entry((&ops[i].input, &ops[i].output)).or_default().push(k as u32);
        }
        for (_, mut members) in classes.into_iter().filter(|(_, v)| v.len() > 1) {
            members.sort_by_key(|&k| node_pos[node_match[call_node[k as usize] as usize] as usize]);
            for &k in &members {
                class_of[k as usize] = class_members.len() as u32;
            }
            class_members.push(members);
        }
    }
    let mut member_idx = vec![0u32; d];
    for members in &class_members {
        for (x, &k) in members.iter().enumerate() {
            member_idx[k as usize] = x as u32;
        }
    }
    // class_members[c][..class_start[c]] are all linearized.
    let mut class_start = vec![0u32; class_members.len()];

    let mut bits = Bits::new(d, m);
    let mut cache: HashSet<(Box<[u64]>, M), FxBuild> = HashSet::default();
    let mut stack: Vec<Frame<M>> = Vec::new();
    let mut state = initial.clone();
    let mut best: Best<M> = Best {
        depth: None,
        prefix: Vec::new(),
        stable: 0,
        extra: None,
        state: None,
        culprit: NIL,
        pending: Vec::new(),
    };
    // Indeterminate ops called before return node `r` (at most 32), for reports.
    let eligible_opt = |inext: &[u32], r: u32| {
        let mut v = Vec::new();
        let mut c = inext[ihead as usize];
        while c != itail && ipos[c as usize] < node_pos[r as usize] && v.len() < 32 {
            v.push(d as u32 + c - 1);
            c = inext[c as usize];
        }
        v
    };
    let step = |s: &M, op: &Operation<M::In, M::Out>| match &op.output {
        Some(o) => s.step(&op.input, o),
        None => s.step_unknown(&op.input),
    };

    // Per configuration on the path ("level"): its determinate candidates
    // (the calls before the first return, ordered by return so that short
    // operations are tried before long ones) and that first return node.
    let mut cands: Vec<u32> = Vec::new();
    let mut level_start: Vec<usize> = Vec::new();
    let mut level_ret: Vec<u32> = Vec::new();

    let mut cursor = Cursor::Det(0);
    // A new configuration, not yet scanned.
    let mut fresh = true;
    let validity = 'search: loop {
        if next[head as usize] == tail {
            break 'search Validity::Valid;
        }
        // `dead` = the return node we could not get past (NIL: nothing to
        // report, the configuration was explored before).
        let dead: u32 = 'scan: {
            if fresh {
                fresh = false;
                let start = cands.len();
                level_start.push(start);
                let mut c = next[head as usize];
                while node_call[c as usize] {
                    cands.push(c);
                    c = next[c as usize];
                }
                level_ret.push(c);
                // An operation that leaves the state unchanged (a read that
                // sees the current value) can be linearized right away:
                // moving it to the front of any completion keeps the
                // completion valid. So it is lifted without alternatives.
                for &e in &cands[start..] {
                    let i = node_op[e as usize];
                    if step(&state, op_of(i)).is_some_and(|ns| ns == state) {
                        bits.set(i);
                        if !cache.insert((bits.key(), state.clone())) {
                            bits.clear(i);
                            break 'scan NIL;
                        }
                        stack.push(Frame { cursor: Cursor::Forced, op: i, node: e, prev: state.clone() });
                        lift_det(&mut next, &mut prev, &node_match, e);
                        if cache.len() as u64 > opts.max_states {
                            break 'search Validity::Unknown;
                        }
                        fresh = true;
                        continue 'search;
                    }
                }
                cands[start..].sort_unstable_by_key(|&c| node_pos[node_match[c as usize] as usize]);
                cursor = Cursor::Det(start);
            }
            let first_ret = *level_ret.last().expect("a level per configuration");
            match cursor {
                Cursor::Det(k) if k < cands.len() => {
                    cursor = Cursor::Det(k + 1);
                    let e = cands[k];
                    let i = node_op[e as usize];
                    let c = class_of[i as usize];
                    if c != NIL {
                        // Skip i if an equal op returning earlier is also a candidate.
                        let members = &class_members[c as usize];
                        let mut x = class_start[c as usize] as usize;
                        while bits.get(members[x]) {
                            x += 1;
                        }
                        class_start[c as usize] = x as u32;
                        let h = members[x];
                        if h != i && node_pos[call_node[h as usize] as usize] < node_pos[first_ret as usize] {
                            continue 'search;
                        }
                    }
                    let Some(ns) = step(&state, op_of(i)) else { continue 'search };
                    if let Some(x) = window_blocker(&ns, i, &next, &node_op, &node_call, ops, &orig) {
                        // Taking i would strand x: i is linearizable here, x is
                        // the op that cannot follow.
                        if best.wants(stack.len() + 1) {
                            let (mut pending, end) = window_calls(i, &next, &node_op, &node_call);
                            pending.extend(eligible_opt(&inext, end));
                            best.record(&stack, Some(i), &ns, x, pending);
                        }
                        continue 'search;
                    }
                    bits.set(i);
                    if !cache.insert((bits.key(), ns.clone())) {
                        bits.clear(i);
                        continue 'search;
                    }
                    let prev_state = std::mem::replace(&mut state, ns);
                    stack.push(Frame { cursor: Cursor::Det(k), op: i, node: e, prev: prev_state });
                    lift_det(&mut next, &mut prev, &node_match, e);
                    if cache.len() as u64 > opts.max_states {
                        break 'search Validity::Unknown;
                    }
                    fresh = true;
                    continue 'search;
                }
                Cursor::Det(_) => {
                    // Determinate candidates exhausted: try indeterminate ops
                    // called before the first return.
                    if m > 0 && window_blocker(&state, NIL, &next, &node_op, &node_call, ops, &orig).is_none() {
                        cursor = Cursor::Opt(inext[ihead as usize], first_ret);
                        continue 'search;
                    }
                    first_ret
                }
                Cursor::Opt(j, r) => {
                    if j == itail || ipos[j as usize] > node_pos[r as usize] {
                        break 'scan r;
                    }
                    cursor = Cursor::Opt(inext[j as usize], r);
                    let i = d as u32 + j - 1;
                    let ps = prev_same[j as usize - 1];
                    if ps != NIL && !bits.get(ps) {
                        continue 'search; // an equal, earlier op is pending
                    }
                    // A lift that changes nothing is pointless: the op may
                    // equally stay pending forever.
                    let Some(ns) = step(&state, op_of(i)).filter(|ns| *ns != state) else { continue 'search };
                    if let Some(x) = window_blocker(&ns, NIL, &next, &node_op, &node_call, ops, &orig) {
                        if best.wants(stack.len() + 1) {
                            let (mut pending, end) = window_calls(NIL, &next, &node_op, &node_call);
                            pending.extend(eligible_opt(&inext, end).into_iter().filter(|&o| o != i));
                            best.record(&stack, Some(i), &ns, x, pending);
                        }
                        continue 'search;
                    }
                    bits.set(i);
                    if !cache.insert((bits.key(), ns.clone())) {
                        bits.clear(i);
                        continue 'search;
                    }
                    let prev_state = std::mem::replace(&mut state, ns);
                    stack.push(Frame { cursor: Cursor::Opt(j, r), op: i, node: j, prev: prev_state });
                    let ju = j as usize;
                    inext[iprev[ju] as usize] = inext[ju];
                    iprev[inext[ju] as usize] = iprev[ju];
                    if cache.len() as u64 > opts.max_states {
                        break 'search Validity::Unknown;
                    }
                    fresh = true;
                    continue 'search;
                }
                Cursor::Forced => unreachable!("forced frames are never resumed"),
            }
        };

        // Dead end at return node `dead`: record it if it is the deepest yet.
        if dead != NIL && best.wants(stack.len()) {
            let (mut pending, end) = window_calls(NIL, &next, &node_op, &node_call);
            debug_assert_eq!(end, dead);
            pending.extend(eligible_opt(&inext, dead));
            best.record(&stack, None, &state, node_op[dead as usize], pending);
        }

        // Backtrack (past forced frames: they had no alternatives).
        loop {
            cands.truncate(level_start.pop().expect("a level per configuration"));
            level_ret.pop();
            let Some(frame) = stack.pop() else {
                break 'search Validity::Invalid;
            };
            best.stable = best.stable.min(stack.len());
            state = frame.prev;
            bits.clear(frame.op);
            if (frame.op as usize) < d {
                let c = class_of[frame.op as usize];
                if c != NIL {
                    let c = c as usize;
                    class_start[c] = class_start[c].min(member_idx[frame.op as usize]);
                }
                // unlift: relink the return, then the call
                let e = frame.node as usize;
                let r = node_match[e] as usize;
                next[prev[r] as usize] = r as u32;
                prev[next[r] as usize] = r as u32;
                next[prev[e] as usize] = e as u32;
                prev[next[e] as usize] = e as u32;
            } else {
                let j = frame.node as usize;
                inext[iprev[j] as usize] = j as u32;
                iprev[inext[j] as usize] = j as u32;
            }
            match frame.cursor {
                Cursor::Forced => continue,
                Cursor::Det(k) => cursor = Cursor::Det(k + 1),
                Cursor::Opt(j, r) => cursor = Cursor::Opt(inext[j as usize], r),
            }
            break;
        }
    };

    let id = |i: u32| op_of(i).id;
    let linearization = if validity == Validity::Valid { stack.iter().map(|f| id(f.op)).collect() } else { Vec::new() };
    let failure = match (validity, best.state) {
        (Validity::Valid, _) | (_, None) => None,
        (_, Some(state)) => Some(Failure {
            prefix: best.prefix.iter().chain(best.extra.iter()).map(|&i| id(i)).collect(),
            state,
            op: id(best.culprit),
            pending: best.pending.iter().filter(|&&i| i != best.culprit).map(|&i| id(i)).collect(),
        }),
    };
    Outcome { validity, states: cache.len() as u64, linearization, failure }
}
