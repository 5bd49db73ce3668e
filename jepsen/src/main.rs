//! `baton-jepsen`: the harness's command line.

use std::path::PathBuf;
use std::time::Duration;

use baton_jepsen::nemesis::NemesisKind;
use baton_jepsen::runner::{run_test, TestOpts};
use baton_jepsen::workloads::{Validity, Workload};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "baton-jepsen", version, about = "Jepsen-style tests of Baton: real processes, faults, checkers")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a test: workload + nemesis for a time limit, then check the history.
    Test {
        #[arg(long, value_enum)]
        workload: Workload,
        #[arg(long, value_enum, default_value = "none")]
        nemesis: NemesisKind,
        /// Seconds of workload (setup and checking come on top).
        #[arg(long, default_value_t = 30)]
        time_limit: u64,
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Client slots per workload.
        #[arg(long, default_value_t = 5)]
        concurrency: usize,
        #[arg(long)]
        seed: Option<u64>,
        /// Run folder (default jepsen/store/<timestamp>/).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Run batond-faulty with this deliberate bug (repeatable):
        /// stale-reads, ack-before-commit, no-fence-check,
        /// grant-without-predecessor, expire-without-grace.
        #[arg(long = "server-fault")]
        server_fault: Vec<String>,
    },
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .try_init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("baton-jepsen: {e}");
            std::process::exit(2);
        }
    };
    let code = rt.block_on(async {
        match cli.cmd {
            Cmd::Test { workload, nemesis, time_limit, nodes, concurrency, seed, out, server_fault } => {
                let seed = seed.unwrap_or_else(rand::random);
                let out = out.unwrap_or_else(|| {
                    let ts = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    PathBuf::from(format!("jepsen/store/{ts}-{}-{seed}", workload.name()))
                });
                let opts = TestOpts {
                    workload,
                    nemesis,
                    time_limit: Duration::from_secs(time_limit),
                    nodes,
                    concurrency,
                    seed,
                    out: out.clone(),
                    server_faults: server_fault,
                };
                // Ctrl-C: stop and tear down (the cluster dies with `Db`'s drop).
                let r = tokio::select! {
                    r = run_test(opts) => r,
                    _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
                };
                match r {
                    Ok(o) => {
                        println!("results in {}", out.display());
                        println!("valid: {}", o.valid.as_str());
                        match o.valid {
                            Validity::True => 0,
                            Validity::False => 1,
                            Validity::Unknown => 2,
                        }
                    }
                    Err(e) => {
                        eprintln!("baton-jepsen: harness error: {e:#}");
                        println!("valid: unknown");
                        2
                    }
                }
            }
        }
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code);
}
