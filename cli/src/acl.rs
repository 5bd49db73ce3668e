//! Access control: `acl get|set` (a node's ACL) and `auth` (password
//! users, superusers only; this client's identities). The rules are the
//! server's (server/src/acl.rs, docs/security.md); this only reads and
//! writes them.

use baton_client::Client;
use clap::Subcommand;
use serde_json::json;

use crate::output::Out;

#[derive(Subcommand, Debug)]
pub enum AclCmd {
    /// Print a node's ACL, one entry per line (ID:PERMS, perms of rwcda).
    Get {
        /// The node's path.
        #[arg(value_parser = crate::parse_path)]
        path: String,
    },
    /// Replace a node's ACL, e.g. `user:alice:rwcda,world:anyone:r`.
    Set {
        /// The node's path.
        #[arg(value_parser = crate::parse_path)]
        path: String,
        /// The new ACL: comma-separated SCHEME:ID:PERMS entries.
        acl: String,
        /// Only if the ACL is at this version (stat aversion).
        #[arg(long)]
        version: Option<i32>,
    },
}

impl AclCmd {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        match self {
            AclCmd::Get { path } => {
                let (acl, s) = c.get_acl(&path).await?;
                let entries: Vec<String> = acl.iter().map(baton_client::acl::format).collect();
                let text =
                    if entries.is_empty() { "world:anyone:rwcda (open: no ACL)".into() } else { entries.join("\n") };
                out.emit(json!({"path": path, "acl": entries, "aversion": s.aversion}), text);
            }
            AclCmd::Set { path, acl, version } => {
                let acl = parse_set(&path, &acl)?;
                let me = c.whoami().await.unwrap_or_default();
                let keeps_admin = acl.iter().any(|a| {
                    a.perms & baton_client::acl::ADMIN != 0
                        && (a.id == "world:anyone" || a.id == "auth" || me.contains(&a.id))
                });
                let s = c.set_acl(&path, acl, version).await?;
                if !keeps_admin {
                    // Finding A7: an ACL that names no identity of the
                    // caller with ADMIN locks the caller out of it for good
                    // (only a superuser can change it again).
                    eprintln!(
                        "baton: warning: the new ACL of {path} gives ADMIN to none of your identities ({}): only \
                         those it names, or a superuser, can change it again",
                        me.join(", ")
                    );
                }
                out.emit(json!({"path": path, "aversion": s.aversion}), format!("aversion {}", s.aversion));
            }
        }
        Ok(())
    }
}

/// The ACL of `acl set`: refused as usage (exit 2) when empty (it would
/// open the node to everyone), malformed, or naming an identity that
/// cannot exist here (`ip:` is ZooKeeper's; Baton has no address ACLs).
fn parse_set(path: &str, text: &str) -> anyhow::Result<Vec<baton_client::Acl>> {
    let acl = baton_client::acl::parse(text).map_err(|e| crate::usage(format!("ACL: {e}")))?;
    if acl.is_empty() {
        return Err(crate::usage(format!(
            "an empty ACL would open {path} to everyone; to mean that, say world:anyone:rwcda"
        )));
    }
    if let Some(bad) = acl.iter().find(|a| a.id != "auth" && !baton_client::acl::valid_identity(&a.id)) {
        let why = if bad.id.starts_with("ip:") { " (address ACLs are ZooKeeper's; Baton has none)" } else { "" };
        return Err(crate::usage(format!(
            "ACL identity {:?}{why}: use world:anyone, user:NAME, x509:NAME, digest:NAME:HASH or auth",
            bad.id
        )));
    }
    Ok(acl)
}

#[derive(Subcommand, Debug)]
pub enum AuthCmd {
    /// Add a password user; the password comes from BATON_NEW_PASSWORD or
    /// the first line of stdin.
    AddUser {
        /// The user's name (its identity is `user:NAME`).
        name: String,
    },
    /// Remove a password user.
    RemoveUser {
        /// The user's name.
        name: String,
    },
    /// List password users.
    ListUsers,
    /// Print this client's identities.
    Whoami,
}

impl AuthCmd {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        match self {
            AuthCmd::AddUser { name } => {
                c.add_user(&name, &new_password()?).await?;
                out.emit(json!({"user": name, "added": true}), format!("user {name} added"));
            }
            AuthCmd::RemoveUser { name } => {
                c.remove_user(&name).await?;
                out.emit(json!({"user": name, "removed": true}), format!("user {name} removed"));
            }
            AuthCmd::ListUsers => {
                let users = c.list_users().await?;
                out.emit(json!({"users": users}), users.join("\n"));
            }
            AuthCmd::Whoami => {
                let ids = c.whoami().await?;
                out.emit(json!({"identities": ids}), ids.join("\n"));
            }
        }
        Ok(())
    }
}

/// BATON_NEW_PASSWORD, or the first line of stdin.
fn new_password() -> anyhow::Result<String> {
    let password = match std::env::var("BATON_NEW_PASSWORD") {
        Ok(p) => p,
        Err(_) => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    if password.is_empty() {
        return Err(crate::usage("no password (BATON_NEW_PASSWORD or a line on stdin)"));
    }
    Ok(password)
}

#[derive(Subcommand, Debug)]
pub enum FenceCmd {
    /// Forget a fence's highest token (superusers only; every member logs
    /// it): the way out of a fence jammed by a bad token.
    Reset {
        /// The fence's resource name.
        name: String,
    },
}

impl FenceCmd {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        match self {
            FenceCmd::Reset { name } => {
                c.reset_fence(&name).await?;
                out.emit(json!({"fence": name, "reset": true}), format!("fence {name} reset"));
            }
        }
        Ok(())
    }
}

#[derive(Subcommand, Debug)]
pub enum SettingsCmd {
    /// The cluster-wide settings the member answering follows.
    Get,
    /// Replace the cluster-wide settings (superusers only): every member
    /// follows them, whatever its own flags say.
    Set {
        /// A superuser identity (x509:CN, user:NAME, digest:NAME:HASH);
        /// repeatable. The list replaces the current one.
        #[arg(long = "superuser")]
        superusers: Vec<String>,
        /// With no superuser: admin operations open to every client (local
        /// development only).
        #[arg(long)]
        insecure_open_admin: bool,
    },
}

impl SettingsCmd {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        match self {
            SettingsCmd::Get => {
                let s = c.status().await?;
                let text = format!(
                    "superusers: {}\nopen admin: {}",
                    if s.superusers.is_empty() { "(none)".to_string() } else { s.superusers.join(",") },
                    s.open_admin
                );
                out.emit(json!({"superusers": s.superusers, "open_admin": s.open_admin}), text);
            }
            SettingsCmd::Set { superusers, insecure_open_admin } => {
                if let Some(bad) = superusers.iter().find(|u| !baton_client::acl::valid_identity(u)) {
                    return Err(crate::usage(format!(
                        "--superuser {bad:?}: not x509:CN, user:NAME or digest:NAME:HASH"
                    )));
                }
                c.set_settings(superusers.clone(), insecure_open_admin).await?;
                out.emit(
                    json!({"superusers": superusers, "open_admin": insecure_open_admin}),
                    "cluster settings replaced".to_string(),
                );
            }
        }
        Ok(())
    }
}
