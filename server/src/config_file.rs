//! `batond --config FILE`: a TOML file whose keys are batond's long flag
//! names (`data-dir = "/var/lib/baton"`, `superuser = ["x509:admin"]`,
//! `auto-promote = true`).
//!
//! Precedence, highest first: a flag on the command line, its `BATON_*`
//! environment variable (clap's `env`: `--data-dir` is `BATON_DATA_DIR`),
//! the config file, the built-in default. The file is turned into flags
//! appended to the command line for every key that neither the command
//! line nor the environment sets, so one parser (clap) checks everything.
//! An unknown key, or a value that is not a string, integer, boolean or an
//! array of those, is an error naming the file and the key.

use std::path::Path;

/// The environment variable clap reads for flag `--name`.
pub fn env_name(flag: &str) -> String {
    format!("BATON_{}", flag.replace('-', "_").to_uppercase())
}

/// Where `--config` points in `args` (`--config F` or `--config=F`), or
/// `BATON_CONFIG`.
pub fn config_path(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(v.to_string());
        }
    }
    env("BATON_CONFIG")
}

/// `args` with the file's settings appended as flags (see the module docs).
/// `known`: the long flag names batond accepts.
pub fn merge(
    args: Vec<String>,
    file: &Path,
    text: &str,
    known: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("{}: {e}", file.display()))?;
    let on_command_line = |k: &str| args.iter().any(|a| a == &format!("--{k}") || a.starts_with(&format!("--{k}=")));
    let mut out = args.clone();
    for (key, value) in table {
        if key == "config" || !known.contains(&key) {
            return Err(format!("{}: unknown setting `{key}` (see batond --help)", file.display()));
        }
        if on_command_line(&key) || env(&env_name(&key)).is_some() {
            continue;
        }
        let scalar = |v: &toml::Value| -> Result<String, String> {
            match v {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Boolean(b) => Ok(b.to_string()),
                _ => Err(format!("{}: `{key}` must be a string, integer or boolean", file.display())),
            }
        };
        match &value {
            toml::Value::Boolean(true) => out.push(format!("--{key}")),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                for v in items {
                    out.push(format!("--{key}={}", scalar(v)?));
                }
            }
            v => out.push(format!("--{key}={}", scalar(v)?)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_env_and_command_line() {
        let known: Vec<String> =
            ["id", "data-dir", "client-addr", "superuser", "tls-on", "peers"].iter().map(|s| s.to_string()).collect();
        let text = r#"
            id = 1
            data-dir = "/from/file"
            client-addr = "file:1"
            superuser = ["x509:a", "user:b"]
            tls-on = true
            peers = "1=a:1"
        "#;
        let args: Vec<String> = ["batond", "--client-addr=cli:1"].iter().map(|s| s.to_string()).collect();
        let env = |k: &str| (k == "BATON_PEERS").then(|| "1=env:1".to_string());
        let out = merge(args, Path::new("b.toml"), text, &known, &env).unwrap();
        assert!(out.contains(&"--client-addr=cli:1".to_string()));
        assert!(!out.iter().any(|a| a == "--client-addr=file:1"), "the command line wins");
        assert!(!out.iter().any(|a| a.starts_with("--peers")), "the environment wins over the file");
        assert!(out.contains(&"--data-dir=/from/file".to_string()));
        assert!(out.contains(&"--id=1".to_string()));
        assert!(out.contains(&"--superuser=x509:a".to_string()) && out.contains(&"--superuser=user:b".to_string()));
        assert!(out.contains(&"--tls-on".to_string()));
        let err = merge(vec![], Path::new("b.toml"), "nope = 1", &known, &|_| None).unwrap_err();
        assert!(err.contains("unknown setting `nope`"), "{err}");
        let err = merge(vec![], Path::new("b.toml"), "id = 1.5", &known, &|_| None).unwrap_err();
        assert!(err.contains("`id`"), "{err}");
        assert!(merge(vec![], Path::new("b.toml"), "id = ", &known, &|_| None).is_err());
        assert_eq!(env_name("advertise-peer-addr"), "BATON_ADVERTISE_PEER_ADDR");
        let args: Vec<String> = ["batond", "--config", "x.toml"].iter().map(|s| s.to_string()).collect();
        assert_eq!(config_path(&args, &|_| None).as_deref(), Some("x.toml"));
    }
}
