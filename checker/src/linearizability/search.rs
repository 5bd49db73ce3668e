//! The WGL search of one object's operations ([`Search`]), as the module
//! doc of [`super`] describes it.
//!
//! Operations are numbered internally: the determinate ones `0..d` by call
//! time, then the indeterminate ones `d..d+m` by call time. The search walks
//! configurations depth first. Each configuration on the path is a *level*
//! with its own determinate candidates; each lifted operation is a
//! [`Frame`] on the path, which says how to resume its parent's scan.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use super::bits::{Bits, FxBuild};
use super::{CheckOptions, Failure, Model, Operation, Outcome};
use crate::verdict::Validity;

/// No node, no operation.
const NIL: u32 = u32::MAX;

/// Indeterminate operations listed at most as pending in a [`Failure`].
const MAX_PENDING_INDETERMINATE: usize = 32;

/// The WGL search over one object's operations. [`Search::run`] consumes
/// it; [`super::check_operations`] is the usual entry point.
pub struct Search<'a, M: Model> {
    ops: &'a [Operation<M::In, M::Out>],
    max_states: u64,
    /// Internal number -> index into `ops`.
    orig: Vec<usize>,
    /// Determinate operations (`0..d` internally).
    d: usize,
    det: DetList,
    opt: OptList,
    /// Per indeterminate operation (`k` for internal `d + k`): the previous
    /// one in call order with an equal input (NIL: none). Only the earliest
    /// pending one of such equals is tried.
    prev_same: Vec<u32>,
    classes: Classes,
    /// The linearized operations on the path.
    bits: Bits,
    /// Configurations (linearized set, state) explored.
    cache: HashSet<(Box<[u64]>, M), FxBuild>,
    /// The path: one frame per lifted operation.
    stack: Vec<Frame<M>>,
    /// The model after the path.
    state: M,
    best: Best<M>,
    /// The levels' determinate candidates (the calls before the first
    /// return, ordered by return so that short operations are tried before
    /// long ones), level after level; `level_start` says where each begins.
    cands: Vec<u32>,
    level_start: Vec<usize>,
    /// Each level's first return node.
    level_ret: Vec<u32>,
    /// Where the scan of the current configuration stands.
    cursor: Cursor,
    /// The current configuration is new: not yet scanned.
    fresh: bool,
}

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

/// What one step of the search did.
enum Step {
    /// Go on: an operation was lifted (a new configuration to enter), a
    /// candidate was passed over, or the scan moved on to the indeterminate
    /// candidates.
    On,
    /// Nothing more can be taken in this configuration: backtrack. With the
    /// return node not got past (a dead end to note), or None (the
    /// configuration was explored before: nothing to note).
    Back(Option<u32>),
    /// The state budget ran out.
    GaveUp,
}

impl<'a, M: Model> Search<'a, M> {
    /// A search of `ops` from `initial`; only `opts.max_states` is used.
    pub fn new(initial: &M, ops: &'a [Operation<M::In, M::Out>], opts: &CheckOptions) -> Self {
        let mut det: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].ret != u64::MAX).collect();
        let mut opt: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].ret == u64::MAX).collect();
        det.sort_by_key(|&i| (ops[i].call, i));
        opt.sort_by_key(|&i| (ops[i].call, i));
        let (d, m) = (det.len(), opt.len());
        let events = events(ops, &det, &opt);
        let det_list = DetList::new(&events, d);
        let classes = Classes::new(ops, &det, &det_list);
        Search {
            ops,
            max_states: opts.max_states,
            orig: det.iter().chain(opt.iter()).copied().collect(),
            d,
            det: det_list,
            opt: OptList::new(&events, d, m),
            prev_same: prev_same(ops, &opt, d),
            classes,
            bits: Bits::new(d, m),
            cache: HashSet::default(),
            stack: Vec::new(),
            state: initial.clone(),
            best: Best::new(),
            cands: Vec::new(),
            level_start: Vec::new(),
            level_ret: Vec::new(),
            cursor: Cursor::Det(0),
            fresh: true,
        }
    }

    /// Searches until every determinate operation is linearized (valid),
    /// no alternative is left (invalid) or the budget runs out (unknown).
    pub fn run(mut self) -> Outcome<M> {
        let validity = loop {
            if self.det.is_empty() {
                break Validity::Valid;
            }
            let step = if self.fresh { self.enter() } else { self.next_candidate() };
            match step {
                Step::On => {}
                Step::GaveUp => break Validity::Unknown,
                Step::Back(dead) => {
                    if let Some(r) = dead {
                        self.note_dead_end(r);
                    }
                    if !self.backtrack() {
                        break Validity::Invalid;
                    }
                }
            }
        };
        self.outcome(validity)
    }

    fn op(&self, i: u32) -> &'a Operation<M::In, M::Out> {
        &self.ops[self.orig[i as usize]]
    }

    /// Op `i` applied to `s` (None: it cannot take effect there).
    fn apply(&self, s: &M, i: u32) -> Option<M> {
        let op = self.op(i);
        match &op.output {
            Some(o) => s.step(&op.input, o),
            None => s.step_unknown(&op.input),
        }
    }

    /// Enters a new configuration: a new level with its determinate
    /// candidates. One that leaves the state unchanged (a read that sees
    /// the current value) is lifted at once without alternatives: moving it
    /// to the front of any completion keeps the completion valid. Else the
    /// candidates are ordered by return and the scan starts.
    fn enter(&mut self) -> Step {
        self.fresh = false;
        let start = self.cands.len();
        self.level_start.push(start);
        let mut c = self.det.first();
        while self.det.is_call[c as usize] {
            self.cands.push(c);
            c = self.det.next[c as usize];
        }
        self.level_ret.push(c);
        for k in start..self.cands.len() {
            let e = self.cands[k];
            let i = self.det.op[e as usize];
            if self.apply(&self.state, i).is_some_and(|ns| ns == self.state) {
                return self.lift(i, e, Cursor::Forced, self.state.clone()).unwrap_or(Step::Back(None));
            }
        }
        let det = &self.det;
        self.cands[start..].sort_unstable_by_key(|&c| det.return_pos(c));
        self.cursor = Cursor::Det(start);
        Step::On
    }

    /// Tries the current configuration's next candidate: determinate ones
    /// first, then indeterminate ones called before the first return.
    fn next_candidate(&mut self) -> Step {
        let first_ret = *self.level_ret.last().expect("a level per configuration");
        match self.cursor {
            Cursor::Det(k) if k < self.cands.len() => {
                self.cursor = Cursor::Det(k + 1);
                self.try_determinate(k, first_ret)
            }
            Cursor::Det(_) => {
                if self.opt.len > 0 && self.blocker(&self.state, NIL).is_none() {
                    self.cursor = Cursor::Opt(self.opt.first(), first_ret);
                    Step::On
                } else {
                    Step::Back(Some(first_ret))
                }
            }
            Cursor::Opt(j, r) => self.try_indeterminate(j, r),
            Cursor::Forced => unreachable!("forced frames are never resumed"),
        }
    }

    /// Tries determinate candidate `cands[k]`.
    fn try_determinate(&mut self, k: usize, first_ret: u32) -> Step {
        let e = self.cands[k];
        let i = self.det.op[e as usize];
        if let Some(h) = self.classes.earliest_pending(i, &self.bits) {
            // Skip i if an equal op returning earlier is also a candidate.
            if h != i && self.det.call_pos(h) < self.det.pos[first_ret as usize] {
                return Step::On;
            }
        }
        let Some(ns) = self.apply(&self.state, i) else { return Step::On };
        self.take(i, e, Cursor::Det(k), ns)
    }

    /// Tries indeterminate candidate `j` (a node of the indeterminate
    /// list), if it was called before return node `r`.
    fn try_indeterminate(&mut self, j: u32, r: u32) -> Step {
        if j == self.opt.tail() || self.opt.pos[j as usize] > self.det.pos[r as usize] {
            return Step::Back(Some(r));
        }
        self.cursor = Cursor::Opt(self.opt.next[j as usize], r);
        let i = self.opt.op(j);
        let ps = self.prev_same[j as usize - 1];
        if ps != NIL && !self.bits.get(ps) {
            return Step::On; // an equal, earlier op is pending
        }
        // A lift that changes nothing is pointless: the op may equally stay
        // pending forever.
        let Some(ns) = self.apply(&self.state, i).filter(|ns| *ns != self.state) else { return Step::On };
        self.take(i, j, Cursor::Opt(j, r), ns)
    }

    /// Takes candidate `i` into state `ns` ([`Search::lift`]), unless that
    /// would strand a pending determinate operation.
    fn take(&mut self, i: u32, node: u32, cursor: Cursor, ns: M) -> Step {
        if let Some(x) = self.blocker(&ns, i) {
            // Taking i would strand x: i is linearizable here, x is the op
            // that cannot follow.
            if self.best.wants(self.stack.len() + 1) {
                self.note(Some(i), ns, x);
            }
            return Step::On;
        }
        self.lift(i, node, cursor, ns).unwrap_or(Step::On)
    }

    /// Lifts op `i` (`node`: its call node, or its indeterminate-list node)
    /// into state `ns`; the current configuration resumes at `cursor` when
    /// the search comes back. None: the configuration it leads to was
    /// explored before (nothing changed).
    fn lift(&mut self, i: u32, node: u32, cursor: Cursor, ns: M) -> Option<Step> {
        self.bits.set(i);
        if !self.cache.insert((self.bits.key(), ns.clone())) {
            self.bits.clear(i);
            return None;
        }
        let prev = std::mem::replace(&mut self.state, ns);
        self.stack.push(Frame { cursor, op: i, node, prev });
        if (i as usize) < self.d {
            self.det.lift(node);
        } else {
            self.opt.lift(node);
        }
        if self.cache.len() as u64 > self.max_states {
            return Some(Step::GaveUp);
        }
        self.fresh = true;
        Some(Step::On)
    }

    /// The first pending determinate operation in the window (the calls up
    /// to and including the first return, skipping op `skip`) that can no
    /// longer be linearized from `s` according to [`Model::still_possible`].
    /// An indeterminate `skip` skips nothing.
    fn blocker(&self, s: &M, skip: u32) -> Option<u32> {
        let mut c = self.det.first();
        loop {
            let i = self.det.op[c as usize];
            if i == NIL {
                return None; // tail
            }
            if i != skip {
                let o = self.op(i);
                if !s.still_possible(&o.input, o.output.as_ref()) {
                    return Some(i);
                }
                if !self.det.is_call[c as usize] {
                    return None;
                }
            }
            c = self.det.next[c as usize];
        }
    }

    /// A dead end at return node `r`: noted if it is the deepest yet.
    fn note_dead_end(&mut self, r: u32) {
        if self.best.wants(self.stack.len()) {
            let culprit = self.det.op[r as usize];
            self.note(None, self.state.clone(), culprit);
        }
    }

    /// Notes for the report that after the path (and `extra`, lifted last)
    /// the model is at `s` and op `culprit` can no longer be linearized,
    /// with the operations then pending.
    fn note(&mut self, extra: Option<u32>, s: M, culprit: u32) {
        let skip = extra.unwrap_or(NIL);
        let (mut pending, end) = self.det.window_calls(skip);
        debug_assert!(extra.is_some() || self.det.op[end as usize] == culprit);
        pending.extend(self.opt.called_before(self.det.pos[end as usize]).into_iter().filter(|&o| o != skip));
        self.best.record(&self.stack, extra, s, culprit, pending);
    }

    /// Backtracks to the last configuration with alternatives left (past
    /// forced frames: they have none). False when there is none: every
    /// order was tried.
    fn backtrack(&mut self) -> bool {
        loop {
            self.cands.truncate(self.level_start.pop().expect("a level per configuration"));
            self.level_ret.pop();
            let Some(frame) = self.stack.pop() else { return false };
            self.best.stable = self.best.stable.min(self.stack.len());
            self.state = frame.prev;
            self.bits.clear(frame.op);
            if (frame.op as usize) < self.d {
                self.classes.unlifted(frame.op);
                self.det.unlift(frame.node);
            } else {
                self.opt.unlift(frame.node);
            }
            self.cursor = match frame.cursor {
                Cursor::Forced => continue,
                Cursor::Det(k) => Cursor::Det(k + 1),
                Cursor::Opt(j, r) => Cursor::Opt(self.opt.next[j as usize], r),
            };
            return true;
        }
    }

    fn outcome(mut self, validity: Validity) -> Outcome<M> {
        let best_state = self.best.state.take();
        let id = |i: u32| self.op(i).id;
        let linearization =
            if validity == Validity::Valid { self.stack.iter().map(|f| id(f.op)).collect() } else { Vec::new() };
        let failure = match (validity, best_state) {
            (Validity::Valid, _) | (_, None) => None,
            (_, Some(state)) => Some(Failure {
                prefix: self.best.prefix.iter().chain(self.best.extra.iter()).map(|&i| id(i)).collect(),
                state,
                op: id(self.best.culprit),
                pending: self.best.pending.iter().filter(|&&i| i != self.best.culprit).map(|&i| id(i)).collect(),
            }),
        };
        Outcome { validity, states: self.cache.len() as u64, linearization, failure }
    }
}

/// Every call, and every determinate return, in time order: (time, call 0
/// before return 1, internal op). A call sorts before a return at the same
/// instant, so touching operations count as concurrent.
fn events<I, O>(ops: &[Operation<I, O>], det: &[usize], opt: &[usize]) -> Vec<(u64, u8, u32)> {
    let d = det.len();
    let mut events: Vec<(u64, u8, u32)> = Vec::with_capacity(2 * d + opt.len());
    for (k, &i) in det.iter().enumerate() {
        events.push((ops[i].call, 0, k as u32));
        events.push((ops[i].ret.max(ops[i].call), 1, k as u32));
    }
    for (k, &i) in opt.iter().enumerate() {
        events.push((ops[i].call, 0, (d + k) as u32));
    }
    events.sort_unstable();
    events
}

/// Per indeterminate op (`k`: internal `d + k`), the previous one in call
/// order with an equal input.
fn prev_same<I: Eq + Hash, O>(ops: &[Operation<I, O>], opt: &[usize], d: usize) -> Vec<u32> {
    let mut prev = vec![NIL; opt.len()];
    let mut last: HashMap<&I, u32> = HashMap::new();
    for (k, &i) in opt.iter().enumerate() {
        if let Some(p) = last.insert(&ops[i].input, (d + k) as u32) {
            prev[k] = p;
        }
    }
    prev
}

/// The determinate operations' calls and returns in time order, as a
/// doubly linked list: node 0 is the head, 1..=2d the entries, 2d+1 the
/// tail. Lifting an operation unlinks its two nodes; unlifting puts them
/// back (dancing links).
struct DetList {
    next: Vec<u32>,
    prev: Vec<u32>,
    /// Each node's operation (NIL: head and tail).
    op: Vec<u32>,
    /// Whether a node is a call (else a return, the head or the tail).
    is_call: Vec<bool>,
    /// Each node's position among all events.
    pos: Vec<u32>,
    /// A call node's return node.
    ret_of: Vec<u32>,
    /// Each operation's call node.
    call_of: Vec<u32>,
}

impl DetList {
    const HEAD: usize = 0;

    fn new(events: &[(u64, u8, u32)], d: usize) -> DetList {
        let nodes = 2 * d + 2;
        let mut l = DetList {
            next: (1..=nodes as u32).collect(),
            prev: (0..nodes as u32).map(|i| i.wrapping_sub(1)).collect(),
            op: vec![NIL; nodes],
            is_call: vec![false; nodes],
            pos: vec![0; nodes],
            ret_of: vec![NIL; nodes],
            call_of: vec![NIL; d],
        };
        l.next[nodes - 1] = NIL;
        l.prev[Self::HEAD] = NIL;
        let determinate = events.iter().enumerate().filter(|(_, e)| (e.2 as usize) < d);
        // Entries are nodes 1..=2d, in event order.
        for (node, (pos, &(_, kind, i))) in (1usize..).zip(determinate) {
            l.op[node] = i;
            l.is_call[node] = kind == 0;
            l.pos[node] = pos as u32;
            if kind == 0 {
                l.call_of[i as usize] = node as u32;
            } else {
                l.ret_of[l.call_of[i as usize] as usize] = node as u32;
            }
        }
        l
    }

    fn first(&self) -> u32 {
        self.next[Self::HEAD]
    }

    /// Every determinate operation is lifted.
    fn is_empty(&self) -> bool {
        self.first() as usize == self.next.len() - 1
    }

    /// Position of call node `c`'s return.
    fn return_pos(&self, c: u32) -> u32 {
        self.pos[self.ret_of[c as usize] as usize]
    }

    /// Position of op `i`'s call.
    fn call_pos(&self, i: u32) -> u32 {
        self.pos[self.call_of[i as usize] as usize]
    }

    /// Unlinks call node `e` and its return.
    fn lift(&mut self, e: u32) {
        let e = e as usize;
        let r = self.ret_of[e] as usize;
        self.next[self.prev[e] as usize] = self.next[e];
        self.prev[self.next[e] as usize] = self.prev[e];
        self.next[self.prev[r] as usize] = self.next[r];
        self.prev[self.next[r] as usize] = self.prev[r];
    }

    /// Relinks call node `e`'s return, then `e`.
    fn unlift(&mut self, e: u32) {
        let e = e as usize;
        let r = self.ret_of[e] as usize;
        self.next[self.prev[r] as usize] = r as u32;
        self.prev[self.next[r] as usize] = r as u32;
        self.next[self.prev[e] as usize] = e as u32;
        self.prev[self.next[e] as usize] = e as u32;
    }

    /// The operations called before the first return (of an op other than
    /// `skip`), excluding `skip`, and that return node.
    fn window_calls(&self, skip: u32) -> (Vec<u32>, u32) {
        let mut calls = Vec::new();
        let mut c = self.first();
        loop {
            let i = self.op[c as usize];
            if i == NIL || (!self.is_call[c as usize] && i != skip) {
                return (calls, c);
            }
            if self.is_call[c as usize] && i != skip {
                calls.push(i);
            }
            c = self.next[c as usize];
        }
    }
}

/// The indeterminate operations' calls in time order, as a doubly linked
/// list: node 0 is the head, `k + 1` op `d + k`, `m + 1` the tail.
struct OptList {
    next: Vec<u32>,
    prev: Vec<u32>,
    /// Each node's position among all events.
    pos: Vec<u32>,
    /// Indeterminate operations (`m`).
    len: usize,
    /// Internal number of the first (`d`).
    base: u32,
}

impl OptList {
    const HEAD: usize = 0;

    fn new(events: &[(u64, u8, u32)], d: usize, m: usize) -> OptList {
        let mut l = OptList {
            next: (1..=(m + 2) as u32).collect(),
            prev: (0..(m + 2) as u32).map(|i| i.wrapping_sub(1)).collect(),
            pos: vec![0; m + 2],
            len: m,
            base: d as u32,
        };
        l.next[m + 1] = NIL;
        l.prev[Self::HEAD] = NIL;
        for (pos, &(_, _, i)) in events.iter().enumerate().filter(|(_, e)| (e.2 as usize) >= d) {
            l.pos[i as usize - d + 1] = pos as u32;
        }
        l
    }

    fn first(&self) -> u32 {
        self.next[Self::HEAD]
    }

    fn tail(&self) -> u32 {
        (self.len + 1) as u32
    }

    /// The internal number of node `j`'s operation.
    fn op(&self, j: u32) -> u32 {
        self.base + j - 1
    }

    fn lift(&mut self, j: u32) {
        let j = j as usize;
        self.next[self.prev[j] as usize] = self.next[j];
        self.prev[self.next[j] as usize] = self.prev[j];
    }

    fn unlift(&mut self, j: u32) {
        let j = j as usize;
        self.next[self.prev[j] as usize] = j as u32;
        self.prev[self.next[j] as usize] = j as u32;
    }

    /// Pending operations called before event position `pos` (at most
    /// [`MAX_PENDING_INDETERMINATE`]), for reports.
    fn called_before(&self, pos: u32) -> Vec<u32> {
        let mut v = Vec::new();
        let mut c = self.first();
        while c != self.tail() && self.pos[c as usize] < pos && v.len() < MAX_PENDING_INDETERMINATE {
            v.push(self.op(c));
            c = self.next[c as usize];
        }
        v
    }
}

/// Determinate operations with equal input and output are interchangeable:
/// of two such pending candidates, the one returning first can always take
/// effect first (swap them in any linearization), so only it is tried.
/// Classes of at least two members, each sorted by return.
struct Classes {
    /// Each determinate op's class (NIL: none).
    of: Vec<u32>,
    members: Vec<Vec<u32>>,
    /// Each determinate op's place in its class.
    idx: Vec<u32>,
    /// `members[c][..start[c]]` are all linearized.
    start: Vec<u32>,
}

impl Classes {
    fn new<I: Eq + Hash, O: Eq + Hash>(ops: &[Operation<I, O>], det: &[usize], list: &DetList) -> Classes {
        let d = det.len();
        let mut of = vec![NIL; d];
        let mut members: Vec<Vec<u32>> = Vec::new();
        let mut classes: HashMap<(&I, &Option<O>), Vec<u32>> = HashMap::new();
        for (k, &i) in det.iter().enumerate() {
            classes.entry((&ops[i].input, &ops[i].output)).or_default().push(k as u32);
        }
        for (_, mut class) in classes.into_iter().filter(|(_, v)| v.len() > 1) {
            class.sort_by_key(|&k| list.return_pos(list.call_of[k as usize]));
            for &k in &class {
                of[k as usize] = members.len() as u32;
            }
            members.push(class);
        }
        let mut idx = vec![0u32; d];
        for class in &members {
            for (x, &k) in class.iter().enumerate() {
                idx[k as usize] = x as u32;
            }
        }
        let start = vec![0u32; members.len()];
        Classes { of, members, idx, start }
    }

    /// If op `i` has a class: its earliest-returning member not linearized.
    fn earliest_pending(&mut self, i: u32, bits: &Bits) -> Option<u32> {
        let c = self.of[i as usize];
        if c == NIL {
            return None;
        }
        let members = &self.members[c as usize];
        let mut x = self.start[c as usize] as usize;
        while bits.get(members[x]) {
            x += 1;
        }
        self.start[c as usize] = x as u32;
        Some(members[x])
    }

    /// Op `i` was unlifted: its class's pending members may start earlier.
    fn unlifted(&mut self, i: u32) {
        let c = self.of[i as usize];
        if c != NIL {
            let c = c as usize;
            self.start[c] = self.start[c].min(self.idx[i as usize]);
        }
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

impl<M> Best<M> {
    fn new() -> Self {
        Best { depth: None, prefix: Vec::new(), stable: 0, extra: None, state: None, culprit: NIL, pending: Vec::new() }
    }
    fn wants(&self, depth: usize) -> bool {
        self.depth.is_none_or(|d| depth > d)
    }
    fn record(&mut self, stack: &[Frame<M>], extra: Option<u32>, state: M, culprit: u32, pending: Vec<u32>) {
        self.prefix.truncate(self.stable);
        self.prefix.extend(stack[self.stable..].iter().map(|f| f.op));
        self.stable = stack.len();
        self.depth = Some(stack.len() + extra.is_some() as usize);
        self.extra = extra;
        self.state = Some(state);
        self.culprit = culprit;
        self.pending = pending;
    }
}
