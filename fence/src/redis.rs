//! Redis, fenced: [`RedisFence::fenced`] runs a list of write commands in
//! one server-side script that first checks and records the token.
//!
//! The script (Lua, run by `EVALSHA`, atomic like every Redis script):
//! `KEYS[1]` is the resource's fence key (`<prefix><resource>`, default
//! prefix `baton:fence:`), `ARGV[1]` the token in decimal, then the writes,
//! each as its argument count and its arguments. If the key holds a larger
//! number, it returns `{0, current}` and runs nothing; otherwise it sets the
//! key to the token, runs the writes in order and returns `{1, replies}`.
//! Tokens are compared as numbers (by length, then digits: Lua's doubles
//! are exact only to 2^53).
//!
//! Like `MULTI`/`EXEC`, a write that fails (a wrong type, say) does not
//! undo the ones before it; the token is recorded first, so a partly applied
//! write is still fenced against older holders. The fence is as durable as
//! Redis is configured to be: without `appendfsync always`, a Redis restart
//! can lose recorded tokens along with the data. Keys the writes touch are
//! passed as arguments, not declared keys: this is for one Redis server (a
//! Redis Cluster would need every key in the fence key's slot).

pub use ::redis;
use redis::aio::ConnectionLike;
use redis::{Script, Value};

use crate::{parse_token, FenceError};

const SCRIPT: &str = r#"
local tok = ARGV[1]
local cur = redis.call('GET', KEYS[1])
if cur and (#cur > #tok or (#cur == #tok and cur > tok)) then
  return {0, cur}
end
redis.call('SET', KEYS[1], tok)
local out = {}
local i = 2
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local cmd = {}
  for j = 1, n do cmd[j] = ARGV[i + j] end
  out[#out + 1] = redis.call(unpack(cmd))
  i = i + n + 1
end
return {1, out}
"#;

/// One write command: its name and arguments, as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write(Vec<Vec<u8>>);

impl Write {
    /// A command, e.g. `Write::new(["SET", "stock", "41"])`.
    pub fn new<I, A>(args: I) -> Write
    where
        I: IntoIterator<Item = A>,
        A: AsRef<[u8]>,
    {
        Write(args.into_iter().map(|a| a.as_ref().to_vec()).collect())
    }
}

/// Fence keys under one prefix.
#[derive(Debug, Clone)]
pub struct RedisFence {
    prefix: String,
    script: Script,
}

impl Default for RedisFence {
    fn default() -> Self {
        RedisFence::with_prefix("baton:fence:")
    }
}

impl RedisFence {
    /// Fence keys `baton:fence:<resource>`.
    pub fn new() -> RedisFence {
        RedisFence::default()
    }

    /// Fence keys `<prefix><resource>`.
    pub fn with_prefix(prefix: &str) -> RedisFence {
        RedisFence { prefix: prefix.into(), script: Script::new(SCRIPT) }
    }

    /// The fence key of `resource`.
    pub fn key(&self, resource: &str) -> String {
        format!("{}{resource}", self.prefix)
    }

    /// Runs `writes` if `token` is not stale for `resource` (the module
    /// doc); their replies, in order.
    pub async fn fenced<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        resource: &str,
        token: u64,
        writes: &[Write],
    ) -> Result<Vec<Value>, FenceError> {
        if writes.iter().any(|w| w.0.is_empty()) {
            return Err(FenceError::Invalid("a fenced write has no command".into()));
        }
        let mut inv = self.script.key(self.key(resource));
        inv.arg(token.to_string());
        for w in writes {
            inv.arg(w.0.len());
            for a in &w.0 {
                inv.arg(a.as_slice());
            }
        }
        let reply: Value = inv.invoke_async(conn).await?;
        let Value::Array(parts) = reply else {
            return Err(FenceError::Invalid(format!("the fence script answered {reply:?}")));
        };
        match parts.as_slice() {
            [Value::Int(1), Value::Array(replies)] => Ok(replies.clone()),
            [Value::Int(1)] => Ok(Vec::new()), // an empty table ends the array
            [Value::Int(0), Value::BulkString(cur)] => {
                let current = parse_token(resource, &String::from_utf8_lossy(cur))?;
                Err(FenceError::Stale { resource: resource.into(), token, current })
            }
            other => Err(FenceError::Invalid(format!("the fence script answered {other:?}"))),
        }
    }

    /// The highest token `resource` has accepted; None if none.
    pub async fn current<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        resource: &str,
    ) -> Result<Option<u64>, FenceError> {
        let v: Option<String> = redis::cmd("GET").arg(self.key(resource)).query_async(conn).await?;
        v.map(|s| parse_token(resource, &s)).transpose()
    }
}
