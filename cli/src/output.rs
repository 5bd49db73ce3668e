//! What results look like: text for people, or (`--json`) one JSON object
//! per line for programs; and how values are encoded.
//!
//! Values are bytes. Text output writes them as they are; `--hex` and
//! `--base64` print (and read) them as hexadecimal or base64 text instead.
//! JSON output never corrupts a value: it carries `data` (a string) when
//! the value is valid UTF-8 and `data_base64` otherwise; with `--hex` it
//! always carries `data_hex`, with `--base64` always `data_base64`.
//!
//! Times in a stat are milliseconds since the Unix epoch as the leader
//! stamped them; text output adds them as RFC 3339 UTC.

use std::io::Write;

use base64::Engine as _;
use baton_client::Stat;
use clap::Args;
use serde_json::{json, Map, Value};

/// The output mode, from `--json`.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    pub json: bool,
}

impl Out {
    /// Prints `json` (one line) with --json, else `text` (if not empty).
    pub fn emit(&self, json: Value, text: impl std::fmt::Display) {
        if self.json {
            println!("{json}");
        } else {
            let text = text.to_string();
            if !text.is_empty() {
                println!("{text}");
            }
        }
    }
}

/// How values are written on the command line and printed.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct Encoding {
    /// Values as hexadecimal text: DATA (also from --file or stdin) is
    /// decoded from hex, and values are printed as hex.
    #[arg(long, conflicts_with = "base64")]
    pub hex: bool,
    /// Values as base64 text (standard alphabet, padded): DATA (also from
    /// --file or stdin) is decoded from base64, and values are printed so.
    #[arg(long)]
    pub base64: bool,
}

impl Encoding {
    /// The value `text` stands for (surrounding white space ignored for
    /// hex and base64, so a trailing newline does no harm).
    pub fn decode(&self, text: Vec<u8>) -> anyhow::Result<Vec<u8>> {
        let trimmed = || text.trim_ascii();
        if self.hex {
            decode_hex(trimmed()).ok_or_else(|| crate::usage("--hex: the value is not hexadecimal (pairs of 0-9a-f)"))
        } else if self.base64 {
            base64::engine::general_purpose::STANDARD
                .decode(trimmed())
                .map_err(|e| crate::usage(format!("--base64: the value is not base64: {e}")))
        } else {
            Ok(text)
        }
    }

    /// `data` as printed: as it is, or hex or base64 text.
    pub fn encode(&self, data: &[u8]) -> Vec<u8> {
        if self.hex {
            encode_hex(data).into_bytes()
        } else if self.base64 {
            base64::engine::general_purpose::STANDARD.encode(data).into_bytes()
        } else {
            data.to_vec()
        }
    }

    /// Adds `data` to a JSON object: `data`, `data_hex` or `data_base64`
    /// (see the module documentation).
    pub fn add_json(&self, obj: &mut Map<String, Value>, data: &[u8]) {
        self.add_json_as(obj, "data", data)
    }

    /// [`Encoding::add_json`] under `key`, `KEY_hex` or `KEY_base64`.
    pub fn add_json_as(&self, obj: &mut Map<String, Value>, key: &str, data: &[u8]) {
        let b64 = || Value::from(base64::engine::general_purpose::STANDARD.encode(data));
        let (suffix, value) = match std::str::from_utf8(data) {
            _ if self.hex => ("_hex", Value::from(encode_hex(data))),
            _ if self.base64 => ("_base64", b64()),
            Ok(s) => ("", Value::from(s)),
            Err(_) => ("_base64", b64()),
        };
        obj.insert(format!("{key}{suffix}"), value);
    }

    /// `fields` (an object) with the value added.
    pub fn json_with(&self, data: &[u8], fields: Value) -> Value {
        let mut obj = match fields {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        self.add_json(&mut obj, data);
        Value::Object(obj)
    }

    /// Writes `data` (encoded) and a newline to stdout.
    pub fn print_line(&self, data: &[u8]) -> std::io::Result<()> {
        let mut o = std::io::stdout().lock();
        o.write_all(&self.encode(data))?;
        o.write_all(b"\n")?;
        o.flush()
    }
}

fn encode_hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(text: &[u8]) -> Option<Vec<u8>> {
    let pairs = text.chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    pairs.map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

/// A stat as JSON: every field raw, plus the times in RFC 3339 UTC and
/// the ephemeral owner (a session id) in hex.
pub fn stat_json(s: &Stat) -> Value {
    json!({
        "czxid": s.czxid, "mzxid": s.mzxid, "pzxid": s.pzxid, "ctime": s.ctime, "mtime": s.mtime,
        "ctime_utc": rfc3339_ms(s.ctime), "mtime_utc": rfc3339_ms(s.mtime),
        "version": s.version, "cversion": s.cversion, "aversion": s.aversion,
        "ephemeral_owner": s.ephemeral_owner, "ephemeral_owner_hex": format!("{:#x}", s.ephemeral_owner),
        "data_length": s.data_length, "num_children": s.num_children,
        "container": s.container, "ttl_ms": s.ttl_ms,
    })
}

/// A stat as `name = value` lines (zkCli's layout, times made readable).
pub fn stat_text(s: &Stat) -> String {
    [
        format!("czxid = {}", s.czxid),
        format!("mzxid = {}", s.mzxid),
        format!("pzxid = {}", s.pzxid),
        format!("ctime = {} ({} ms)", rfc3339_ms(s.ctime), s.ctime),
        format!("mtime = {} ({} ms)", rfc3339_ms(s.mtime), s.mtime),
        format!("version = {}", s.version),
        format!("cversion = {}", s.cversion),
        format!("aversion = {}", s.aversion),
        format!("ephemeral_owner = {:#x}", s.ephemeral_owner),
        format!("data_length = {}", s.data_length),
        format!("num_children = {}", s.num_children),
    ]
    .into_iter()
    .chain(s.container.then(|| "container = true".to_string()))
    .chain((s.ttl_ms > 0).then(|| format!("ttl_ms = {}", s.ttl_ms)))
    .collect::<Vec<_>>()
    .join("\n")
}

/// The header of [`stat_row`]'s table.
pub const STAT_HEADER: &str = "VERSION      BYTES CHILDREN MTIME                    EPHEMERAL_OWNER    PATH";

/// One node as a table row (`ls --stat`).
pub fn stat_row(s: &Stat, path: &str) -> String {
    let owner = if s.ephemeral_owner == 0 { "-".to_string() } else { format!("{:#x}", s.ephemeral_owner) };
    format!(
        "{:>7} {:>10} {:>8} {:<24} {:<18} {path}",
        s.version,
        s.data_length,
        s.num_children,
        rfc3339_ms(s.mtime),
        owner
    )
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC, e.g.
/// `2024-05-01T12:00:00.123Z`.
pub fn rfc3339_ms(ms: i64) -> String {
    let (secs, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let (h, min, s) = (day_secs / 3600, day_secs % 3600 / 60, day_secs % 60);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

/// (year, month, day) of a day count since 1970-01-01, proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// 1536 -> `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// 93_000 -> `1m33s`.
pub fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        s if s >= 86400 => format!("{}d{}h", s / 86400, s % 86400 / 3600),
        s if s >= 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_714_564_800_123), "2024-05-01T12:00:00.123Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn encodings_round_trip_and_refuse_garbage() {
        let bytes = vec![0u8, 0xff, b'a', 0x80];
        for enc in [Encoding { hex: true, base64: false }, Encoding { hex: false, base64: true }] {
            let mut text = enc.encode(&bytes);
            text.push(b'\n');
            assert_eq!(enc.decode(text).unwrap(), bytes);
        }
        let hex = Encoding { hex: true, base64: false };
        assert!(hex.decode(b"abc".to_vec()).is_err());
        assert!(hex.decode(b"zz".to_vec()).is_err());
    }

    #[test]
    fn json_keeps_non_utf8_values() {
        let mut obj = Map::new();
        Encoding::default().add_json(&mut obj, &[0xff, 0xfe]);
        assert_eq!(obj["data_base64"], "//4=");
        let mut obj = Map::new();
        Encoding::default().add_json(&mut obj, "héllo".as_bytes());
        assert_eq!(obj["data"], "héllo");
    }
}
