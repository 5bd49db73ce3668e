//! ZooKeeper's wire encoding (jute), for the ZooKeeper-compatible port.
//!
//! Jute is big-endian and untagged: `int` is 4 bytes, `long` 8, `boolean`
//! 1 (0 or 1), `buffer` and `ustring` an `int` length then the bytes (-1 is
//! null), `vector` an `int` count then the elements (-1 is null). A record
//! is its fields in order; nothing says where one ends, so the request
//! header's type decides how the rest of the frame is read.
//!
//! What this module promises (and the fuzz target `zk_frame` checks):
//! - Decoding never panics and never allocates more than the input could
//!   hold: a length or count is checked against the bytes left *before*
//!   anything is reserved, so a 12-byte frame cannot ask for 2 GiB.
//! - Every error is a [`JuteError`] that says what was being read and at
//!   which byte; the caller answers with ZooKeeper's `MARSHALLINGERROR` or
//!   closes the connection.
//! - A ustring that is not UTF-8 is refused (Java's client only sends
//!   UTF-8; a path that is not text has no meaning here).
//! - Decoding a request ignores bytes after its last field, as ZooKeeper's
//!   server does (old clients send fewer trailing fields, newer ones more:
//!   the connect request's `readOnly` flag is optional for that reason).
//!
//! What it does not do: framing (the 4-byte length before each frame is
//! [`crate::codec`]'s), and meaning (paths, versions, ACL rules and error
//! choice belong to the server's ZooKeeper listener).

use std::fmt;

/// A decoding failure: what was being read, at which byte of the frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JuteError {
    #[error("{what} at byte {at}: needs {need} bytes, {left} left")]
    Truncated { what: &'static str, at: usize, need: usize, left: usize },
    #[error("{what} at byte {at}: negative length {len}")]
    BadLength { what: &'static str, at: usize, len: i32 },
    #[error("{what} at byte {at}: not UTF-8")]
    NotUtf8 { what: &'static str, at: usize },
    #[error("{what} at byte {at}: boolean byte {byte} (0 or 1)")]
    BadBool { what: &'static str, at: usize, byte: u8 },
    #[error("{what}: null where a value is required")]
    Null { what: &'static str },
    #[error("unknown opcode {0}")]
    UnknownOp(i32),
    #[error("opcode {op} is not allowed inside a {within}")]
    NotInMulti { op: i32, within: &'static str },
    #[error("a multi of more than {0} operations")]
    TooManyOps(usize),
}

/// Reads jute fields from one frame.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Where the next field starts.
    pub fn pos(&self) -> usize {
        self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], JuteError> {
        if n > self.left() {
            return Err(JuteError::Truncated { what, at: self.pos, need: n, left: self.left() });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn int(&mut self, what: &'static str) -> Result<i32, JuteError> {
        let b = self.take(4, what)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn long(&mut self, what: &'static str) -> Result<i64, JuteError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    pub fn bool(&mut self, what: &'static str) -> Result<bool, JuteError> {
        let at = self.pos;
        match self.take(1, what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(JuteError::BadBool { what, at, byte }),
        }
    }

    /// A trailing boolean older peers leave out (then false): the connect
    /// frames' `readOnly`.
    pub fn trailing_bool(&mut self, what: &'static str) -> Result<bool, JuteError> {
        if self.left() > 0 {
            self.bool(what)
        } else {
            Ok(false)
        }
    }

    /// A length (or count) field: -1 is null, other negatives are refused,
    /// and a length longer than what is left cannot be right (every element
    /// takes at least `min_each` bytes).
    fn len(&mut self, what: &'static str, min_each: usize) -> Result<Option<usize>, JuteError> {
        let at = self.pos;
        let len = self.int(what)?;
        if len == -1 {
            return Ok(None);
        }
        if len < 0 {
            return Err(JuteError::BadLength { what, at, len });
        }
        let n = len as usize;
        let need = n.saturating_mul(min_each);
        if need > self.left() {
            return Err(JuteError::Truncated { what, at: self.pos, need, left: self.left() });
        }
        Ok(Some(n))
    }

    /// A `buffer`: `None` when null.
    pub fn buffer(&mut self, what: &'static str) -> Result<Option<&'a [u8]>, JuteError> {
        match self.len(what, 1)? {
            None => Ok(None),
            Some(n) => self.take(n, what).map(Some),
        }
    }

    /// A `buffer` where null means empty (node data, passwords).
    pub fn bytes(&mut self, what: &'static str) -> Result<Vec<u8>, JuteError> {
        Ok(self.buffer(what)?.map(<[u8]>::to_vec).unwrap_or_default())
    }

    /// A `ustring`: `None` when null.
    pub fn ustring(&mut self, what: &'static str) -> Result<Option<String>, JuteError> {
        let at = self.pos;
        match self.buffer(what)? {
            None => Ok(None),
            Some(b) => std::str::from_utf8(b).map(|s| Some(s.to_string())).map_err(|_| JuteError::NotUtf8 { what, at }),
        }
    }

    /// A `ustring` that must be there (a path).
    pub fn string(&mut self, what: &'static str) -> Result<String, JuteError> {
        self.ustring(what)?.ok_or(JuteError::Null { what })
    }

    /// A `vector`, each element read by `f` (at least `min_each` bytes).
    /// Null reads as empty.
    pub fn vector<T>(
        &mut self,
        what: &'static str,
        min_each: usize,
        mut f: impl FnMut(&mut Self) -> Result<T, JuteError>,
    ) -> Result<Vec<T>, JuteError> {
        let n = self.len(what, min_each.max(1))?.unwrap_or(0);
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(f(self)?);
        }
        Ok(v)
    }

    /// A `vector<ustring>` (null reads as empty).
    pub fn strings(&mut self, what: &'static str) -> Result<Vec<String>, JuteError> {
        self.vector(what, 4, |r| r.string(what))
    }
}

/// Writes jute fields into a frame.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Writer::default()
    }
    pub fn int(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn long(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.buf.push(v as u8);
        self
    }
    pub fn buffer(&mut self, v: &[u8]) -> &mut Self {
        self.int(v.len() as i32);
        self.buf.extend_from_slice(v);
        self
    }
    pub fn null(&mut self) -> &mut Self {
        self.int(-1)
    }
    pub fn string(&mut self, v: &str) -> &mut Self {
        self.buffer(v.as_bytes())
    }
    pub fn strings(&mut self, v: &[String]) -> &mut Self {
        self.int(v.len() as i32);
        for s in v {
            self.string(s);
        }
        self
    }
}

/// ZooKeeper's opcodes (`ZooDefs.OpCode`).
pub mod op {
    pub const NOTIFICATION: i32 = 0;
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_ACL: i32 = 6;
    pub const SET_ACL: i32 = 7;
    pub const GET_CHILDREN: i32 = 8;
    pub const SYNC: i32 = 9;
    pub const PING: i32 = 11;
    pub const GET_CHILDREN2: i32 = 12;
    pub const CHECK: i32 = 13;
    pub const MULTI: i32 = 14;
    pub const CREATE2: i32 = 15;
    pub const RECONFIG: i32 = 16;
    pub const CHECK_WATCHES: i32 = 17;
    pub const REMOVE_WATCHES: i32 = 18;
    pub const CREATE_CONTAINER: i32 = 19;
    pub const DELETE_CONTAINER: i32 = 20;
    pub const CREATE_TTL: i32 = 21;
    pub const MULTI_READ: i32 = 22;
    pub const AUTH: i32 = 100;
    pub const SET_WATCHES: i32 = 101;
    pub const SASL: i32 = 102;
    pub const GET_EPHEMERALS: i32 = 103;
    pub const GET_ALL_CHILDREN_NUMBER: i32 = 104;
    pub const SET_WATCHES2: i32 = 105;
    pub const ADD_WATCH: i32 = 106;
    pub const WHO_AM_I: i32 = 107;
    pub const CREATE_SESSION: i32 = -10;
    pub const CLOSE_SESSION: i32 = -11;
    pub const ERROR: i32 = -1;
}

/// ZooKeeper's error codes (`KeeperException.Code`), as sent in a reply
/// header's `err`.
pub mod err {
    pub const OK: i32 = 0;
    pub const SYSTEM_ERROR: i32 = -1;
    pub const RUNTIME_INCONSISTENCY: i32 = -2;
    pub const DATA_INCONSISTENCY: i32 = -3;
    pub const CONNECTION_LOSS: i32 = -4;
    pub const MARSHALLING_ERROR: i32 = -5;
    pub const UNIMPLEMENTED: i32 = -6;
    pub const OPERATION_TIMEOUT: i32 = -7;
    pub const BAD_ARGUMENTS: i32 = -8;
    pub const UNKNOWN_SESSION: i32 = -12;
    pub const API_ERROR: i32 = -100;
    pub const NO_NODE: i32 = -101;
    pub const NO_AUTH: i32 = -102;
    pub const BAD_VERSION: i32 = -103;
    pub const NO_CHILDREN_FOR_EPHEMERALS: i32 = -108;
    pub const NODE_EXISTS: i32 = -110;
    pub const NOT_EMPTY: i32 = -111;
    pub const SESSION_EXPIRED: i32 = -112;
    pub const INVALID_CALLBACK: i32 = -113;
    pub const INVALID_ACL: i32 = -114;
    pub const AUTH_FAILED: i32 = -115;
    pub const SESSION_MOVED: i32 = -118;
    pub const NOT_READ_ONLY: i32 = -119;
    pub const NO_WATCHER: i32 = -121;
    pub const REQUEST_TIMEOUT: i32 = -122;
    pub const QUOTA_EXCEEDED: i32 = -125;
    pub const THROTTLED_OP: i32 = -127;
}

/// The special xids of server-sent frames.
pub mod xid {
    /// A watch notification.
    pub const NOTIFICATION: i32 = -1;
    /// A ping's answer.
    pub const PING: i32 = -2;
    /// An auth packet's answer.
    pub const AUTH: i32 = -4;
    /// `setWatches` (the client library sends it with this xid).
    pub const SET_WATCHES: i32 = -8;
}

/// A node's `Stat` (jute `org.apache.zookeeper.data.Stat`): 68 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub czxid: i64,
    pub mzxid: i64,
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    pub cversion: i32,
    pub aversion: i32,
    pub ephemeral_owner: i64,
    pub data_length: i32,
    pub num_children: i32,
    pub pzxid: i64,
}

impl Stat {
    pub const LEN: usize = 68;

    pub fn read(r: &mut Reader<'_>) -> Result<Stat, JuteError> {
        Ok(Stat {
            czxid: r.long("stat.czxid")?,
            mzxid: r.long("stat.mzxid")?,
            ctime: r.long("stat.ctime")?,
            mtime: r.long("stat.mtime")?,
            version: r.int("stat.version")?,
            cversion: r.int("stat.cversion")?,
            aversion: r.int("stat.aversion")?,
            ephemeral_owner: r.long("stat.ephemeralOwner")?,
            data_length: r.int("stat.dataLength")?,
            num_children: r.int("stat.numChildren")?,
            pzxid: r.long("stat.pzxid")?,
        })
    }

    pub fn write(&self, w: &mut Writer) {
        w.long(self.czxid).long(self.mzxid).long(self.ctime).long(self.mtime);
        w.int(self.version).int(self.cversion).int(self.aversion);
        w.long(self.ephemeral_owner).int(self.data_length).int(self.num_children).long(self.pzxid);
    }
}

/// One ACL entry: permission bits for `scheme:id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub perms: i32,
    pub scheme: String,
    pub id: String,
}

/// ZooKeeper's permission bits (`ZooDefs.Perms`).
pub mod perms {
    pub const READ: i32 = 1;
    pub const WRITE: i32 = 2;
    pub const CREATE: i32 = 4;
    pub const DELETE: i32 = 8;
    pub const ADMIN: i32 = 16;
    pub const ALL: i32 = 31;
}

impl Acl {
    /// Smallest encoding: perms + two empty strings.
    const MIN_LEN: usize = 12;

    fn read(r: &mut Reader<'_>) -> Result<Acl, JuteError> {
        Ok(Acl { perms: r.int("acl.perms")?, scheme: r.string("acl.scheme")?, id: r.string("acl.id")? })
    }

    fn read_all(r: &mut Reader<'_>) -> Result<Vec<Acl>, JuteError> {
        r.vector("acl", Acl::MIN_LEN, Acl::read)
    }

    fn write_all(acl: &[Acl], w: &mut Writer) {
        w.int(acl.len() as i32);
        for a in acl {
            w.int(a.perms).string(&a.scheme).string(&a.id);
        }
    }
}

/// The first frame a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub protocol_version: i32,
    pub last_zxid_seen: i64,
    /// Requested session timeout, ms.
    pub timeout_ms: i32,
    /// 0 for a new session.
    pub session_id: i64,
    pub passwd: Vec<u8>,
    /// Absent from clients older than 3.4 (then false).
    pub read_only: bool,
}

impl ConnectRequest {
    pub fn decode(frame: &[u8]) -> Result<ConnectRequest, JuteError> {
        let mut r = Reader::new(frame);
        Ok(ConnectRequest {
            protocol_version: r.int("connect.protocolVersion")?,
            last_zxid_seen: r.long("connect.lastZxidSeen")?,
            timeout_ms: r.int("connect.timeOut")?,
            session_id: r.long("connect.sessionId")?,
            passwd: r.bytes("connect.passwd")?,
            read_only: r.trailing_bool("connect.readOnly")?,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.int(self.protocol_version).long(self.last_zxid_seen).int(self.timeout_ms).long(self.session_id);
        w.buffer(&self.passwd).bool(self.read_only);
        w.buf
    }
}

/// The server's answer to [`ConnectRequest`]. A session the server will
/// not resume is answered with timeout 0, session id 0 and an empty
/// password (the client then reports the session expired).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectResponse {
    pub protocol_version: i32,
    pub timeout_ms: i32,
    pub session_id: i64,
    pub passwd: Vec<u8>,
    pub read_only: bool,
}

impl ConnectResponse {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.int(self.protocol_version).int(self.timeout_ms).long(self.session_id).buffer(&self.passwd);
        w.bool(self.read_only);
        w.buf
    }

    pub fn decode(frame: &[u8]) -> Result<ConnectResponse, JuteError> {
        let mut r = Reader::new(frame);
        Ok(ConnectResponse {
            protocol_version: r.int("connect.protocolVersion")?,
            timeout_ms: r.int("connect.timeOut")?,
            session_id: r.long("connect.sessionId")?,
            passwd: r.bytes("connect.passwd")?,
            read_only: r.trailing_bool("connect.readOnly")?,
        })
    }
}

/// The header of every reply: the request's xid (or a special one), the
/// zxid the server had reached, and an error code (0 is OK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHeader {
    pub xid: i32,
    pub zxid: i64,
    pub err: i32,
}

impl ReplyHeader {
    pub fn write(&self, w: &mut Writer) {
        w.int(self.xid).long(self.zxid).int(self.err);
    }
    pub fn read(r: &mut Reader<'_>) -> Result<ReplyHeader, JuteError> {
        Ok(ReplyHeader { xid: r.int("reply.xid")?, zxid: r.long("reply.zxid")?, err: r.int("reply.err")? })
    }
}

/// ZooKeeper's watch event types (`Watcher.Event.EventType`).
pub mod event {
    pub const NONE: i32 = -1;
    pub const NODE_CREATED: i32 = 1;
    pub const NODE_DELETED: i32 = 2;
    pub const NODE_DATA_CHANGED: i32 = 3;
    pub const NODE_CHILDREN_CHANGED: i32 = 4;
    pub const DATA_WATCH_REMOVED: i32 = 5;
    pub const CHILD_WATCH_REMOVED: i32 = 6;
    pub const PERSISTENT_WATCH_REMOVED: i32 = 7;
    /// `KeeperState.SyncConnected`, the state every event is sent in.
    pub const SYNC_CONNECTED: i32 = 3;
}

/// `CreateMode` flags of a create request.
pub mod create_mode {
    pub const PERSISTENT: i32 = 0;
    pub const EPHEMERAL: i32 = 1;
    pub const PERSISTENT_SEQUENTIAL: i32 = 2;
    pub const EPHEMERAL_SEQUENTIAL: i32 = 3;
    pub const CONTAINER: i32 = 4;
    pub const PERSISTENT_WITH_TTL: i32 = 5;
    pub const PERSISTENT_SEQUENTIAL_WITH_TTL: i32 = 6;
}

/// `addWatch` modes.
pub mod watch_mode {
    pub const PERSISTENT: i32 = 0;
    pub const PERSISTENT_RECURSIVE: i32 = 1;
}

/// A create of any kind (`create`, `create2`, `createContainer`,
/// `createTTL`: the opcode says which reply the client expects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Create {
    pub path: String,
    pub data: Vec<u8>,
    pub acl: Vec<Acl>,
    pub flags: i32,
    /// Only for `createTTL`.
    pub ttl_ms: Option<i64>,
}

/// One request's body, by opcode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `create` (1), `create2` (15), `createContainer` (19), `createTTL` (21).
    Create {
        op: i32,
        c: Create,
    },
    Delete {
        path: String,
        version: i32,
    },
    Exists {
        path: String,
        watch: bool,
    },
    GetData {
        path: String,
        watch: bool,
    },
    SetData {
        path: String,
        data: Vec<u8>,
        version: i32,
    },
    GetAcl {
        path: String,
    },
    SetAcl {
        path: String,
        acl: Vec<Acl>,
        version: i32,
    },
    /// `getChildren` (8) or `getChildren2` (12, with the parent's stat).
    GetChildren {
        op: i32,
        path: String,
        watch: bool,
    },
    Sync {
        path: String,
    },
    Ping,
    Check {
        path: String,
        version: i32,
    },
    Multi(Vec<Request>),
    MultiRead(Vec<Request>),
    CheckWatches {
        path: String,
        kind: i32,
    },
    RemoveWatches {
        path: String,
        kind: i32,
    },
    Auth {
        kind: i32,
        scheme: String,
        auth: Vec<u8>,
    },
    /// `setWatches` (101) has no persistent lists; `setWatches2` (105) has.
    SetWatches {
        op: i32,
        relative_zxid: i64,
        data: Vec<String>,
        exist: Vec<String>,
        child: Vec<String>,
        persistent: Vec<String>,
        persistent_recursive: Vec<String>,
    },
    GetEphemerals {
        prefix: String,
    },
    GetAllChildrenNumber {
        path: String,
    },
    AddWatch {
        path: String,
        mode: i32,
    },
    WhoAmI,
    CloseSession,
    /// An opcode ZooKeeper defines that this port does not serve
    /// (`reconfig`, `deleteContainer`, `sasl`): its body is not read.
    Unsupported {
        op: i32,
    },
}

/// Most operations a `multi` may carry (ZooKeeper has no limit but the
/// frame size; the server's `--max-multi-ops` applies after decoding).
pub const MAX_MULTI_OPS: usize = 100_000;

impl Request {
    /// Decodes a request frame: the header (xid, opcode), then the body.
    pub fn decode(frame: &[u8]) -> Result<(i32, i32, Request), JuteError> {
        let mut r = Reader::new(frame);
        let xid = r.int("header.xid")?;
        let op = r.int("header.type")?;
        let req = Request::body(op, &mut r)?;
        Ok((xid, op, req))
    }

    /// The body of opcode `op`.
    pub fn body(op: i32, r: &mut Reader<'_>) -> Result<Request, JuteError> {
        use op::*;
        Ok(match op {
            CREATE | CREATE2 | CREATE_CONTAINER | CREATE_TTL => {
                let path = r.string("create.path")?;
                let data = r.bytes("create.data")?;
                let acl = Acl::read_all(r)?;
                let flags = r.int("create.flags")?;
                let ttl_ms = if op == CREATE_TTL { Some(r.long("create.ttl")?) } else { None };
                Request::Create { op, c: Create { path, data, acl, flags, ttl_ms } }
            }
            DELETE => Request::Delete { path: r.string("delete.path")?, version: r.int("delete.version")? },
            EXISTS => Request::Exists { path: r.string("exists.path")?, watch: r.bool("exists.watch")? },
            GET_DATA => Request::GetData { path: r.string("getData.path")?, watch: r.bool("getData.watch")? },
            SET_DATA => Request::SetData {
                path: r.string("setData.path")?,
                data: r.bytes("setData.data")?,
                version: r.int("setData.version")?,
            },
            GET_ACL => Request::GetAcl { path: r.string("getACL.path")? },
            SET_ACL => Request::SetAcl {
                path: r.string("setACL.path")?,
                acl: Acl::read_all(r)?,
                version: r.int("setACL.version")?,
            },
            GET_CHILDREN | GET_CHILDREN2 => {
                Request::GetChildren { op, path: r.string("getChildren.path")?, watch: r.bool("getChildren.watch")? }
            }
            SYNC => Request::Sync { path: r.string("sync.path")? },
            PING => Request::Ping,
            CHECK => Request::Check { path: r.string("check.path")?, version: r.int("check.version")? },
            MULTI => Request::Multi(multi_ops(
                r,
                "multi",
                &[CREATE, CREATE2, CREATE_CONTAINER, CREATE_TTL, DELETE, SET_DATA, CHECK],
            )?),
            MULTI_READ => Request::MultiRead(multi_ops(r, "multiRead", &[GET_CHILDREN, GET_DATA])?),
            CHECK_WATCHES => {
                Request::CheckWatches { path: r.string("checkWatches.path")?, kind: r.int("checkWatches.type")? }
            }
            REMOVE_WATCHES => {
                Request::RemoveWatches { path: r.string("removeWatches.path")?, kind: r.int("removeWatches.type")? }
            }
            AUTH => Request::Auth {
                kind: r.int("auth.type")?,
                scheme: r.string("auth.scheme")?,
                auth: r.bytes("auth.auth")?,
            },
            SET_WATCHES | SET_WATCHES2 => {
                let relative_zxid = r.long("setWatches.relativeZxid")?;
                let data = r.strings("setWatches.dataWatches")?;
                let exist = r.strings("setWatches.existWatches")?;
                let child = r.strings("setWatches.childWatches")?;
                let (persistent, persistent_recursive) = if op == SET_WATCHES2 {
                    (r.strings("setWatches.persistentWatches")?, r.strings("setWatches.persistentRecursiveWatches")?)
                } else {
                    (Vec::new(), Vec::new())
                };
                Request::SetWatches { op, relative_zxid, data, exist, child, persistent, persistent_recursive }
            }
            GET_EPHEMERALS => Request::GetEphemerals { prefix: r.string("getEphemerals.prefixPath")? },
            GET_ALL_CHILDREN_NUMBER => Request::GetAllChildrenNumber { path: r.string("getAllChildrenNumber.path")? },
            ADD_WATCH => Request::AddWatch { path: r.string("addWatch.path")?, mode: r.int("addWatch.mode")? },
            WHO_AM_I => Request::WhoAmI,
            CLOSE_SESSION => Request::CloseSession,
            RECONFIG | DELETE_CONTAINER | SASL => Request::Unsupported { op },
            other => return Err(JuteError::UnknownOp(other)),
        })
    }

    /// The opcode this request is sent with.
    pub fn op(&self) -> i32 {
        use op::*;
        match self {
            Request::Create { op, .. }
            | Request::GetChildren { op, .. }
            | Request::SetWatches { op, .. }
            | Request::Unsupported { op } => *op,
            Request::Delete { .. } => DELETE,
            Request::Exists { .. } => EXISTS,
            Request::GetData { .. } => GET_DATA,
            Request::SetData { .. } => SET_DATA,
            Request::GetAcl { .. } => GET_ACL,
            Request::SetAcl { .. } => SET_ACL,
            Request::Sync { .. } => SYNC,
            Request::Ping => PING,
            Request::Check { .. } => CHECK,
            Request::Multi(_) => MULTI,
            Request::MultiRead(_) => MULTI_READ,
            Request::CheckWatches { .. } => CHECK_WATCHES,
            Request::RemoveWatches { .. } => REMOVE_WATCHES,
            Request::Auth { .. } => AUTH,
            Request::GetEphemerals { .. } => GET_EPHEMERALS,
            Request::GetAllChildrenNumber { .. } => GET_ALL_CHILDREN_NUMBER,
            Request::AddWatch { .. } => ADD_WATCH,
            Request::WhoAmI => WHO_AM_I,
            Request::CloseSession => CLOSE_SESSION,
        }
    }

    /// Encodes header and body (what a client sends; the tests and the
    /// harness's byte-level checks use it).
    pub fn encode(&self, xid: i32) -> Vec<u8> {
        let mut w = Writer::new();
        w.int(xid).int(self.op());
        self.write_body(&mut w);
        w.buf
    }

    fn write_body(&self, w: &mut Writer) {
        match self {
            Request::Create { c, .. } => {
                w.string(&c.path).buffer(&c.data);
                Acl::write_all(&c.acl, w);
                w.int(c.flags);
                if let Some(t) = c.ttl_ms {
                    w.long(t);
                }
            }
            Request::Delete { path, version } | Request::Check { path, version } => {
                w.string(path).int(*version);
            }
            Request::Exists { path, watch }
            | Request::GetData { path, watch }
            | Request::GetChildren { path, watch, .. } => {
                w.string(path).bool(*watch);
            }
            Request::SetData { path, data, version } => {
                w.string(path).buffer(data).int(*version);
            }
            Request::GetAcl { path }
            | Request::Sync { path }
            | Request::GetAllChildrenNumber { path }
            | Request::GetEphemerals { prefix: path } => {
                w.string(path);
            }
            Request::SetAcl { path, acl, version } => {
                w.string(path);
                Acl::write_all(acl, w);
                w.int(*version);
            }
            Request::Multi(ops) | Request::MultiRead(ops) => {
                for o in ops {
                    w.int(o.op()).bool(false).int(-1);
                    o.write_body(w);
                }
                w.int(-1).bool(true).int(-1);
            }
            Request::CheckWatches { path, kind } | Request::RemoveWatches { path, kind } => {
                w.string(path).int(*kind);
            }
            Request::Auth { kind, scheme, auth } => {
                w.int(*kind).string(scheme).buffer(auth);
            }
            Request::SetWatches { op, relative_zxid, data, exist, child, persistent, persistent_recursive } => {
                w.long(*relative_zxid).strings(data).strings(exist).strings(child);
                if *op == op::SET_WATCHES2 {
                    w.strings(persistent).strings(persistent_recursive);
                }
            }
            Request::AddWatch { path, mode } => {
                w.string(path).int(*mode);
            }
            Request::Ping | Request::WhoAmI | Request::CloseSession | Request::Unsupported { .. } => {}
        }
    }
}

/// The operations of a `multi` or `multiRead`: a `MultiHeader` (type,
/// done, err) before each, and one with `done` set at the end.
fn multi_ops(r: &mut Reader<'_>, within: &'static str, allowed: &[i32]) -> Result<Vec<Request>, JuteError> {
    let mut ops = Vec::new();
    loop {
        let op = r.int("multi.type")?;
        let done = r.bool("multi.done")?;
        let _err = r.int("multi.err")?;
        if done {
            return Ok(ops);
        }
        if !allowed.contains(&op) {
            return Err(JuteError::NotInMulti { op, within });
        }
        if ops.len() >= MAX_MULTI_OPS {
            return Err(JuteError::TooManyOps(MAX_MULTI_OPS));
        }
        ops.push(Request::body(op, r)?);
    }
}

/// One result of a `multi` or `multiRead`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// `create`: the path created (with its sequence suffix).
    Create {
        path: String,
    },
    /// `create2`, `createContainer`, `createTTL`: the path and its stat.
    Create2 {
        path: String,
        stat: Stat,
    },
    SetData {
        stat: Stat,
    },
    Delete,
    Check,
    GetChildren {
        children: Vec<String>,
    },
    GetData {
        data: Vec<u8>,
        stat: Stat,
    },
    /// This operation's error (0 for the operations before the failed one
    /// in a failed `multi`; `RUNTIME_INCONSISTENCY` after it).
    Error {
        err: i32,
    },
}

/// One reply's body (after the [`ReplyHeader`]). An error reply has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Empty,
    /// `create`, `sync`: one string.
    Path(String),
    /// `create2` and friends.
    PathStat(String, Stat),
    /// `exists`, `setData`, `setACL`.
    Stat(Stat),
    GetData {
        data: Vec<u8>,
        stat: Stat,
    },
    GetAcl {
        acl: Vec<Acl>,
        stat: Stat,
    },
    /// `getChildren`, `getEphemerals`: a list.
    Children(Vec<String>),
    Children2 {
        children: Vec<String>,
        stat: Stat,
    },
    Number(i32),
    Multi(Vec<OpResult>),
    /// `whoAmI`: (scheme, id) pairs.
    WhoAmI(Vec<(String, String)>),
    /// `addWatch`: an `ErrorResponse` (the code again, 0).
    Code(i32),
}

impl Response {
    /// A whole reply frame: header, then the body when `err` is OK.
    pub fn encode(header: ReplyHeader, body: &Response) -> Vec<u8> {
        let mut w = Writer::new();
        header.write(&mut w);
        if header.err == err::OK {
            body.write(&mut w);
        }
        w.buf
    }

    fn write(&self, w: &mut Writer) {
        match self {
            Response::Empty => {}
            Response::Path(p) => {
                w.string(p);
            }
            Response::PathStat(p, s) => {
                w.string(p);
                s.write(w);
            }
            Response::Stat(s) => s.write(w),
            Response::GetData { data, stat } => {
                w.buffer(data);
                stat.write(w);
            }
            Response::GetAcl { acl, stat } => {
                Acl::write_all(acl, w);
                stat.write(w);
            }
            Response::Children(c) => {
                w.strings(c);
            }
            Response::Children2 { children, stat } => {
                w.strings(children);
                stat.write(w);
            }
            Response::Number(n) | Response::Code(n) => {
                w.int(*n);
            }
            Response::Multi(results) => {
                for res in results {
                    let (op, errc) = match res {
                        OpResult::Create { .. } => (op::CREATE, 0),
                        OpResult::Create2 { .. } => (op::CREATE2, 0),
                        OpResult::SetData { .. } => (op::SET_DATA, 0),
                        OpResult::Delete => (op::DELETE, 0),
                        OpResult::Check => (op::CHECK, 0),
                        OpResult::GetChildren { .. } => (op::GET_CHILDREN, 0),
                        OpResult::GetData { .. } => (op::GET_DATA, 0),
                        OpResult::Error { err } => (op::ERROR, *err),
                    };
                    w.int(op).bool(false).int(errc);
                    match res {
                        OpResult::Create { path } => {
                            w.string(path);
                        }
                        OpResult::Create2 { path, stat } => {
                            w.string(path);
                            stat.write(w);
                        }
                        OpResult::SetData { stat } => stat.write(w),
                        OpResult::GetChildren { children } => {
                            w.strings(children);
                        }
                        OpResult::GetData { data, stat } => {
                            w.buffer(data);
                            stat.write(w);
                        }
                        OpResult::Error { err } => {
                            w.int(*err);
                        }
                        OpResult::Delete | OpResult::Check => {}
                    }
                }
                w.int(-1).bool(true).int(-1);
            }
            Response::WhoAmI(ids) => {
                w.int(ids.len() as i32);
                for (scheme, id) in ids {
                    w.string(scheme).string(id);
                }
            }
        }
    }

    /// Decodes the body of a reply to opcode `op` (what a client does; the
    /// tests use it to check what the server sends).
    pub fn decode_body(op: i32, r: &mut Reader<'_>) -> Result<Response, JuteError> {
        use op::*;
        Ok(match op {
            CREATE | SYNC => Response::Path(r.string("reply.path")?),
            CREATE2 | CREATE_CONTAINER | CREATE_TTL => Response::PathStat(r.string("reply.path")?, Stat::read(r)?),
            EXISTS | SET_DATA | SET_ACL => Response::Stat(Stat::read(r)?),
            GET_DATA => Response::GetData { data: r.bytes("reply.data")?, stat: Stat::read(r)? },
            GET_ACL => Response::GetAcl { acl: Acl::read_all(r)?, stat: Stat::read(r)? },
            GET_CHILDREN | GET_EPHEMERALS => Response::Children(r.strings("reply.children")?),
            GET_CHILDREN2 => Response::Children2 { children: r.strings("reply.children")?, stat: Stat::read(r)? },
            GET_ALL_CHILDREN_NUMBER => Response::Number(r.int("reply.totalNumber")?),
            MULTI | MULTI_READ => {
                let mut results = Vec::new();
                loop {
                    let op = r.int("multi.type")?;
                    let done = r.bool("multi.done")?;
                    let _err = r.int("multi.err")?;
                    if done {
                        break;
                    }
                    results.push(match op {
                        CREATE => OpResult::Create { path: r.string("multi.path")? },
                        CREATE2 | CREATE_CONTAINER | CREATE_TTL => {
                            OpResult::Create2 { path: r.string("multi.path")?, stat: Stat::read(r)? }
                        }
                        SET_DATA => OpResult::SetData { stat: Stat::read(r)? },
                        DELETE => OpResult::Delete,
                        CHECK => OpResult::Check,
                        GET_CHILDREN => OpResult::GetChildren { children: r.strings("multi.children")? },
                        GET_DATA => OpResult::GetData { data: r.bytes("multi.data")?, stat: Stat::read(r)? },
                        ERROR => OpResult::Error { err: r.int("multi.err")? },
                        other => return Err(JuteError::NotInMulti { op: other, within: "multi reply" }),
                    });
                }
                Response::Multi(results)
            }
            WHO_AM_I => Response::WhoAmI(r.vector("whoAmI", 8, |r| Ok((r.string("id.scheme")?, r.string("id.id")?)))?),
            ADD_WATCH => Response::Code(r.int("reply.err")?),
            _ => Response::Empty,
        })
    }
}

/// A watch notification frame (xid -1): what happened, in state
/// SyncConnected, to which path.
pub fn notification(zxid: i64, kind: i32, path: &str) -> Vec<u8> {
    let mut w = Writer::new();
    ReplyHeader { xid: xid::NOTIFICATION, zxid, err: err::OK }.write(&mut w);
    w.int(kind).int(event::SYNC_CONNECTED).string(path);
    w.buf
}

/// A watch notification, decoded: (event type, keeper state, path).
pub fn decode_notification(r: &mut Reader<'_>) -> Result<(i32, i32, String), JuteError> {
    Ok((r.int("event.type")?, r.int("event.state")?, r.string("event.path")?))
}

impl fmt::Display for Create {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "create {} (flags {}, {} bytes)", self.path, self.flags, self.data.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `create` as ZooKeeper 3.8's Java client sends it for
    /// `zk.create("/a", "hi".getBytes(), OPEN_ACL_UNSAFE, EPHEMERAL_SEQUENTIAL)`
    /// with xid 1 (laid out by hand from the jute definitions: header,
    /// path, data, one ACL world:anyone with perms 31, flags 3).
    const CREATE_BYTES: &[u8] = &[
        0, 0, 0, 1, // xid 1
        0, 0, 0, 1, // type create
        0, 0, 0, 2, b'/', b'a', // path
        0, 0, 0, 2, b'h', b'i', // data
        0, 0, 0, 1, // one ACL
        0, 0, 0, 31, // perms ALL
        0, 0, 0, 5, b'w', b'o', b'r', b'l', b'd', // scheme
        0, 0, 0, 6, b'a', b'n', b'y', b'o', b'n', b'e', // id
        0, 0, 0, 3, // flags EPHEMERAL_SEQUENTIAL
    ];

    #[test]
    fn a_create_decodes_field_by_field_and_encodes_back_to_the_same_bytes() {
        let (xid, op, req) = Request::decode(CREATE_BYTES).expect("decode");
        assert_eq!((xid, op), (1, op::CREATE));
        let want = Request::Create {
            op: op::CREATE,
            c: Create {
                path: "/a".into(),
                data: b"hi".to_vec(),
                acl: vec![Acl { perms: perms::ALL, scheme: "world".into(), id: "anyone".into() }],
                flags: create_mode::EPHEMERAL_SEQUENTIAL,
                ttl_ms: None,
            },
        };
        assert_eq!(req, want);
        assert_eq!(want.encode(1), CREATE_BYTES);
    }

    #[test]
    fn every_request_round_trips() {
        let s = |v: &str| v.to_string();
        let create = Create { path: s("/t"), data: vec![1, 2], acl: vec![], flags: 5, ttl_ms: Some(1000) };
        let all = vec![
            Request::Create { op: op::CREATE_TTL, c: create.clone() },
            Request::Create { op: op::CREATE2, c: Create { ttl_ms: None, ..create.clone() } },
            Request::Delete { path: s("/a"), version: -1 },
            Request::Exists { path: s("/a"), watch: true },
            Request::GetData { path: s("/a"), watch: false },
            Request::SetData { path: s("/a"), data: vec![9; 10], version: 3 },
            Request::GetAcl { path: s("/a") },
            Request::SetAcl {
                path: s("/a"),
                acl: vec![Acl { perms: 1, scheme: s("digest"), id: s("u:h") }],
                version: 0,
            },
            Request::GetChildren { op: op::GET_CHILDREN2, path: s("/"), watch: true },
            Request::Sync { path: s("/") },
            Request::Ping,
            Request::Check { path: s("/a"), version: 2 },
            Request::Multi(vec![
                Request::Create { op: op::CREATE, c: Create { ttl_ms: None, ..create.clone() } },
                Request::Delete { path: s("/b"), version: 0 },
                Request::Check { path: s("/c"), version: 1 },
            ]),
            Request::MultiRead(vec![
                Request::GetData { path: s("/a"), watch: false },
                Request::GetChildren { op: op::GET_CHILDREN, path: s("/a"), watch: false },
            ]),
            Request::CheckWatches { path: s("/a"), kind: 1 },
            Request::RemoveWatches { path: s("/a"), kind: 3 },
            Request::Auth { kind: 0, scheme: s("digest"), auth: b"u:p".to_vec() },
            Request::SetWatches {
                op: op::SET_WATCHES2,
                relative_zxid: 7,
                data: vec![s("/d")],
                exist: vec![],
                child: vec![s("/c")],
                persistent: vec![s("/p")],
                persistent_recursive: vec![s("/r")],
            },
            Request::GetEphemerals { prefix: s("/") },
            Request::GetAllChildrenNumber { path: s("/") },
            Request::AddWatch { path: s("/a"), mode: watch_mode::PERSISTENT_RECURSIVE },
            Request::WhoAmI,
            Request::CloseSession,
            Request::Unsupported { op: op::RECONFIG },
        ];
        for (i, req) in all.into_iter().enumerate() {
            let bytes = req.encode(i as i32);
            let (xid, op, back) = Request::decode(&bytes).unwrap_or_else(|e| panic!("{req:?}: {e}"));
            assert_eq!((xid, op), (i as i32, req.op()));
            assert_eq!(back, req);
        }
    }

    #[test]
    fn connect_request_with_and_without_the_read_only_flag() {
        let c = ConnectRequest {
            protocol_version: 0,
            last_zxid_seen: 42,
            timeout_ms: 30_000,
            session_id: 0,
            passwd: vec![0; 16],
            read_only: true,
        };
        let bytes = c.encode();
        assert_eq!(bytes.len(), 4 + 8 + 4 + 8 + 4 + 16 + 1);
        assert_eq!(ConnectRequest::decode(&bytes), Ok(c.clone()));
        // A pre-3.4 client sends no readOnly byte.
        let old = ConnectRequest::decode(&bytes[..bytes.len() - 1]).expect("old client");
        assert_eq!(old, ConnectRequest { read_only: false, ..c });
    }

    #[test]
    fn replies_decode_as_a_client_reads_them() {
        let stat =
            Stat { czxid: 5, mzxid: 6, version: 2, data_length: 3, num_children: 1, pzxid: 7, ..Stat::default() };
        let cases = [
            (op::CREATE, Response::Path("/a0000000001".into())),
            (op::CREATE2, Response::PathStat("/a".into(), stat)),
            (op::EXISTS, Response::Stat(stat)),
            (op::GET_DATA, Response::GetData { data: b"abc".to_vec(), stat }),
            (
                op::GET_ACL,
                Response::GetAcl { acl: vec![Acl { perms: 31, scheme: "world".into(), id: "anyone".into() }], stat },
            ),
            (op::GET_CHILDREN, Response::Children(vec!["x".into(), "y".into()])),
            (op::GET_CHILDREN2, Response::Children2 { children: vec!["x".into()], stat }),
            (op::GET_ALL_CHILDREN_NUMBER, Response::Number(12)),
            (
                op::MULTI,
                Response::Multi(vec![
                    OpResult::Create { path: "/m".into() },
                    OpResult::Create2 { path: "/n".into(), stat },
                    OpResult::SetData { stat },
                    OpResult::Delete,
                    OpResult::Check,
                    OpResult::Error { err: err::NO_NODE },
                ]),
            ),
            (
                op::MULTI_READ,
                Response::Multi(vec![
                    OpResult::GetData { data: vec![1], stat },
                    OpResult::GetChildren { children: vec!["c".into()] },
                ]),
            ),
            (op::WHO_AM_I, Response::WhoAmI(vec![("ip".into(), "127.0.0.1".into())])),
            (op::ADD_WATCH, Response::Code(0)),
        ];
        for (op, body) in cases {
            let h = ReplyHeader { xid: 9, zxid: 100, err: 0 };
            let bytes = Response::encode(h, &body);
            let mut r = Reader::new(&bytes);
            assert_eq!(ReplyHeader::read(&mut r), Ok(h));
            assert_eq!(Response::decode_body(op, &mut r), Ok(body.clone()), "op {op}");
            assert_eq!(r.left(), 0, "op {op}: trailing bytes");
        }
        // An error reply is the header alone: 16 bytes.
        let e = Response::encode(ReplyHeader { xid: 3, zxid: 1, err: err::NO_NODE }, &Response::Empty);
        assert_eq!(e.len(), 16);
        // A notification: header with xid -1, then type, state, path.
        let n = notification(77, event::NODE_DELETED, "/a/b");
        let mut r = Reader::new(&n);
        assert_eq!(ReplyHeader::read(&mut r), Ok(ReplyHeader { xid: -1, zxid: 77, err: 0 }));
        assert_eq!(decode_notification(&mut r), Ok((event::NODE_DELETED, event::SYNC_CONNECTED, "/a/b".into())));
    }

    #[test]
    fn bad_input_is_a_typed_error_and_never_a_large_allocation() {
        // Every prefix of a valid create is truncated somewhere.
        for n in 0..CREATE_BYTES.len() {
            assert!(Request::decode(&CREATE_BYTES[..n]).is_err(), "prefix of {n} bytes decoded");
        }
        // A path claiming 2 GiB in a 16-byte frame.
        let mut huge = vec![0, 0, 0, 1, 0, 0, 0, 4];
        huge.extend_from_slice(&i32::MAX.to_be_bytes());
        huge.extend_from_slice(b"/abc");
        assert!(matches!(Request::decode(&huge), Err(JuteError::Truncated { what: "getData.path", .. })));
        // A children list claiming a billion entries.
        let mut many = Writer::new();
        many.int(0).int(op::SET_WATCHES).long(0).int(1_000_000_000);
        assert!(matches!(Request::decode(&many.buf), Err(JuteError::Truncated { .. })));
        // Negative lengths other than -1.
        let mut neg = Writer::new();
        neg.int(0).int(op::DELETE).int(-2);
        assert!(matches!(Request::decode(&neg.buf), Err(JuteError::BadLength { len: -2, .. })));
        // A null path.
        let mut null = Writer::new();
        null.int(0).int(op::DELETE).null().int(0);
        assert_eq!(Request::decode(&null.buf), Err(JuteError::Null { what: "delete.path" }));
        // Not UTF-8, a bad boolean, an unknown opcode, a read inside a multi.
        let mut bad = Writer::new();
        bad.int(0).int(op::EXISTS).buffer(&[0xff, 0xfe]).bool(false);
        assert!(matches!(Request::decode(&bad.buf), Err(JuteError::NotUtf8 { .. })));
        let mut b2 = Writer::new();
        b2.int(0).int(op::EXISTS).string("/a");
        b2.buf.push(7);
        assert!(matches!(Request::decode(&b2.buf), Err(JuteError::BadBool { byte: 7, .. })));
        let mut unk = Writer::new();
        unk.int(0).int(555);
        assert_eq!(Request::decode(&unk.buf), Err(JuteError::UnknownOp(555)));
        let mut m = Writer::new();
        m.int(0).int(op::MULTI).int(op::GET_DATA).bool(false).int(-1).string("/a").bool(false);
        assert!(matches!(Request::decode(&m.buf), Err(JuteError::NotInMulti { op: 4, within: "multi" })));
        // A multi that never ends is truncated, not an endless loop.
        let mut open = Writer::new();
        open.int(0).int(op::MULTI).int(op::CHECK).bool(false).int(-1).string("/a").int(0);
        assert!(matches!(Request::decode(&open.buf), Err(JuteError::Truncated { what: "multi.type", .. })));
    }

    #[test]
    fn trailing_bytes_after_the_last_field_are_ignored() {
        let mut b = Request::Sync { path: "/".into() }.encode(5);
        b.extend_from_slice(&[1, 2, 3]);
        assert_eq!(Request::decode(&b), Ok((5, op::SYNC, Request::Sync { path: "/".into() })));
    }
}
