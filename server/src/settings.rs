//! Cluster-wide settings: who is a superuser, and whether admin operations
//! (backups, membership changes) are open to every client when there is
//! none. They are a fact in the log, the cluster record's `settings`, not
//! each member's flags, so every member grants the same power (finding A2:
//! the proposing member decided the superuser bit by its own `--superuser`,
//! so one member started without the flag opened the cluster):
//! - the first leader seeds them from its own flags (`--superuser`,
//!   `--insecure-open-admin`) in the entry that sets the cluster id; a
//!   cluster made before settings were recorded gets them the same way
//!   from its next leader (cluster.rs `next_record`); a seed applies only
//!   while the record has none;
//! - an admin changes them with `baton settings set` (a `SetSettingsOp`
//!   write, superusers only; state/mod.rs), which must leave an admin: at least
//!   one superuser, or open admin;
//! - every member follows the recorded settings ([`effective`]); one whose
//!   flags disagree logs it, once per change, and follows the record. Until
//!   the record has settings (the first seconds of a new cluster), a member
//!   uses its own flags;
//! - checked again: a member that has not yet applied the record (cut off
//!   when it was written, or restarted from a checkpoint older than it)
//!   also uses its own flags, so a new backup and `list_users`, which wait
//!   for a ReadIndex, are checked a second time when they are served,
//!   against the settings as applied by then (driver/requests.rs
//!   `power_as_applied`): a superuser by one member's flags alone is
//!   refused there what the record refuses (server/tests/admin.rs). A
//!   membership change goes to the leader, which takes one only once it
//!   has applied every entry before its term (`NO_LEADER`, retry, until
//!   then: a new leader may hold the record in its log unapplied), and
//!   checks it against the settings as applied (driver/members.rs); a
//!   snapshot's settings are followed as soon as it is installed.

use baton_proto::ClusterSettings;

use crate::config::Config;
use crate::view::SharedState;

/// The settings a member's flags say (the seed of a new cluster's record).
pub fn from_flags(cfg: &Config) -> ClusterSettings {
    ClusterSettings { superusers: cfg.superusers.clone(), open_admin: cfg.open_admin }
}

/// The settings to follow: the record's, else the flags'.
pub fn effective(recorded: Option<&ClusterSettings>, cfg: &Config) -> ClusterSettings {
    recorded.cloned().unwrap_or_else(|| from_flags(cfg))
}

/// [`effective`] as of the state now.
pub fn current(state: &SharedState, cfg: &Config) -> ClusterSettings {
    let sm = crate::view::read(state);
    effective(sm.cluster().settings.as_ref(), cfg)
}

/// Whether a caller (`superuser`: one of the settings' superusers) may run
/// an admin operation: a superuser always; anyone only when there is no
/// superuser and admin is open.
pub fn admin_allowed(s: &ClusterSettings, superuser: bool) -> bool {
    superuser || (s.superusers.is_empty() && s.open_admin)
}

/// Why admin operation `what` ("backups") was refused, for its `NO_AUTH`.
pub fn admin_refusal(s: &ClusterSettings, what: &str) -> String {
    if s.superusers.is_empty() {
        format!(
            "{what} need an admin identity and this cluster has none: start the members with --superuser ID \
             (docs/operations.md, The first admin), or --insecure-open-admin on a local development cluster"
        )
    } else {
        format!("{what} need a superuser (--superuser; the cluster's settings: baton settings get)")
    }
}

/// Refuses settings that are malformed or would leave no admin.
pub fn validate(s: &ClusterSettings) -> Result<(), String> {
    if let Some(bad) = s.superusers.iter().find(|u| *u == crate::acl::ANYONE || !crate::acl::valid_identity(u)) {
        return Err(format!("superuser {bad:?}: not x509:CN, user:NAME or digest:NAME:HASH"));
    }
    if s.superusers.len() > 64 {
        return Err("at most 64 superusers".into());
    }
    if s.superusers.is_empty() && !s.open_admin {
        return Err("these settings leave no admin: name a superuser (or open admin on a development cluster)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_rules() {
        let su = |v: &[&str], open| ClusterSettings {
            superusers: v.iter().map(|s| s.to_string()).collect(),
            open_admin: open,
        };
        assert!(admin_allowed(&su(&[], true), false));
        assert!(!admin_allowed(&su(&[], false), false));
        assert!(!admin_allowed(&su(&["x509:a"], true), false), "open admin does not apply once a superuser is named");
        assert!(admin_allowed(&su(&["x509:a"], false), true));
        assert!(validate(&su(&["x509:a"], false)).is_ok());
        assert!(validate(&su(&[], true)).is_ok());
        assert!(validate(&su(&[], false)).unwrap_err().contains("no admin"));
        assert!(validate(&su(&["world:anyone"], false)).is_err());
        assert!(validate(&su(&["ip:1.2.3.4"], false)).is_err());
    }
}
