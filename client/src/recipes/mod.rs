//! Recipes built only from public operations: lock, leader election,
//! read-write lock, semaphore. Each is a queue of ephemeral sequential nodes
//! ([`queue`]) with a different rule for who holds and whom a waiter watches.
//! See docs/recipes.md for what each guarantees and what it does not.

pub mod election;
pub mod lock;
pub(crate) mod queue;
pub mod rwlock;
pub mod semaphore;

pub use election::{LeaderInfo, Leadership, Observer};
pub use lock::LockGuard;
pub use queue::RECIPE_ROOT;
pub use rwlock::RwGuard;
pub use semaphore::Permit;
