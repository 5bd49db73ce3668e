//! `fsync-probe`: how long an fdatasync of one small record takes on this
//! machine's disk, by how the file was made (issue 26's first
//! measurement; the figures are in docs/perf/fsync.md, `make fsync-probe`
//! runs it).
//!
//! Each writer appends records of `--record` bytes to a file of its own,
//! calling fdatasync after each, as a member's log writer does after a
//! Ready with new entries. The files are made three ways:
//! - `append`: an empty file that grows with every record, so every sync
//!   also writes the file's new size and block allocation (RocksDB's WAL
//!   under `AbsoluteConsistency`, which refuses log recycling: kv.rs);
//! - `overwrite`: a file written with zeros and synced first, then
//!   overwritten in place (a recycled or preallocated log): a sync writes
//!   the data alone;
//! - `fallocate`: a file reserved with fallocate(2) and synced, then
//!   written (the blocks are allocated but marked unwritten, so the first
//!   write to each still changes its extent).
//!
//! It prints, per mode and writer count, the syncs per second, the
//! latency of one write plus fdatasync at p50, p90, p99 and the maximum,
//! and what one sync costs the thread that makes it: CPU µs (its
//! `CLOCK_THREAD_CPUTIME_ID`, kernel time included: on a virtual machine
//! each I/O is an exit to the host) and voluntary context switches (its
//! `RUSAGE_THREAD` `ru_nvcsw`: each wait for an I/O is one).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "fsync-probe", about = "fdatasync latency of small records, by how the file was made")]
struct Args {
    /// A folder on the disk to test (files are made and removed in it).
    #[arg(long)]
    dir: PathBuf,
    /// Seconds for each mode and writer count.
    #[arg(long, default_value_t = 100)]
    secs: u64,
    /// Writer counts to run (each writer has its own file).
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    writers: Vec<usize>,
    /// Bytes per record.
    #[arg(long, default_value_t = 300)]
    record: usize,
    /// Modes to run: append, overwrite, fallocate.
    #[arg(long, value_delimiter = ',', default_value = "append,overwrite,fallocate")]
    modes: Vec<String>,
    /// Bytes preallocated for overwrite and fallocate (more than a run
    /// writes, or a writer wraps around to the start).
    #[arg(long, default_value_t = 256 << 20)]
    size: u64,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    std::fs::create_dir_all(&a.dir)?;
    println!("fsync-probe: {} s per row, {} B records, files in {}", a.secs, a.record, a.dir.display());
    println!("| mode | writers | syncs/s | p50 µs | p90 µs | p99 µs | max µs | CPU µs / sync | switches / sync |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for mode in &a.modes {
        for &n in &a.writers {
            let (lat, cost) = run(&a, mode, n)?;
            let secs = a.secs as f64;
            let q = |p: f64| percentile(&lat, p);
            let syncs = lat.len().max(1) as f64;
            println!(
                "| {mode} | {n} | {:.0} | {} | {} | {} | {} | {:.1} | {:.2} |",
                lat.len() as f64 / secs,
                q(0.50),
                q(0.90),
                q(0.99),
                lat.last().copied().unwrap_or(0),
                cost.cpu_us / syncs,
                cost.switches / syncs
            );
            let _ = std::io::stdout().flush();
        }
    }
    Ok(())
}

/// What the writer threads spent, summed.
#[derive(Default)]
struct Spent {
    cpu_us: f64,
    switches: f64,
}

impl Spent {
    /// The calling thread's CPU time and voluntary switches so far.
    fn now() -> Spent {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime and getrusage write into values we own.
        let cpu = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let usage = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        Spent {
            cpu_us: if cpu == 0 { ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3 } else { 0.0 },
            switches: if usage == 0 { ru.ru_nvcsw as f64 } else { 0.0 },
        }
    }

    fn since(self, before: &Spent) -> Spent {
        Spent { cpu_us: self.cpu_us - before.cpu_us, switches: self.switches - before.switches }
    }
}

/// Every write-and-sync latency (µs) of `n` writers in `mode`, sorted,
/// and what their threads spent.
fn run(a: &Args, mode: &str, n: usize) -> anyhow::Result<(Vec<u64>, Spent)> {
    let files: Vec<PathBuf> = (0..n).map(|i| a.dir.join(format!("probe-{mode}-{i}"))).collect();
    for f in &files {
        make(f, mode, a.size)?;
    }
    let until = Instant::now() + Duration::from_secs(a.secs);
    let handles: Vec<_> = files
        .iter()
        .cloned()
        .map(|f| {
            let (mode, record, size) = (mode.to_string(), a.record, a.size);
            std::thread::spawn(move || write_until(&f, &mode, record, size, until))
        })
        .collect();
    let mut all = Vec::new();
    let mut spent = Spent::default();
    for h in handles {
        let (lat, s) = h.join().map_err(|_| anyhow::anyhow!("a writer panicked"))??;
        all.extend(lat);
        spent.cpu_us += s.cpu_us;
        spent.switches += s.switches;
    }
    for f in &files {
        let _ = std::fs::remove_file(f);
    }
    all.sort_unstable();
    Ok((all, spent))
}

/// The file as `mode` makes it, synced (its directory entry too).
fn make(path: &Path, mode: &str, size: u64) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let f = OpenOptions::new().create(true).write(true).truncate(true).open(path)?;
    match mode {
        "append" => {}
        "overwrite" => {
            let zeros = vec![0u8; 1 << 20];
            let mut left = size;
            let mut w = &f;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                w.write_all(&zeros[..n])?;
                left -= n as u64;
            }
        }
        "fallocate" => {
            // SAFETY: fallocate(2) on a file descriptor we own.
            let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size as libc::off_t) };
            if rc != 0 {
                anyhow::bail!("fallocate {}: {}", path.display(), std::io::Error::last_os_error());
            }
        }
        other => anyhow::bail!("unknown mode {other:?} (append, overwrite, fallocate)"),
    }
    f.sync_all()?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn write_until(path: &Path, mode: &str, record: usize, size: u64, until: Instant) -> anyhow::Result<(Vec<u64>, Spent)> {
    let f = OpenOptions::new().write(true).open(path)?;
    let rec = vec![0x5a_u8; record];
    let mut at = 0u64;
    let mut out = Vec::new();
    let start = Spent::now();
    while Instant::now() < until {
        let t = Instant::now();
        if mode == "append" {
            f.write_all_at(&rec, at)?;
        } else {
            if at + record as u64 > size {
                at = 0;
            }
            f.write_all_at(&rec, at)?;
        }
        f.sync_data()?;
        out.push(t.elapsed().as_micros() as u64);
        at += record as u64;
    }
    Ok((out, Spent::now().since(&start)))
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}
