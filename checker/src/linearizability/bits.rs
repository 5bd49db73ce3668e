//! The search's bookkeeping: [`Bits`], the set of linearized operations
//! (the cache key), and [`FxHasher`], a fast hasher for the cache (the
//! keys are the search's own, not an adversary's).

use std::hash::{BuildHasherDefault, Hasher};

/// A fast, non-cryptographic hasher (FxHash's multiply-rotate).
#[derive(Default)]
pub(super) struct FxHasher(u64);

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

pub(super) type FxBuild = BuildHasherDefault<FxHasher>;

/// The set of linearized operations: determinate ops occupy the first
/// `det_words` words (numbered in call order, so the set is mostly a prefix),
/// indeterminate ops the rest.
pub(super) struct Bits {
    words: Vec<u64>,
    det_words: usize,
    d: usize,
}

impl Bits {
    pub(super) fn new(d: usize, m: usize) -> Bits {
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
    pub(super) fn set(&mut self, i: u32) {
        let (w, m) = self.slot(i);
        self.words[w] |= m;
    }
    #[inline]
    pub(super) fn clear(&mut self, i: u32) {
        let (w, m) = self.slot(i);
        self.words[w] &= !m;
    }
    #[inline]
    pub(super) fn get(&self, i: u32) -> bool {
        let (w, m) = self.slot(i);
        self.words[w] & m != 0
    }
    /// A compact, exact encoding: the count of leading all-ones determinate
    /// words, the determinate window up to its last non-zero word, and the
    /// indeterminate words.
    pub(super) fn key(&self) -> Box<[u64]> {
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
