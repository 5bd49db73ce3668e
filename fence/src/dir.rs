//! A directory of files, fenced: each resource is one file `NAME`, replaced
//! whole by a fenced write.
//!
//! A write of `NAME` with token `t`, in this order:
//! 1. take an exclusive `flock` on `.NAME.lock` (made once, never
//!    replaced, so every writer locks the same inode; the kernel drops the
//!    lock when a writer dies);
//! 2. read `.NAME.fence`, the highest token accepted; if it is above `t`,
//!    refuse ([`FenceError::Stale`]) and change nothing;
//! 3. if `t` is new, write it to a temporary file, fsync, rename it over
//!    `.NAME.fence`, fsync the directory: the token is durable before any
//!    data it admits, so a crash after this step leaves an old file with a
//!    newer token (which refuses nothing it should not), never new data
//!    with an older token;
//! 4. write the data to a temporary file, fsync, rename it over `NAME`,
//!    fsync the directory; release the lock.
//!
//! A reader sees either the old or the new file, never a torn one. Writers
//! must all use this module (or the same protocol); a program that writes
//! `NAME` directly bypasses the fence. Blocking I/O: call it from
//! `spawn_blocking` in async code.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::{parse_token, FenceError};

/// A fenced directory.
#[derive(Debug, Clone)]
pub struct DirFence {
    dir: PathBuf,
}

impl DirFence {
    /// Opens `dir`, creating it if missing.
    pub fn open(dir: impl Into<PathBuf>) -> Result<DirFence, FenceError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(DirFence { dir })
    }

    /// Replaces `name`'s content with `data` if `token` is not stale (the
    /// module doc has the steps).
    pub fn write(&self, name: &str, token: u64, data: &[u8]) -> Result<(), FenceError> {
        check_name(name)?;
        let lock =
            OpenOptions::new().create(true).truncate(false).write(true).open(self.path(&format!(".{name}.lock")))?;
        let _held = Flock::exclusive(&lock)?;
        if let Some(current) = self.read_token(name)? {
            if current > token {
                return Err(FenceError::Stale { resource: name.to_string(), token, current });
            }
            if current == token {
                return self.replace(name, data);
            }
        }
        self.replace(&format!(".{name}.fence"), token.to_string().as_bytes())?;
        self.replace(name, data)
    }

    /// `name`'s content; None if it was never written.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, FenceError> {
        check_name(name)?;
        read_opt(&self.path(name))
    }

    /// The highest token `name` has accepted; None if none.
    pub fn current(&self, name: &str) -> Result<Option<u64>, FenceError> {
        check_name(name)?;
        self.read_token(name)
    }

    fn read_token(&self, name: &str) -> Result<Option<u64>, FenceError> {
        match read_opt(&self.path(&format!(".{name}.fence")))? {
            None => Ok(None),
            Some(b) => parse_token(name, &String::from_utf8_lossy(&b)).map(Some),
        }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Write-then-rename, both synced (step 3 and 4 of the module doc).
    fn replace(&self, file: &str, data: &[u8]) -> Result<(), FenceError> {
        let tmp = self.path(&format!(".{file}.tmp-{}", std::process::id()));
        let mut f = File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, self.path(file))?;
        sync_dir(&self.dir)?;
        Ok(())
    }
}

/// A resource name is one plain file name: not empty, no `/`, no NUL, not
/// starting with `.` (the fence's own files do), at most 200 bytes.
fn check_name(name: &str) -> Result<(), FenceError> {
    if name.is_empty() || name.len() > 200 || name.starts_with('.') || name.contains(['/', '\0']) {
        return Err(FenceError::Invalid(format!(
            "{name:?} is not a resource file name (1-200 bytes, no '/', not starting with '.')"
        )));
    }
    Ok(())
}

fn read_opt(path: &Path) -> Result<Option<Vec<u8>>, FenceError> {
    match File::open(path) {
        Ok(mut f) => {
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)?;
            Ok(Some(buf))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// An exclusive `flock`, released when dropped (and by the kernel when the
/// process dies).
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    fn exclusive(f: &'a File) -> std::io::Result<Flock<'a>> {
        loop {
            // SAFETY: flock(2) on an open descriptor this borrow keeps open.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Flock(f));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: as above; unlocking a lock this value took.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_one_plain_file_are_refused() {
        for bad in ["", ".hidden", "a/b", "../x", "nul\0", &"x".repeat(201)] {
            assert!(matches!(check_name(bad), Err(FenceError::Invalid(_))), "{bad:?}");
        }
        check_name("stock-42.json").expect("a plain name");
    }
}
