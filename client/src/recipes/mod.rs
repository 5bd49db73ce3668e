//! Recipes built only from public operations: lock, leader election,
//! read-write lock, semaphore. Each is a queue of ephemeral sequential nodes
//! (`queue.rs`) with a different rule for who holds and whom a waiter
//! watches. Two more follow a subtree or an election: a tree cache
//! ([`cache`]) and a leader selector ([`selector`]). See docs/recipes.md
//! for what each guarantees and what it does not.

pub mod cache;
pub mod election;
pub mod lock;
pub(crate) mod queue;
pub mod rwlock;
pub mod selector;
pub mod semaphore;

pub use cache::{CacheEvent, CachedNode, TreeCache};
pub use election::{Election, LeaderInfo, Leadership, Observer};
pub use lock::{LockGuard, Mutex};
pub use queue::RECIPE_ROOT;
pub use rwlock::{RwGuard, RwLock};
pub use selector::{LeaderSelector, LeaderTerm};
pub use semaphore::{Permit, Semaphore};
