//! The node tree: `create`, `get`, `set`, `rm`, `ls`, `stat`.
//!
//! A value comes from the DATA argument, from `--file FILE`, or from stdin
//! (DATA or FILE `-`), as bytes; `--hex` / `--base64` say it is written in
//! that encoding instead (see `output`). Nothing here is transactional
//! across nodes except what one request does: `rm -r` and `ls -R` walk a
//! subtree with one request per node, so they see (and say) concurrent
//! changes rather than a snapshot. `txn` is the atomic tool.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use baton_client::{Client, CreateOptions, Error, ErrorKind, Op, Reader, Stat as NodeStat};
use clap::Args;
use futures::stream::{self, StreamExt};
use serde_json::json;

use crate::output::{stat_json, stat_row, stat_text, Encoding, Out, STAT_HEADER};

/// Requests in flight at once when walking or deleting a subtree.
const TREE_CONCURRENCY: usize = 32;
/// `rm -r` passes before it gives up on a subtree that keeps growing: each
/// pass lists what is left and deletes it, deepest first.
const RM_PASSES: usize = 5;

/// Where a value comes from.
#[derive(Args, Debug)]
pub struct ValueSource {
    /// The value; `-` reads it from stdin.
    data: Option<String>,
    /// Read the value from FILE (`-`: stdin) instead of DATA.
    #[arg(long, value_name = "FILE", conflicts_with = "data")]
    file: Option<PathBuf>,
    #[command(flatten)]
    enc: Encoding,
}

impl ValueSource {
    /// The value's bytes (empty when none was given).
    fn read(&self) -> anyhow::Result<Vec<u8>> {
        let raw = match (&self.data, &self.file) {
            (Some(d), _) if d == "-" => read_stdin()?,
            (Some(d), _) => d.clone().into_bytes(),
            (None, Some(f)) if f.as_os_str() == "-" => read_stdin()?,
            (None, Some(f)) => std::fs::read(f).map_err(|e| anyhow::anyhow!("--file {}: {e}", f.display()))?,
            (None, None) => Vec::new(),
        };
        self.enc.decode(raw)
    }

    fn given(&self) -> bool {
        self.data.is_some() || self.file.is_some()
    }
}

fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::io::stdin().read_to_end(&mut buf).map_err(|e| anyhow::anyhow!("reading stdin: {e}"))?;
    Ok(buf)
}

/// The kind of `e`, if it is a client error.
pub fn code_of(e: &anyhow::Error) -> Option<ErrorKind> {
    e.downcast_ref::<Error>().map(Error::kind)
}

/// NO_NODE for `path`, as the server would say it.
fn no_node(path: &str) -> Error {
    Error::Server { kind: ErrorKind::NoNode, message: format!("{path} does not exist") }
}

/// `parent/name` (`/name` under the root).
pub fn child_path(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// How a node is created (`create`, and `create` in a `txn`).
#[derive(Args, Debug)]
pub struct CreateFlags {
    /// Delete the node when this command's session ends (right after it exits).
    #[arg(long)]
    ephemeral: bool,
    /// Append a 10-digit, per-parent, increasing counter to the name.
    #[arg(long)]
    sequential: bool,
    /// Create missing parents (persistent, empty).
    #[arg(long)]
    parents: bool,
    /// A container node: the cluster deletes it once its last child goes
    /// (persistent: not with --ephemeral).
    #[arg(long, conflicts_with = "ephemeral")]
    container: bool,
    /// A TTL node: the cluster deletes it once it has no children and its
    /// data has not changed for MS milliseconds (at least 1; a persistent
    /// node: not with --ephemeral or --container).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..),
          conflicts_with_all = ["ephemeral", "container"])]
    ttl: Option<u64>,
}

impl CreateFlags {
    pub fn options(&self) -> CreateOptions {
        let mut o = match (self.container, self.ephemeral) {
            (true, _) => CreateOptions::container(),
            (false, true) => CreateOptions::ephemeral(),
            (false, false) => CreateOptions::persistent(),
        };
        if self.sequential {
            o = o.sequential();
        }
        if self.parents {
            o = o.with_parents();
        }
        if let Some(ms) = self.ttl {
            o = o.with_ttl(std::time::Duration::from_millis(ms));
        }
        o
    }
}

/// Create a node; its value from DATA, --file or stdin (default: empty).
#[derive(Args, Debug)]
pub struct Create {
    /// The node's absolute path (with --sequential, the prefix of its name).
    #[arg(value_parser = crate::parse_path_prefix)]
    path: String,
    #[command(flatten)]
    value: ValueSource,
    #[command(flatten)]
    flags: CreateFlags,
    /// ACL, e.g. `user:alice:rwcda,world:anyone:r` (default: the parent's).
    #[arg(long)]
    acl: Option<String>,
}

impl Create {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        let opts = self.flags.options();
        let acl = match &self.acl {
            Some(a) => baton_client::acl::parse(a).map_err(|e| crate::usage(format!("--acl: {e}")))?,
            None => Vec::new(),
        };
        let (path, stat) = c.create_with_acl(&self.path, self.value.read()?, opts, acl).await?;
        out.emit(json!({"path": path, "stat": stat_json(&stat)}), &path);
        Ok(())
    }
}

/// Print a node's value (and a newline).
#[derive(Args, Debug)]
pub struct Get {
    /// The node's path.
    #[arg(value_parser = crate::parse_path)]
    path: String,
    /// Serve from the member's local state, without a ReadIndex round
    /// (faster; works without a quorum; may lag the leader).
    #[arg(long)]
    stale: bool,
    /// Write the value to FILE, exactly (no newline added; with --hex or
    /// --base64, encoded), instead of printing it.
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
    #[command(flatten)]
    enc: Encoding,
}

impl Get {
    /// `--stale`: answered from one member's state, also without a quorum.
    pub fn stale(&self) -> bool {
        self.stale
    }
}

impl Get {
    pub async fn run(self, c: &Reader, out: Out) -> anyhow::Result<()> {
        let (data, stat) = c.get(&self.path, self.stale).await?;
        if let Some(f) = &self.file {
            write_file(f, &self.enc.encode(&data))?;
            let meta = json!({"path": self.path, "file": f, "bytes": data.len(), "stat": stat_json(&stat)});
            out.emit(meta, "");
        } else if out.json {
            out.emit(self.enc.json_with(&data, json!({"path": self.path, "stat": stat_json(&stat)})), "");
        } else {
            self.enc.print_line(&data)?;
        }
        Ok(())
    }
}

fn write_file(f: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(f, bytes).map_err(|e| anyhow::anyhow!("--file {}: {e}", f.display()))
}

/// Set a node's value, from DATA, --file or stdin.
#[derive(Args, Debug)]
#[command(mut_arg("data", |a| a.required_unless_present("file").help("The value; `-` reads it from stdin (required unless --file)")))]
pub struct Set {
    /// The node's path.
    #[arg(value_parser = crate::parse_path)]
    path: String,
    #[command(flatten)]
    value: ValueSource,
    /// Only if the node is at this version (compare-and-set).
    #[arg(long)]
    version: Option<i32>,
    /// RESOURCE=TOKEN: apply only if no higher token was used on RESOURCE
    /// (e.g. --fence counter=$BATON_FENCE_TOKEN).
    #[arg(long, value_name = "RESOURCE=TOKEN", value_parser = parse_fence)]
    fence: Option<(String, u64)>,
}

/// `RESOURCE=TOKEN`.
pub fn parse_fence(s: &str) -> Result<(String, u64), String> {
    let (resource, token) = s.rsplit_once('=').ok_or("want RESOURCE=TOKEN")?;
    let token = token.parse().map_err(|_| format!("token {token:?} is not a number"))?;
    Ok((resource.to_string(), token))
}

impl Set {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        debug_assert!(self.value.given(), "clap requires DATA or --file");
        let data = self.value.read()?;
        let stat = match self.fence {
            None => c.set(&self.path, data, self.version).await?,
            Some((resource, token)) => {
                let ops = [
                    Op::CheckFence { resource, token },
                    Op::Set { path: self.path.clone(), data: data.into(), version: self.version },
                ];
                c.multi(&ops).await?.pop().and_then(|r| r.stat).unwrap_or_default()
            }
        };
        out.emit(json!({"path": self.path, "stat": stat_json(&stat)}), format!("version {}", stat.version));
        Ok(())
    }
}

/// Delete a node; with -r, the node and everything under it.
#[derive(Args, Debug)]
pub struct Rm {
    /// The node's path.
    #[arg(value_parser = crate::parse_path)]
    path: String,
    /// Only if the node is at this version.
    #[arg(long, conflicts_with = "recursive")]
    version: Option<i32>,
    /// Delete the whole subtree, children first (zkCli's deleteall). Nodes
    /// created under it meanwhile are deleted too, for a few passes; then
    /// it gives up and says so.
    #[arg(short = 'r', long)]
    recursive: bool,
}

impl Rm {
    pub async fn run(self, c: &Client, out: Out) -> anyhow::Result<()> {
        if !self.recursive {
            c.delete(&self.path, self.version).await?;
            out.emit(json!({"deleted": self.path}), "");
            return Ok(());
        }
        if self.path == "/" {
            return Err(crate::usage("rm -r / would delete every node: delete the subtrees one by one"));
        }
        let n = delete_tree(c, &self.path).await?;
        out.emit(json!({"deleted": self.path, "nodes": n}), "");
        Ok(())
    }
}

/// The reads `get`, `ls`, `stat` and `rm -r` make: without a session (a
/// [`Reader`]: no Raft write, and `--stale` works without a quorum) or on
/// the session `rm -r` already has.
pub(crate) trait Look: Sync {
    async fn children_of(&self, path: &str, stale: bool) -> baton_client::Result<(Vec<String>, NodeStat)>;
    async fn stat_of(&self, path: &str, stale: bool) -> baton_client::Result<Option<NodeStat>>;
}

impl Look for Reader {
    async fn children_of(&self, path: &str, stale: bool) -> baton_client::Result<(Vec<String>, NodeStat)> {
        self.children(path, stale).await
    }
    async fn stat_of(&self, path: &str, stale: bool) -> baton_client::Result<Option<NodeStat>> {
        self.exists(path, stale).await
    }
}

impl Look for Client {
    async fn children_of(&self, path: &str, stale: bool) -> baton_client::Result<(Vec<String>, NodeStat)> {
        self.children_opts(path, stale).await
    }
    /// Linearizable whatever `stale` says (only `rm -r` reads this way).
    async fn stat_of(&self, path: &str, _stale: bool) -> baton_client::Result<Option<NodeStat>> {
        self.exists(path).await
    }
}

/// One node of a walked subtree.
pub struct Node {
    pub path: String,
    pub stat: NodeStat,
}

/// Every node of the subtree at `root` with its stat, parents before
/// children, siblings in name order. Listed level by level, up to
/// [`TREE_CONCURRENCY`] requests at once; nodes deleted meanwhile are left
/// out, nodes created meanwhile may or may not be in. NO_NODE if `root`
/// does not exist.
pub(crate) async fn walk(c: &impl Look, root: &str, stale: bool) -> anyhow::Result<Vec<Node>> {
    let (kids, stat) = c.children_of(root, stale).await?;
    let mut found: BTreeMap<String, (NodeStat, Vec<String>)> = BTreeMap::from([(root.to_string(), (stat, kids))]);
    let mut level = vec![root.to_string()];
    while !level.is_empty() {
        let next: Vec<String> =
            level.iter().flat_map(|p| found[p].1.iter().map(|k| child_path(p, k)).collect::<Vec<_>>()).collect();
        let listed: Vec<_> = stream::iter(next)
            .map(|p| async move { (c.children_of(&p, stale).await, p) })
            .buffered(TREE_CONCURRENCY)
            .collect()
            .await;
        level = Vec::new();
        for (r, p) in listed {
            match r {
                Ok((kids, stat)) => {
                    found.insert(p.clone(), (stat, kids));
                    level.push(p);
                }
                Err(e) if e.is_no_node() => {}
                Err(e) => return Err(anyhow::Error::new(e).context(format!("listing {p}"))),
            }
        }
    }
    let mut nodes = Vec::with_capacity(found.len());
    let mut stack = vec![root.to_string()];
    while let Some(path) = stack.pop() {
        let Some((stat, kids)) = found.remove(&path) else { continue };
        stack.extend(kids.iter().rev().map(|k| child_path(&path, k)));
        nodes.push(Node { path, stat });
    }
    Ok(nodes)
}

/// Deletes `root` and its subtree, deepest nodes first, each level with
/// up to [`TREE_CONCURRENCY`] deletes at once; returns how many this call
/// deleted. A node that gained a child meanwhile (NOT_EMPTY) starts another
/// pass; after [`RM_PASSES`] it gives up, naming the subtree.
pub async fn delete_tree(c: &Client, root: &str) -> anyhow::Result<usize> {
    let mut deleted = 0;
    for pass in 1..=RM_PASSES {
        let nodes = match walk(c, root, false).await {
            Ok(nodes) => nodes,
            // Gone after a first pass: someone else finished the job.
            Err(e) if pass > 1 && code_of(&e) == Some(ErrorKind::NoNode) => return Ok(deleted),
            Err(e) => return Err(e),
        };
        let mut levels: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for n in nodes {
            levels.entry(n.path.matches('/').count()).or_default().push(n.path);
        }
        match delete_levels(c, levels).await {
            (n, Ok(true)) => return Ok(deleted + n),
            (n, Ok(false)) => deleted += n,
            (_, Err(e)) => return Err(e),
        }
    }
    anyhow::bail!(
        "rm -r {root}: nodes kept appearing under it (concurrent creates); stopped after {RM_PASSES} passes \
         ({deleted} nodes deleted)"
    )
}

/// Deletes each level, deepest first: (deleted, Ok(true)) when all went,
/// Ok(false) when a node was not empty (another pass is needed).
async fn delete_levels(c: &Client, levels: BTreeMap<usize, Vec<String>>) -> (usize, anyhow::Result<bool>) {
    let mut deleted = 0;
    for (_, level) in levels.into_iter().rev() {
        let results: Vec<_> = stream::iter(level)
            .map(|p| async move { (c.delete(&p, None).await, p) })
            .buffer_unordered(TREE_CONCURRENCY)
            .collect()
            .await;
        let mut not_empty = false;
        for (r, p) in results {
            match r.map_err(|e| (e.kind(), e)) {
                Ok(()) => deleted += 1,
                Err((ErrorKind::NoNode, _)) => {}
                Err((ErrorKind::NotEmpty, _)) => not_empty = true,
                Err((_, e)) => return (deleted, Err(anyhow::Error::new(e).context(format!("deleting {p}")))),
            }
        }
        if not_empty {
            return (deleted, Ok(false));
        }
    }
    (deleted, Ok(true))
}

/// List a node's children (names); -R: the whole subtree (paths).
#[derive(Args, Debug)]
pub struct Ls {
    /// The node's path.
    #[arg(value_parser = crate::parse_path)]
    path: String,
    /// The node and every node under it, as full paths, parents first.
    #[arg(short = 'R', long)]
    recursive: bool,
    /// With each node's version, size, children count, mtime and ephemeral owner.
    #[arg(short = 'l', long)]
    stat: bool,
    /// Serve from the member's local state, without a ReadIndex round
    /// (works without a quorum; may lag the leader).
    #[arg(long)]
    stale: bool,
}

impl Ls {
    /// `--stale`: answered from one member's state, also without a quorum.
    pub fn stale(&self) -> bool {
        self.stale
    }
}

impl Ls {
    pub async fn run(self, c: &Reader, out: Out) -> anyhow::Result<()> {
        let nodes = match (self.recursive, self.stat) {
            (true, _) => walk(c, &self.path, self.stale).await?,
            (false, true) => children_with_stats(c, &self.path, self.stale).await?,
            (false, false) => {
                let (kids, _) = c.children(&self.path, self.stale).await?;
                out.emit(json!({"path": self.path, "children": kids}), kids.join("\n"));
                return Ok(());
            }
        };
        if self.stat && !out.json {
            println!("{STAT_HEADER}");
        }
        for n in nodes {
            let shown = if self.recursive { n.path.as_str() } else { n.path.rsplit('/').next().unwrap_or_default() };
            match self.stat {
                true => out.emit(json!({"path": n.path, "stat": stat_json(&n.stat)}), stat_row(&n.stat, shown)),
                false => out.emit(json!({"path": n.path}), shown),
            }
        }
        Ok(())
    }
}

/// `path`'s children with their stats (children deleted meanwhile left out).
async fn children_with_stats(c: &Reader, path: &str, stale: bool) -> anyhow::Result<Vec<Node>> {
    let (kids, _) = c.children(path, stale).await?;
    Ok(stats_of(c, path, kids, stale).await?)
}

/// The children `names` of `parent` with their stats, in the same order,
/// read up to [`TREE_CONCURRENCY`] at once; the ones gone meanwhile left out.
pub(crate) async fn stats_of(
    c: &impl Look,
    parent: &str,
    names: Vec<String>,
    stale: bool,
) -> baton_client::Result<Vec<Node>> {
    let stats: Vec<_> = stream::iter(names)
        .map(|k| async move {
            let p = child_path(parent, &k);
            (c.stat_of(&p, stale).await, p)
        })
        .buffered(TREE_CONCURRENCY)
        .collect()
        .await;
    let mut nodes = Vec::new();
    for (r, p) in stats {
        if let Some(stat) = r? {
            nodes.push(Node { path: p, stat });
        }
    }
    Ok(nodes)
}

/// Print a node's stat: versions, times (RFC 3339 UTC and ms), ephemeral
/// owner (a session id, hex), size, children.
#[derive(Args, Debug)]
pub struct Stat {
    /// The node's path.
    #[arg(value_parser = crate::parse_path)]
    path: String,
    /// Serve from the member's local state, without a ReadIndex round
    /// (works without a quorum; may lag the leader).
    #[arg(long)]
    stale: bool,
}

impl Stat {
    /// `--stale`: answered from one member's state, also without a quorum.
    pub fn stale(&self) -> bool {
        self.stale
    }
}

impl Stat {
    pub async fn run(self, c: &Reader, out: Out) -> anyhow::Result<()> {
        let s = c.exists(&self.path, self.stale).await?.ok_or_else(|| no_node(&self.path))?;
        out.emit(json!({"path": self.path, "stat": stat_json(&s)}), stat_text(&s));
        Ok(())
    }
}
