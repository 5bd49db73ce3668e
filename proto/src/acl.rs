//! ACL entries as clients write them: permission bits and the CLI's text
//! form (`user:alice:rwcda,world:anyone:r`). The rules that use them are in
//! server/src/acl.rs.

use crate::Acl;

pub const READ: u32 = 1;
pub const WRITE: u32 = 2;
pub const CREATE: u32 = 4;
pub const DELETE: u32 = 8;
pub const ADMIN: u32 = 16;
pub const ALL: u32 = READ | WRITE | CREATE | DELETE | ADMIN;

/// True for an identity an ACL entry or `--superuser` may name:
/// `world:anyone`, `user:NAME`, `x509:CN`, `digest:NAME:HASH` (the server
/// and the CLI check with the same rule).
pub fn valid_identity(id: &str) -> bool {
    id == "world:anyone"
        || id.strip_prefix("user:").is_some_and(|n| !n.is_empty())
        || id.strip_prefix("x509:").is_some_and(|n| !n.is_empty())
        || id.strip_prefix("digest:").is_some_and(valid_digest)
}

/// `NAME:HASH`, both non-empty, one `:` (ZooKeeper's `isValid`).
fn valid_digest(s: &str) -> bool {
    s.split_once(':').is_some_and(|(n, h)| !n.is_empty() && !h.is_empty() && !h.contains(':'))
}

/// Parses `user:alice:rwcda,world:anyone:r` (the CLI's form).
pub fn parse(s: &str) -> Result<Vec<Acl>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, perms) = part.rsplit_once(':').ok_or_else(|| format!("{part:?} is not ID:PERMS"))?;
        let mut mask = 0;
        for c in perms.chars() {
            mask |= match c {
                'r' => READ,
                'w' => WRITE,
                'c' => CREATE,
                'd' => DELETE,
                'a' => ADMIN,
                _ => return Err(format!("unknown permission {c:?} in {part:?} (r w c d a)")),
            };
        }
        out.push(Acl { perms: mask, id: id.to_string() });
    }
    Ok(out)
}

/// The CLI's form of an ACL entry.
pub fn format(a: &Acl) -> String {
    let mut p = String::new();
    for (bit, c) in [(READ, 'r'), (WRITE, 'w'), (CREATE, 'c'), (DELETE, 'd'), (ADMIN, 'a')] {
        if a.perms & bit != 0 {
            p.push(c);
        }
    }
    format!("{}:{p}", a.id)
}
