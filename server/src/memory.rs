//! Giving memory back after a big free.
//!
//! `batond` allocates with mimalloc (main.rs). mimalloc returns freed pages
//! to the OS only after a delay, and only when the thread that freed them
//! allocates pages again; a member that built a 144 MB backup for
//! `snapshot save` at a million nodes and then went quiet kept those pages
//! (its RSS stayed 170 MB higher). After each rare, big free (a backup let
//! go, a snapshot installed, a storage batch of 1 MiB or more written) the
//! member calls [`release`], which the binary points at mimalloc's
//! `mi_collect(true)`: a walk of the allocator's free pages, a few
//! milliseconds at most, never on the path of an ordinary request.
//!
//! The library does not choose the allocator (tests and the simulator use
//! the system's), so without [`set_release`] a release does nothing.

use std::sync::OnceLock;

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Sets what [`release`] calls (once, at start; later calls are ignored).
pub fn set_release(f: fn()) {
    let _ = RELEASE.set(f);
}

/// Returns the allocator's free pages to the OS, if the binary said how.
pub fn release() {
    if let Some(f) = RELEASE.get() {
        f();
    }
}
