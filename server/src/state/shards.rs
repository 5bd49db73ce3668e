//! The node map, in shards: a path's shard is a fixed hash of it, and each
//! shard is its own hash table, so a growing tree rehashes 1/[`SHARDS`] of
//! the map at a time.
//!
//! One table of a million nodes doubled at 917,504 entries, in one insert:
//! 240 ms alone, 340-430 ms on a loaded member, on every member at the
//! same entry (a driver turn that long delays heartbeats; docs/scaling.md,
//! 2026-12-06). In 64 shards a doubling moves ~14k entries. Order of
//! iteration is unspecified, as a `HashMap`'s is; nothing depends on it.

use std::collections::hash_map::{Entry, HashMap};

/// Shards of the node map.
pub const SHARDS: usize = 64;

/// A `HashMap<String, V>` in [`SHARDS`] tables.
#[derive(Clone, Debug)]
pub struct Sharded<V> {
    shards: Vec<HashMap<String, V>>,
}

impl<V> Default for Sharded<V> {
    fn default() -> Self {
        Sharded { shards: (0..SHARDS).map(|_| HashMap::new()).collect() }
    }
}

/// FNV-1a: cheap, fixed, and spreads paths that differ in any byte.
fn shard_of(key: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h ^ (h >> 32)) as usize % SHARDS
}

impl<V> Sharded<V> {
    pub fn len(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.shards[shard_of(key)].get(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.shards[shard_of(key)].get_mut(key)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.shards[shard_of(key)].contains_key(key)
    }

    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        self.shards[shard_of(&key)].insert(key, value)
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        self.shards[shard_of(key)].remove(key)
    }

    pub fn entry(&mut self, key: String) -> Entry<'_, String, V> {
        self.shards[shard_of(&key)].entry(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.shards.iter().flat_map(HashMap::iter)
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.shards.iter().flat_map(HashMap::keys)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.shards.iter_mut().flat_map(HashMap::values_mut)
    }
}

/// `map[key]`: panics if the key is absent, as a `HashMap`'s index does.
impl<V, Q: AsRef<str> + ?Sized> std::ops::Index<&Q> for Sharded<V> {
    type Output = V;
    fn index(&self, key: &Q) -> &V {
        self.get(key.as_ref()).expect("no entry for this key in the node map")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acts_as_one_map_and_spreads_its_keys() {
        let mut m = Sharded::default();
        for i in 0..10_000 {
            assert_eq!(m.insert(format!("/a/n{i:06}"), i), None);
        }
        assert_eq!(m.insert("/a/n000007".into(), 70), Some(7));
        assert_eq!((m.len(), m.get("/a/n000007"), m.contains_key("/a/none")), (10_000, Some(&70), false));
        *m.get_mut("/a/n000008").expect("present") += 1;
        assert_eq!(m.remove("/a/n000008"), Some(9));
        assert_eq!(m.iter().count(), 9_999);
        assert_eq!(m.keys().filter(|k| k.starts_with("/a/n")).count(), 9_999);
        *m.entry("/b".into()).or_insert(0) += 5;
        assert_eq!(m.get("/b"), Some(&5));
        // Every shard takes a share: none is more than twice the mean.
        let most = m.shards.iter().map(HashMap::len).max().unwrap_or(0);
        assert!(most < 2 * m.len() / SHARDS, "{most} of {} in one shard", m.len());
    }
}
