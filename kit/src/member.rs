//! One member: its spec (the `batond` command line) and its process.
//!
//! A [`Process`] owns its child: dropping it kills the child (SIGCONT
//! first, so a paused one dies at once) and reaps it. Its output goes to
//! the member's log file, appended to across restarts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How a member finds its cluster.
#[derive(Debug, Clone)]
pub enum Join {
    /// A founding member: `--peers=<id=addr,...>` (itself included).
    Peers(String),
    /// Added to a running cluster (after `member add`): `--join=<...>`.
    Join(String),
}

/// Everything `batond` is started with.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    pub id: u64,
    pub data_dir: PathBuf,
    /// stdout and stderr, appended to.
    pub log: PathBuf,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    /// `--http-addr` (/metrics, /health, /ready); None: not served.
    pub http_addr: Option<SocketAddr>,
    pub join: Join,
    /// TLS file flags (`--cert`, `--peer-ca`, ...), made by the caller.
    pub tls_args: Vec<String>,
    /// Any other flags.
    pub extra: Vec<String>,
    /// Environment for the process (`RUST_LOG`, ...).
    pub env: Vec<(String, String)>,
}

impl MemberSpec {
    /// The `batond` arguments.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--id={}", self.id),
            format!("--data-dir={}", self.data_dir.display()),
            format!("--client-addr={}", self.client_addr),
            format!("--peer-addr={}", self.peer_addr),
        ];
        a.extend(self.http_addr.map(|h| format!("--http-addr={h}")));
        a.push(match &self.join {
            Join::Peers(p) => format!("--peers={p}"),
            Join::Join(p) => format!("--join={p}"),
        });
        a.extend(self.tls_args.iter().cloned());
        a.extend(self.extra.iter().cloned());
        a
    }

    /// Starts `bin` with this spec, output to the log file.
    pub fn start(&self, bin: &Path) -> anyhow::Result<Process> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("log file {}", self.log.display()))?;
        let child = Command::new(bin)
            .args(self.args())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting member {} ({})", self.id, bin.display()))?;
        Ok(Process { child: Some(child), paused: false })
    }
}

/// A running (or exited, not yet reaped) member process.
pub struct Process {
    /// None once reaped.
    child: Option<Child>,
    /// SIGSTOPped and not resumed since.
    paused: bool,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
            }
        }
    }

    /// SIGSTOP, and wait (at most 1 s) until every thread of the process
    /// is stopped: kill(2) returns once the signal is sent, not once it
    /// took effect, and a busy member could still read and forward a
    /// request sent right after (zookeeper/t22 saw it in CI).
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.paused = true;
        if self.child.is_some() {
            wait_stopped(self.pid(), std::time::Duration::from_secs(1));
        }
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.paused = false;
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The exit code once the process has exited (-1: killed by a signal).
    pub fn exit_code(&mut self) -> Option<i32> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status.code().unwrap_or(-1))
    }

    /// Sends SIGTERM (a clean stop); [`Process::wait`] for it.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Waits until `deadline` for the process to exit, then kills it.
    pub fn wait(mut self, deadline: Instant) {
        while Instant::now() < deadline {
            if !matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within `bound`.
    pub fn stop(self, bound: Duration) {
        self.terminate();
        self.wait(Instant::now() + bound);
    }

    /// kill -9, and reap it.
    pub fn kill(self) {}
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.paused = false;
            // SAFETY: resume a possibly stopped child so SIGKILL is reaped fast.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGCONT);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// SIGTERM every process at once, then wait up to `bound` in all and
/// SIGKILL what is left.
pub fn stop_all(procs: impl IntoIterator<Item = Process>, bound: Duration) {
    let procs: Vec<Process> = procs.into_iter().collect();
    procs.iter().for_each(Process::terminate);
    let deadline = Instant::now() + bound;
    procs.into_iter().for_each(|p| p.wait(deadline));
}

/// Waits until every thread of process `pid` is stopped (or gone), at most
/// `limit`.
fn wait_stopped(pid: u32, limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
        if tasks.flatten().all(|t| matches!(thread_state(&t.path()), None | Some('T' | 't' | 'Z' | 'X'))) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A thread's state letter from `/proc/PID/task/TID/stat` (after its
/// command name, which may hold spaces and parentheses).
fn thread_state(task: &std::path::Path) -> Option<char> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_name_every_address_and_the_join_mode() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let mut m = MemberSpec {
            id: 4,
            data_dir: "/d/member-4".into(),
            log: "/d/member-4.log".into(),
            client_addr: a("127.0.0.1:1"),
            peer_addr: a("127.0.0.1:2"),
            http_addr: None,
            join: Join::Join("1=127.0.0.1:5".into()),
            tls_args: vec!["--cert=c".into()],
            extra: vec!["--tick-ms=50".into()],
            env: Vec::new(),
        };
        let want = [
            "--id=4",
            "--data-dir=/d/member-4",
            "--client-addr=127.0.0.1:1",
            "--peer-addr=127.0.0.1:2",
            "--join=1=127.0.0.1:5",
            "--cert=c",
            "--tick-ms=50",
        ];
        assert_eq!(m.args(), want);
        m.http_addr = Some(a("127.0.0.1:3"));
        m.join = Join::Peers("4=127.0.0.1:2".into());
        assert!(m.args().contains(&"--http-addr=127.0.0.1:3".to_string()));
        assert!(m.args().contains(&"--peers=4=127.0.0.1:2".to_string()));
    }
}
