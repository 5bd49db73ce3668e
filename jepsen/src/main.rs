//! `baton-jepsen`: the harness's command line: [`test`] returns the
//! process's exit code ([`verdict`]); Ctrl-C stops a run and tears its
//! cluster down. The benchmark's commands (bench, compare, scale, the
//! rivals' lock-safety test) are `baton-bench`'s (`bench/src/main.rs`).

use std::path::PathBuf;
use std::time::Duration;

use baton_jepsen::cli::{self, interruptible, stamp, verdict};
use baton_jepsen::cli_door;
use baton_jepsen::db::{check_session_ms, SESSION_MS};
use baton_jepsen::door::{Door, ZkReads};
use baton_jepsen::nemesis::NemesisKind;
use baton_jepsen::runner::{run_test, TestOpts};
use baton_jepsen::workloads::Workload;
use clap::{Args, Parser, Subcommand};

const PROG: &str = "baton-jepsen";

#[derive(Parser)]
#[command(name = "baton-jepsen", version, about = "Jepsen-style tests of Baton: real processes, faults, checkers")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a test: workload + nemesis for a time limit, then check the history.
    Test(TestArgs),
}

#[derive(Args)]
struct TestArgs {
    #[arg(long, value_enum)]
    workload: Workload,
    #[arg(long, value_enum, default_value = "none")]
    nemesis: NemesisKind,
    /// The door every workload client comes through, the
    /// native protocol or the ZooKeeper port (a real ZooKeeper client,
    /// ZooKeeper's recipes; every nemesis and checker the same).
    #[arg(long, value_enum, default_value = "native")]
    door: Door,
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
    /// grant-without-predecessor, expire-without-grace,
    /// contact-from-local-answers, keepalive-without-quorum,
    /// expire-from-stale-role (see server/src/faults.rs).
    #[arg(long = "server-fault")]
    server_fault: Vec<String>,
    /// Session timeout of the run's clients (ms); at least the members'
    /// floor of 2 x election timeout (1000 ms).
    #[arg(long = "session-timeout", default_value_t = SESSION_MS)]
    session_timeout: u64,
    /// TLS on both ports: a throwaway CA, mutual TLS between members
    /// and for every client.
    #[arg(long)]
    tls: bool,
    /// `--door zookeeper`: how linearizable reads go through the
    /// ZooKeeper port
    /// (sync = `sync` then `getData`; linearizable = `getData` on members
    /// with `--zk-linearizable-reads`; local = plain `getData`, a control
    /// that is not linearizable under partition).
    #[arg(long, value_enum, default_value = "sync")]
    zk_reads: ZkReads,
    /// `--door cli`, a planted fault: the held command calls `setsid`,
    /// leaving the process group `baton`'s keeper stops, so it outlives
    /// a `baton` killed by `kill-client` (what finding Z3 saw).
    #[arg(long)]
    cli_command_leaves_group: bool,
}

fn main() {
    // A CLI-door hold's command (cli_door.rs), not a test.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(cli_door::HOLD_ARG) {
        std::process::exit(cli_door::hold_main(&args[2..]));
    }
    let cli = Cli::parse();
    cli::run(PROG, async {
        match cli.cmd {
            Cmd::Test(a) => test(a).await,
        }
    })
}

/// `test`: a run against Baton. Exit code: [`verdict`].
async fn test(a: TestArgs) -> i32 {
    if let Err(e) = check_session_ms(a.session_timeout) {
        eprintln!("{PROG}: {e}");
        return 2;
    }
    let seed = a.seed.unwrap_or_else(rand::random);
    let door = match a.door {
        Door::Native => String::new(),
        d => format!("{}-", d.name()),
    };
    let out =
        a.out.unwrap_or_else(|| PathBuf::from(format!("jepsen/store/{}-{door}{}-{seed}", stamp(), a.workload.name())));
    let opts = TestOpts {
        workload: a.workload,
        nemesis: a.nemesis,
        time_limit: Duration::from_secs(a.time_limit),
        nodes: a.nodes,
        concurrency: a.concurrency,
        seed,
        out: out.clone(),
        server_faults: a.server_fault,
        session_timeout: Duration::from_millis(a.session_timeout),
        tls: a.tls,
        door: a.door,
        zk_reads: a.zk_reads,
        cli_leaves_group: a.cli_command_leaves_group,
    };
    // Ctrl-C: stop and tear down (the cluster dies with `Db`'s drop).
    let r = interruptible(run_test(opts)).await;
    verdict(PROG, r.map(|o| o.valid), &out)
}
