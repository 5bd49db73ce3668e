//! Where the binaries are: `$BATOND_BIN` (`$BATOND_FAULTY_BIN`,
//! `$BATON_BIN`), else next to the running executable (a test's
//! `target/<profile>/deps/..` included), else on PATH. `baton` is also
//! looked for next to an overridden `batond`.

use std::path::{Path, PathBuf};

/// A binary of the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bin {
    /// A member.
    Batond,
    /// The CLI.
    Baton,
    /// A member with deliberate bugs behind `--server-fault`.
    BatondFaulty,
}

impl Bin {
    pub fn name(self) -> &'static str {
        match self {
            Bin::Batond => "batond",
            Bin::Baton => "baton",
            Bin::BatondFaulty => "batond-faulty",
        }
    }

    fn env(self) -> &'static str {
        match self {
            Bin::Batond => "BATOND_BIN",
            Bin::Baton => "BATON_BIN",
            Bin::BatondFaulty => "BATOND_FAULTY_BIN",
        }
    }

    fn build_hint(self) -> &'static str {
        match self {
            Bin::BatondFaulty => "cargo build -p baton-server --features fault-injection --bin batond-faulty",
            _ => "cargo build --workspace --bins",
        }
    }
}

/// The path of `bin` (module doc for the search order).
pub fn locate(bin: Bin) -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(bin.env()) {
        return Ok(PathBuf::from(p));
    }
    let name = bin.name();
    if bin == Bin::Baton {
        if let Some(d) = std::env::var_os(Bin::Batond.env()) {
            let cand = PathBuf::from(d).with_file_name(name);
            if cand.exists() {
                return Ok(cand);
            }
        }
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    for _ in 0..2 {
        let cand = dir.join(name);
        if cand.exists() {
            return Ok(cand);
        }
        dir.pop(); // target/debug/deps -> target/debug
    }
    for d in std::env::var("PATH").unwrap_or_default().split(':') {
        let cand = Path::new(d).join(name);
        if cand.exists() {
            return Ok(cand);
        }
    }
    anyhow::bail!("{name} not found next to {} nor on PATH (build it: {})", exe.display(), bin.build_hint())
}
