//! Logging: `tracing` everywhere; raft-rs logs through `slog`, bridged here.

use slog::{Drain, Level, OwnedKVList, Record, KV};

/// Sends every slog record to `tracing` with its key-values appended.
struct TracingDrain;

struct KvText(String);

impl slog::Serializer for KvText {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments) -> slog::Result {
        use std::fmt::Write;
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record, values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut kv = KvText(String::new());
        let _ = record.kv().serialize(record, &mut kv);
        let _ = values.serialize(record, &mut kv);
        let msg = record.msg();
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{msg}{}", kv.0),
            Level::Warning => tracing::warn!(target: "raft", "{msg}{}", kv.0),
            Level::Info => tracing::info!(target: "raft", "{msg}{}", kv.0),
            Level::Debug => tracing::debug!(target: "raft", "{msg}{}", kv.0),
            Level::Trace => tracing::trace!(target: "raft", "{msg}{}", kv.0),
        }
        Ok(())
    }
}

pub fn slog_logger(id: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!("raft_id" => id))
}

/// Installs the tracing subscriber (`RUST_LOG`, default `info`): text, or
/// with `json` one JSON object per line (timestamp, level, target, fields).
pub fn init(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,raft=warn"));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json {
        b.json().flatten_event(true).try_init()
    } else {
        b.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).try_init()
    };
}
