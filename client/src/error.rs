//! Errors, and how to tell them apart.
//!
//! Rules:
//! - Every error is definite (nothing was applied) except
//!   [`ErrorKind::Ambiguous`]: a write was sent and no answer came back, so
//!   it may have been applied. Check before retrying it by hand; the client
//!   already retried it with the same sequence number (exactly-once).
//! - A server refusal keeps the server's reason as an [`ErrorKind`]; match
//!   it with [`Error::kind`] or the `is_*` helpers, never on the message
//!   text (it is for people and may change).
//! - [`ErrorKind`] is `#[non_exhaustive]`: a newer server may add reasons;
//!   match with a `_` arm.

use baton_proto::ErrorCode;

/// Why an operation failed, flat and easy to match (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The node (or its parent, for a create) does not exist.
    NoNode,
    /// A node with that path already exists.
    NodeExists,
    /// The node's version (or ACL version) is not the one expected.
    BadVersion,
    /// The node has children, so it cannot be deleted.
    NotEmpty,
    /// Ephemeral nodes cannot have children.
    NoChildrenForEphemerals,
    /// The session expired or was closed; create a new client.
    SessionExpired,
    /// The path is not valid (see `baton_proto::validate_path`).
    InvalidPath,
    /// The data, the request or the reply is over a limit.
    TooLarge,
    /// The server could not decode the request (a newer protocol?).
    BadRequest,
    /// No leader is known right now (retried until the deadline first).
    NoLeader,
    /// The member is overloaded (retried until the deadline first).
    Busy,
    /// The session's secret did not match (another client owns it).
    SessionMoved,
    /// A retried write's reply was already acknowledged.
    StaleSequence,
    /// The member is shutting down (retried elsewhere first).
    ShuttingDown,
    /// A higher fencing token was already used on the resource.
    FenceRejected,
    /// This client's identity is missing or not allowed (TLS, password,
    /// ACL), or this client refused a member's certificate.
    NoAuth,
    /// Membership changes go to the leader; the message names it.
    NotLeader,
    /// The member gave up waiting (for a read: nothing happened).
    Timeout,
    /// Leadership changed while the request was in flight (for a read:
    /// nothing happened).
    LeaderChanged,
    /// A server-side failure, or an answer this client did not expect.
    Internal,
    /// A write was sent and no answer came in time: it may have been
    /// applied.
    Ambiguous,
    /// No member could serve the request in time; it was not applied.
    Unavailable,
    /// A bad argument, caught before sending.
    InvalidArgument,
    /// The client was closed.
    Closed,
}

impl ErrorKind {
    /// The kind for a server's error code (`None` for OK).
    pub(crate) fn from_code(code: ErrorCode) -> Option<ErrorKind> {
        use ErrorCode as C;
        Some(match code {
            C::Ok => return None,
            C::NoNode => ErrorKind::NoNode,
            C::NodeExists => ErrorKind::NodeExists,
            C::BadVersion => ErrorKind::BadVersion,
            C::NotEmpty => ErrorKind::NotEmpty,
            C::NoChildrenForEphemerals => ErrorKind::NoChildrenForEphemerals,
            C::SessionExpired => ErrorKind::SessionExpired,
            C::InvalidPath => ErrorKind::InvalidPath,
            C::TooLarge => ErrorKind::TooLarge,
            C::BadRequest => ErrorKind::BadRequest,
            C::NoLeader => ErrorKind::NoLeader,
            C::Busy => ErrorKind::Busy,
            C::SessionMoved => ErrorKind::SessionMoved,
            C::StaleSequence => ErrorKind::StaleSequence,
            C::ShuttingDown => ErrorKind::ShuttingDown,
            C::FenceRejected => ErrorKind::FenceRejected,
            C::NoAuth => ErrorKind::NoAuth,
            C::NotLeader => ErrorKind::NotLeader,
            C::Timeout => ErrorKind::Timeout,
            C::LeaderChanged => ErrorKind::LeaderChanged,
            C::Internal => ErrorKind::Internal,
        })
    }

    /// The kind for a raw wire code (unknown codes are `Internal`).
    pub(crate) fn from_wire(code: i32) -> Option<ErrorKind> {
        Self::from_code(ErrorCode::try_from(code).unwrap_or(ErrorCode::Internal))
    }
}

/// An operation's failure. Match it with [`Error::kind`] or the `is_*`
/// helpers; [`Error::is_ambiguous`] is the one that matters for writes.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server refused the request; nothing changed.
    #[error("{kind:?}: {message}")]
    Server {
        /// Why.
        kind: ErrorKind,
        /// The server's explanation, for people.
        message: String,
    },
    /// A write was sent and no answer came in time: it may or may not have
    /// been applied.
    #[error("outcome unknown (the write may have been applied): {0}")]
    Ambiguous(String),
    /// The session expired or was closed; create a new client.
    #[error("session expired")]
    SessionExpired,
    /// No member could serve the request in time; it was not applied.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Bad argument, caught before sending.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The cluster refused this client's identity (no or a wrong TLS
    /// certificate, a plaintext client on a TLS port, an ACL), or this
    /// client refused a member's certificate. Nothing was applied.
    #[error("not authorized: {0}")]
    NoAuth(String),
    /// The client was closed.
    #[error("client closed")]
    Closed,
}

impl Error {
    /// A server refusal of `kind`.
    pub(crate) fn server(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error::Server { kind, message: message.into() }
    }

    /// An answer this client did not expect (a server bug or a mismatch).
    pub(crate) fn unexpected() -> Error {
        Error::server(ErrorKind::Internal, "unexpected response body")
    }

    /// Why it failed, as one flat kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Server { kind, .. } => *kind,
            Error::Ambiguous(_) => ErrorKind::Ambiguous,
            Error::SessionExpired => ErrorKind::SessionExpired,
            Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::Invalid(_) => ErrorKind::InvalidArgument,
            Error::NoAuth(_) => ErrorKind::NoAuth,
            Error::Closed => ErrorKind::Closed,
        }
    }

    /// True when the operation may have been applied despite the error.
    pub fn is_ambiguous(&self) -> bool {
        self.kind() == ErrorKind::Ambiguous
    }
    /// The node does not exist.
    pub fn is_no_node(&self) -> bool {
        self.kind() == ErrorKind::NoNode
    }
    /// The node already exists.
    pub fn is_node_exists(&self) -> bool {
        self.kind() == ErrorKind::NodeExists
    }
    /// The version did not match.
    pub fn is_bad_version(&self) -> bool {
        self.kind() == ErrorKind::BadVersion
    }
    /// The node has children.
    pub fn is_not_empty(&self) -> bool {
        self.kind() == ErrorKind::NotEmpty
    }
    /// The session is gone: make a new client.
    pub fn is_session_expired(&self) -> bool {
        self.kind() == ErrorKind::SessionExpired
    }
    /// No member could serve it in time (nothing was applied).
    pub fn is_unavailable(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }
    /// This client's identity is missing or not allowed.
    pub fn is_no_auth(&self) -> bool {
        self.kind() == ErrorKind::NoAuth
    }
    /// A higher fencing token was already used on the resource.
    pub fn is_fence_rejected(&self) -> bool {
        self.kind() == ErrorKind::FenceRejected
    }
}

/// A `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wire_code_but_ok_has_a_kind_and_only_timeouts_of_writes_are_ambiguous() {
        for code in 0..64 {
            let Ok(c) = ErrorCode::try_from(code) else { continue };
            assert_eq!(ErrorKind::from_code(c).is_none(), c == ErrorCode::Ok, "{c:?}");
        }
        assert_eq!(ErrorKind::from_wire(9999), Some(ErrorKind::Internal));
        let e = Error::server(ErrorKind::NoNode, "x");
        assert!(e.is_no_node() && !e.is_ambiguous() && !e.is_node_exists());
        assert!(Error::Ambiguous("t".into()).is_ambiguous());
        assert!(Error::SessionExpired.is_session_expired());
    }
}
