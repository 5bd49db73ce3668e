//! Who may do what on a node: ZooKeeper-style ACLs, one model for every
//! port.
//!
//! Identities belong to a client connection: always `world:anyone`, plus
//! - `x509:<common name>` when the client presented a certificate (TLS
//!   with `--ca`);
//! - `user:<name>` for each successful password `auth` on the native port,
//!   or a ZooKeeper-port `digest` auth whose name and password are a Baton
//!   password user's;
//! - `digest:<name>:<hash>` for each successful password `auth` on either
//!   port: `hash` is base64(SHA-1("name:password")), standard alphabet with
//!   padding, exactly ZooKeeper's `DigestAuthenticationProvider` ([`digest`];
//!   unit test: "super:test" gives `D/InIHSb7yEEbrWz8b9l71RjZJU=`). On the
//!   ZooKeeper port every `digest` auth `NAME:PASSWORD` succeeds, as in
//!   ZooKeeper (no user store: ACLs made by ZooKeeper tooling work
//!   unchanged); on the native port only a Baton user's does. A
//!   malformed one (no `:`, an empty name, not UTF-8) or another scheme is
//!   answered `AUTH_FAILED` and the connection is closed, as ZooKeeper does.
//!
//! A member's `--superuser` identities (`x509:CN`, `user:NAME`,
//! `digest:NAME:HASH`: the last is ZooKeeper's `superDigest`) may do
//! everything; the flag refuses anything else.
//!
//! A node's ACL is a list of (permissions, identity); empty means open to
//! everyone (the default: a cluster without ACLs behaves as before).
//! Permissions: READ (get, children, watches on them), WRITE (set), CREATE
//! (create a child), DELETE (delete a child), ADMIN (set-acl). get-acl
//! needs READ or ADMIN, and without ADMIN every `digest` entry's hash reads
//! as `x` (ZooKeeper's getACL does the same: the hash is a password's
//! unsalted SHA-1). `exists`, `check` and fences need none, as in
//! ZooKeeper.
//!
//! Rules:
//! - A request is allowed if any ACL entry grants the permission to
//!   `world:anyone` or to one of the connection's identities (compared as
//!   whole strings), or the ACL is empty, or one identity is a superuser.
//!   Otherwise `NO_AUTH`, naming the operation, the path, the permission
//!   and the identities.
//! - ACL entries are `world:anyone`, `user:NAME`, `x509:CN`,
//!   `digest:NAME:HASH` (non-empty name and hash, one `:` between them) and
//!   `auth`; anything else (ZooKeeper's `ip`, a typo) is refused
//!   ([`validate`]: `BAD_REQUEST`, on the ZooKeeper port `INVALID_ACL`
//!   before the request reaches the state machine), as is an entry with no
//!   permission or an unknown bit.
//! - A create with no ACL gives the node its parent's ACL (missing parents
//!   made by `parents` too): children inherit at create time. An entry with
//!   id `auth` (ZooKeeper's scheme `auth`) stands for every identity the
//!   creator authenticated as (`x509:`, `user:` and `digest:`); a create or
//!   set-acl with `auth` and no such identity fails with `BAD_REQUEST`
//!   (ZooKeeper port: `INVALID_ACL`, as ZooKeeper answers). `auth` is never
//!   stored.
//! - Writes are checked on apply, against the identities the proposing
//!   member put in the entry (it took them from the connection); reads by
//!   the member that serves them. Apply is deterministic: the superuser
//!   decision is in the entry too.
//! - Users and passwords: only a superuser adds or removes users. The
//!   client sends, and the log carries, a salt and a PBKDF2-HMAC-SHA256
//!   hash (`baton_proto::auth`), never the password; `auth` sends the
//!   password (use TLS; the ZooKeeper port is plaintext, as ZooKeeper's
//!   `digest` is without TLS), and the member verifies it off the
//!   driver (a blocking task), in constant time, without holding the state lock while
//!   it hashes. Removing a user does not drop the identity from connections
//!   that already authenticated. A `digest:` identity needs no user: it is
//!   what the password hashes to, so anyone who knows a name and password
//!   has it (ZooKeeper's model); a `user:` identity needs the user.

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

/// ZooKeeper's digest identity for `name` and `password`:
/// `digest:NAME:base64(SHA-1("NAME:PASSWORD"))`.
pub fn digest(name: &str, password: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, format!("{name}:{password}").as_bytes());
    format!("digest:{name}:{}", base64(d.as_ref()))
}

/// Standard base64 with padding (RFC 4648 section 4).
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let v = chunk.iter().enumerate().fold(0u32, |v, (i, &x)| v | (x as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(v >> (18 - 6 * i) & 0x3f) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub use baton_proto::acl::valid_identity;

/// `acl` as a caller without ADMIN sees it: each `digest` entry's hash is
/// `x` (ZooKeeper's getACL).
pub fn redact(acl: &[Acl]) -> Vec<Acl> {
    acl.iter()
        .map(|a| match a.id.strip_prefix("digest:").and_then(|r| r.split_once(':')) {
            Some((name, _)) => Acl { perms: a.perms, id: format!("digest:{name}:x") },
            None => a.clone(),
        })
        .collect()
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
                    // Finding A7: say what `auth` would have meant.
                    let msg = "an `auth` ACL entry means the creator's own authenticated identities (x509:CN from \
                               a client certificate, user:NAME and digest:NAME:HASH from a password auth), and this \
                               connection has none: it would name no one. Log in first (baton --user NAME, with a \
                               password user a superuser added, or a client certificate), or name identities";
                    return Err((ErrorCode::BadRequest, msg.into()));
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
        if a.id != "auth" && !valid_identity(&a.id) {
            let msg =
                format!("unknown ACL identity {:?} (world:anyone, user:NAME, x509:NAME, digest:NAME:HASH, auth)", a.id);
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
        let (_, why) = Caller::default().expand(&parse("auth:r").expect("parse")).expect_err("no identity");
        assert!(why.contains("would name no one") && why.contains("--user"), "{why}");
        assert!(validate(&parse("ip:1.2.3.4:r").expect("parse")).is_err());
        assert!(parse("user:a:rx").is_err());
    }

    #[test]
    fn digest_is_zookeepers() {
        // ZooKeeper's own vector: its test suites run with superDigest
        // "super:D/InIHSb7yEEbrWz8b9l71RjZJU=" for password "test"
        // (zookeeper-server/pom.xml).
        assert_eq!(digest("super", "test"), "digest:super:D/InIHSb7yEEbrWz8b9l71RjZJU=");
        // openssl: printf alice:pw | openssl sha1 -binary | base64
        assert_eq!(digest("alice", "pw"), "digest:alice:V55/p2T0OpjQ+low3NVAH4aLvm0=");
        assert_ne!(digest("alice", "pw2"), digest("alice", "pw"));
        for (raw, b64) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg==")] {
            assert_eq!(base64(raw.as_bytes()), b64, "RFC 4648 vector {raw:?}");
        }
    }

    #[test]
    fn digest_entries_validate_match_and_redact() {
        let id = digest("alice", "pw");
        let acl = vec![Acl { perms: READ, id: id.clone() }];
        assert!(validate(&acl).is_ok());
        for bad in ["digest:alice", "digest::h", "digest:alice:", "digest:a:b:c", "digest:", "ip:1.2.3.4", "world:x"] {
            assert!(validate(&[Acl { perms: READ, id: bad.into() }]).is_err(), "{bad} is refused");
            assert!(!valid_identity(bad), "{bad}");
        }
        assert!(valid_identity("digest:super:D/InIHSb7yEEbrWz8b9l71RjZJU="));
        assert!(!valid_identity("auth"), "auth is an ACL entry, not an identity");
        let alice = Caller { identities: vec![id.clone()], superuser: false };
        assert!(alice.check(&acl, READ, "get", "/x").is_ok());
        let wrong = Caller { identities: vec![digest("alice", "nope")], superuser: false };
        assert_eq!(wrong.check(&acl, READ, "get", "/x").expect_err("wrong password").0, ErrorCode::NoAuth);
        assert!(
            Caller::new(vec![digest("super", "test")], &["digest:super:D/InIHSb7yEEbrWz8b9l71RjZJU=".into()]).superuser
        );
        let e = Caller { identities: vec![id.clone(), "user:alice".into()], superuser: false }
            .expand(&parse("auth:rw").expect("parse"))
            .expect("expand");
        assert_eq!(e.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), vec![id.as_str(), "user:alice"]);
        let shown = redact(&[acl[0].clone(), Acl { perms: ALL, id: "user:bob".into() }]);
        assert_eq!(shown[0].id, "digest:alice:x");
        assert_eq!(shown[1].id, "user:bob");
    }
}
