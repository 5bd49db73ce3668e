//! The command's keeper: a small process between `baton lock`/`elect` and
//! the command, so that nothing run "under the lock" outlives the `baton`
//! that holds it (finding Z3: `kill -9` of `baton`, as the OOM killer
//! does, left `sleep 60` running while another `baton lock` was granted
//! the same lock 2.5 s later).
//!
//! # How
//! `baton` starts `baton __hold GRACE_MS -- COMMAND...` (the same binary)
//! in a process group of its own and keeps the write end of a pipe whose
//! read end the keeper holds as fd 3. The keeper starts COMMAND in that
//! same group and waits for it. When the pipe reaches end-of-file while
//! COMMAND still runs, `baton` is gone however it died (the kernel closes
//! a dead process's descriptors): the keeper sends SIGTERM to the whole
//! group (COMMAND, a shell's children, anything they started that kept
//! the group), then SIGKILL after GRACE (`--grace`), itself included.
//! Otherwise the keeper exits with COMMAND's status (128 + N for signal
//! N), 127 when COMMAND does not exist and 126 when it cannot be run.
//!
//! A death signal (`PR_SET_PDEATHSIG`) would not do: it reaches only the
//! direct child, and it follows the *thread* that spawned it, which under
//! a multi-threaded runtime may end long before the process.
//!
//! The keeper takes SIGINT, SIGTERM and SIGHUP sent to the group (`baton`
//! passes its own on to the group, and stops it so on a loss) with a
//! handler that does nothing: handlers, unlike an ignored disposition, are
//! reset by exec, so COMMAND starts with the default ones.
//!
//! What remains: a process that leaves the group (`setsid`, a daemon that
//! double-forks) is not followed; and `baton` paused (SIGSTOP) keeps the
//! pipe open, so COMMAND runs on past an expiry it cannot see; only a
//! fence checked by the resource stops such a holder (docs/cli.md).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The hidden first argument that makes `baton` the keeper.
pub const ARG: &str = "__hold";

/// The keeper's end of the pipe.
const WATCH_FD: i32 = 3;

/// Set once the keeper saw `baton` die: the group is being stopped.
static STOPPING: AtomicBool = AtomicBool::new(false);

extern "C" fn nothing(_: libc::c_int) {}

/// The keeper process: `args` are what follows [`ARG`].
pub fn main(args: &[String]) -> ! {
    let grace = args.first().and_then(|s| s.parse::<u64>().ok()).map_or(Duration::from_secs(5), Duration::from_millis);
    let command = args.get(2..).unwrap_or_default();
    let Some(program) = command.first() else {
        eprintln!("baton: {ARG} needs GRACE_MS -- COMMAND");
        std::process::exit(2);
    };
    // SAFETY: installing a handler that does nothing, and marking a file
    // descriptor close-on-exec (COMMAND must not hold the pipe).
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(sig, nothing as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
        libc::fcntl(WATCH_FD, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    let child = std::process::Command::new(program).args(&command[1..]).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("baton: cannot run {program:?}: {e}");
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            std::process::exit(code);
        }
    };
    std::thread::spawn(move || watch(grace));
    let status = child.wait();
    if STOPPING.load(Ordering::SeqCst) {
        // The watcher ends the group, this process included.
        loop {
            std::thread::park();
        }
    }
    use std::os::unix::process::ExitStatusExt;
    let code = match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(_) => 1,
    };
    std::process::exit(code)
}

/// Waits for `baton` to go, then stops the group.
fn watch(grace: Duration) {
    // SAFETY: fd 3 is the pipe `baton` set up for this process
    // (`command`); nothing else in this process uses it.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(WATCH_FD) };
    let mut buf = [0u8; 64];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    STOPPING.store(true, Ordering::SeqCst);
    eprintln!("baton: the process holding the lock is gone; stopping the command");
    // SAFETY: signals to this process's own group.
    unsafe {
        let group = libc::getpgrp();
        libc::kill(-group, libc::SIGTERM);
        std::thread::sleep(grace);
        libc::kill(-group, libc::SIGKILL);
    }
}

/// What `baton` keeps while the keeper runs: the pipe's write end (its
/// close, by exit or death, tells the keeper to stop the group).
pub struct Keeper {
    _write: OwnedFd,
}

/// The keeper's command for `command` (spawn it with `process_group(0)`),
/// and what to keep until it ends.
pub fn command(command: &[String], grace: Duration) -> std::io::Result<(tokio::process::Command, Keeper)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened and belong to nobody else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.arg(ARG).arg(grace.as_millis().to_string()).arg("--").args(command);
    // SAFETY: dup2 and fcntl are async-signal-safe; `read` lives in the
    // closure until the command is dropped, so its descriptor is open at
    // exec. dup2 onto another number clears close-on-exec; onto itself it
    // does not, so that case clears it by hand.
    unsafe {
        cmd.pre_exec(move || {
            let raw = read.as_raw_fd();
            let ok = if raw == WATCH_FD {
                libc::fcntl(WATCH_FD, libc::F_SETFD, 0) == 0
            } else {
                libc::dup2(raw, WATCH_FD) == WATCH_FD
            };
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    Ok((cmd, Keeper { _write: write }))
}
