//! ACL entries: `acl::parse("user:alice:rwcda,world:anyone:r")` and
//! [`format`]. The rule (who may do what, how entries are inherited) lives
//! in server/src/acl.rs; the syntax in `baton_proto::acl`.

pub use baton_proto::acl::{ADMIN, ALL, CREATE, DELETE, READ, WRITE};

use crate::Acl;

pub use baton_proto::acl::valid_identity;

/// Parses `ID:PERMS[,ID:PERMS...]` (PERMS a subset of `rwcda`).
pub fn parse(s: &str) -> Result<Vec<Acl>, String> {
    Ok(baton_proto::acl::parse(s)?.into_iter().map(Acl::from).collect())
}

/// `ID:PERMS`, as [`parse`] reads it.
pub fn format(a: &Acl) -> String {
    baton_proto::acl::format(&a.to_wire())
}
