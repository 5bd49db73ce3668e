//! Who may do what on a node: ZooKeeper-style ACLs, one model for every
//! port.
//!
//! Identities belong to a client connection: always `world:anyone`, plus
//! `x509:<common name>` when the client presented a certificate (TLS with
//! `--ca`), plus `user:<name>` for each successful `auth` with a password.
//! A member's `--superuser` identities may do everything.
//!
//! A node's ACL is a list of (permissions, identity); empty means open to
//! everyone (the default: a cluster without ACLs behaves as before).
//! Permissions: READ (get, children, get-acl, watches on them), WRITE
//! (set), CREATE (create a child), DELETE (delete a child), ADMIN (set-acl).
//! `exists`, `check` and fences need none, as in ZooKeeper.
//!
//! Rules:
//! - A request is allowed if any ACL entry grants the permission to
//!   `world:anyone` or to one of the connection's identities, or the ACL
//!   is empty, or one identity is a superuser. Otherwise `NO_AUTH`, naming
//!   the operation, the path, the permission and the identities.
//! - A create with no ACL gives the node its parent's ACL (missing parents
//!   made by `parents` too): children inherit at create time. An entry with
//!   id `auth` stands for every identity the creator authenticated as
//!   (`x509:` and `user:`); a create with `auth` and no such identity fails
//!   with `BAD_REQUEST`.
//! - Writes are checked on apply, against the identities the proposing
//!   member put in the entry (it took them from the connection); reads by
//!   the member that serves them. Apply is deterministic: the superuser
//!   decision is in the entry too.
//! - Users and passwords: only a superuser adds or removes users. The
//!   client sends, and the log carries, a salt and a PBKDF2-HMAC-SHA256
//!   hash (`baton_proto::auth`), never the password; `auth` sends the
//!   password (use TLS), and the member's listener verifies it off the
//!   driver thread, in constant time. Removing a user does not drop the
//!   identity from connections that already authenticated.

use baton_proto::{Acl, ErrorCode};

pub use baton_proto::acl::{format, parse, ADMIN, ALL, CREATE, DELETE, READ, WRITE};

/// The identity every connection has.
pub const ANYONE: &str = "world:anyone";

/// A permission's name, for error messages.
pub fn perm_name(p: u32) -> &'static str {
    match p {
        READ => "READ",
        WRITE => "WRITE",
        CREATE => "CREATE",
        DELETE => "DELETE",
        ADMIN => "ADMIN",
        _ => "?",
    }
}

/// The caller of a request: its identities and whether one is a superuser.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub identities: Vec<String>,
    pub superuser: bool,
}

impl Caller {
    /// A caller that may do everything (internal work, tests).
    pub fn system() -> Self {
        Caller { identities: Vec::new(), superuser: true }
    }

    /// The caller with `identities`, a superuser if one is in `superusers`.
    pub fn new(identities: Vec<String>, superusers: &[String]) -> Self {
        let superuser = identities.iter().any(|i| superusers.contains(i));
        Caller { identities, superuser }
    }

    /// Checks `perm` on a node with `acl`, for operation `what` on `path`.
    pub fn check(&self, acl: &[Acl], perm: u32, what: &str, path: &str) -> Result<(), (ErrorCode, String)> {
        if self.superuser || acl.is_empty() {
            return Ok(());
        }
        let ok = acl.iter().any(|a| a.perms & perm != 0 && (a.id == ANYONE || self.identities.contains(&a.id)));
        if ok {
            return Ok(());
        }
        let mut ids = vec![ANYONE.to_string()];
        ids.extend(self.identities.iter().cloned());
        Err((ErrorCode::NoAuth, format!("{what} {path} needs {} (identities: {})", perm_name(perm), ids.join(", "))))
    }

    /// A create's ACL: `auth` expanded to this caller's identities.
    pub fn expand(&self, acl: &[Acl]) -> Result<Vec<Acl>, (ErrorCode, String)> {
        let mut out = Vec::new();
        for a in acl {
            if a.id == "auth" {
                if self.identities.is_empty() {
                    return Err((ErrorCode::BadRequest, "an `auth` ACL needs an authenticated identity".into()));
                }
                out.extend(self.identities.iter().map(|i| Acl { perms: a.perms, id: i.clone() }));
            } else {
                out.push(a.clone());
            }
        }
        Ok(out)
    }
}

/// Checks an ACL's entries: known schemes, permissions within [`ALL`].
pub fn validate(acl: &[Acl]) -> Result<(), (ErrorCode, String)> {
    for a in acl {
        let known = a.id == ANYONE
            || a.id == "auth"
            || a.id.strip_prefix("user:").is_some_and(|n| !n.is_empty())
            || a.id.strip_prefix("x509:").is_some_and(|n| !n.is_empty());
        if !known {
            let msg = format!("unknown ACL identity {:?} (world:anyone, user:NAME, x509:NAME, auth)", a.id);
            return Err((ErrorCode::BadRequest, msg));
        }
        if a.perms == 0 || a.perms & !ALL != 0 {
            return Err((ErrorCode::BadRequest, format!("ACL permissions {:#x} for {}", a.perms, a.id)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_and_expansion() {
        let acl = parse("user:alice:rwcda,world:anyone:r").expect("parse");
        assert_eq!(format(&acl[0]), "user:alice:rwcda");
        let bob = Caller { identities: vec!["user:bob".into()], superuser: false };
        let alice = Caller { identities: vec!["user:alice".into()], superuser: false };
        assert!(bob.check(&acl, READ, "get", "/x").is_ok());
        let (code, msg) = bob.check(&acl, WRITE, "set", "/x").expect_err("bob may not write");
        assert_eq!(code, ErrorCode::NoAuth);
        assert!(msg.contains("needs WRITE") && msg.contains("user:bob"), "{msg}");
        assert!(alice.check(&acl, ADMIN, "set-acl", "/x").is_ok());
        assert!(Caller::system().check(&acl, ADMIN, "set-acl", "/x").is_ok());
        assert!(Caller::new(vec!["x509:root".into()], &["x509:root".into()]).superuser);
        assert!(bob.check(&[], ADMIN, "set-acl", "/x").is_ok(), "empty ACL is open");
        let e = alice.expand(&parse("auth:rw").expect("parse")).expect("expand");
        assert_eq!(e, vec![Acl { perms: READ | WRITE, id: "user:alice".into() }]);
        assert!(Caller::default().expand(&parse("auth:r").expect("parse")).is_err());
        assert!(validate(&parse("ip:1.2.3.4:r").expect("parse")).is_err());
        assert!(parse("user:a:rx").is_err());
    }
}
