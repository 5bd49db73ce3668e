//! What the harness's and the benchmark's command lines share
//! (`baton-jepsen`, and `baton-bench` in `bench/`): the process's set-up
//! and exit ([`run`]), Ctrl-C ([`interruptible`]), a test's verdict as an
//! exit code ([`verdict`]) and the time stamp of default output folders.
//!
//! Exit codes, for every subcommand of both: 0 valid (or done), 1
//! invalid, 2 unknown, a harness error or bad arguments.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use baton_checker::Validity;

/// Logs to stderr, runs `main` on a 2-thread runtime and exits the process
/// with its code. `prog` prefixes the one error this can print.
pub fn run<F: Future<Output = i32>>(prog: &str, main: F) -> ! {
    let _ = tracing_subscriber::fmt()
        // The ZooKeeper client warns on every failed reconnection, which a
        // nemesis causes by the hundred: its warnings are not the run's.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,zookeeper_client=error".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{prog}: {e}");
            std::process::exit(2);
        }
    };
    let code = rt.block_on(main);
    rt.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code);
}

/// Runs `f` to its end, or until Ctrl-C (then the error "interrupted";
/// whatever `f` owns, clusters included, is dropped and torn down).
pub async fn interruptible<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::select! {
        r = f => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    }
}

/// Prints a test's last lines and maps its verdict to the exit code
/// (0 valid, 1 invalid, 2 unknown or harness error).
pub fn verdict(prog: &str, r: anyhow::Result<Validity>, out: &Path) -> i32 {
    match r {
        Ok(v) => {
            println!("results in {}", out.display());
            println!("valid: {}", v.as_str());
            match v {
                Validity::Valid => 0,
                Validity::Invalid => 1,
                Validity::Unknown => 2,
            }
        }
        Err(e) => {
            eprintln!("{prog}: harness error: {e:#}");
            println!("valid: unknown");
            2
        }
    }
}

/// Seconds since the Unix epoch: the default output folders' stamp.
pub fn stamp() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
