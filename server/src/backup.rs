//! Backups: `baton snapshot save FILE` and `batond restore FILE`.
//!
//! Saving: the client asks any member for a snapshot (`SnapshotReq` with
//! `backup_id` 0). The member takes it after a ReadIndex, like a
//! linearizable read, so it holds every write acknowledged before the
//! request was sent: it checkpoints the state as applied then, and its
//! snapshot thread encodes that checkpoint (syncer.rs), so the driver
//! thread spends nothing on it (it took 1.3-1.9 s of it at a million
//! nodes); it keeps those bytes (one backup at a time per member)
//! and hands them out in chunks of [`CHUNK`] bytes with the SHA-256 of the
//! whole. Handing out the last chunk lets them go (a fetch of it again, or
//! of any chunk, is then NO_NODE: start again), so a member does not carry
//! its last backup (144 MB at a million nodes) until the next one. The client checks the digest and writes a `BackupFile`. A backup
//! holds every node (whatever its ACL), the fences, the cluster record,
//! password hashes (salted PBKDF2) and the sessions, but no session's
//! secret or cached replies (`StateMachine::backup`): no one holding the
//! file can resume or close a session of the live cluster. With
//! `--superuser` set, only a superuser may take one.
//!
//! Restoring ([`restore`]) builds the data dir of a new one-member cluster:
//! the saved state at the saved index and term, a configuration of that one
//! member, a new cluster id (given or random), no `joined` members and no
//! recorded addresses (the member reports its own). The log goes on from
//! the saved index, so fencing tokens and zxids keep growing past every
//! token handed out before the backup. The member starts with `--peers
//! ID=ADDR` and the cluster grows with `baton member add`.
//!
//! Sessions in the backup are restored with new random secrets that no
//! client knows: they expire after their timeout, with their ephemerals.
//!
//! `--cluster-id` must differ from the backup's own: a restored cluster
//! with the old id, grown with `member add`, could admit a member of the
//! old cluster with the same id as a voter.

use baton_proto::{BackupFile, ClusterRecord, ErrorCode, SnapshotChunk};
use prost::Message as _;
use rand::Rng;

use crate::kv::Kv;
use crate::raft_store::RaftStore;
use crate::state::StateMachine;

/// Bytes per chunk.
pub const CHUNK: usize = 4 << 20;

pub fn sha256(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, data).as_ref().to_vec()
}

/// The backup a member took last, kept for its chunks to be fetched until
/// its last chunk is (or the next backup replaces it; one at a time).
pub struct Taken {
    pub id: u64,
    pub index: u64,
    pub term: u64,
    sha: Vec<u8>,
    data: Vec<u8>,
}

impl Taken {
    /// `data`: the state (`StateMachine::backup`) applied at `index`, of `term`.
    pub fn new(id: u64, index: u64, term: u64, data: Vec<u8>) -> Taken {
        Taken { id, index, term, sha: sha256(&data), data }
    }

    /// [`Taken::new`] with `data`'s SHA-256 computed already (off the
    /// driver, syncer.rs `build_backup`).
    pub fn built(id: u64, index: u64, term: u64, data: Vec<u8>, sha: Vec<u8>) -> Taken {
        Taken { id, index, term, sha, data }
    }

    /// The chunk of backup `backup_id` at `offset` (at most [`CHUNK`]
    /// bytes; empty at the end). Err: NO_NODE when this is not that backup
    /// (fetched to its end, or another was taken since: start again),
    /// BAD_REQUEST past the end.
    pub fn chunk(
        this: Option<&Taken>,
        backup_id: u64,
        offset: u64,
        cluster_id: &str,
    ) -> Result<SnapshotChunk, (ErrorCode, String)> {
        let Some(b) = this.filter(|b| b.id == backup_id) else {
            let msg = format!(
                "backup {backup_id:#x} is gone from this member (fetched to its end, or another was taken); start again"
            );
            return Err((ErrorCode::NoNode, msg));
        };
        let total = b.data.len() as u64;
        if offset > total {
            return Err((ErrorCode::BadRequest, format!("offset {offset} is past {total}")));
        }
        let end = (offset as usize + CHUNK).min(b.data.len());
        Ok(SnapshotChunk {
            backup_id,
            index: b.index,
            term: b.term,
            total,
            offset,
            data: bytes::Bytes::copy_from_slice(&b.data[offset as usize..end]),
            sha256: b.sha.clone().into(),
            cluster_id: cluster_id.to_string(),
        })
    }
}

impl Taken {
    /// [`Taken::chunk`] from the member's kept backup; the chunk that
    /// reaches the end lets the backup go (module doc).
    pub fn hand_out(
        kept: &mut Option<Taken>,
        backup_id: u64,
        offset: u64,
        cluster_id: &str,
    ) -> Result<SnapshotChunk, (ErrorCode, String)> {
        let chunk = Taken::chunk(kept.as_ref(), backup_id, offset, cluster_id)?;
        if chunk.offset + chunk.data.len() as u64 == chunk.total {
            *kept = None;
        }
        Ok(chunk)
    }
}

/// Checks a backup file's version and digest.
pub fn decode(bytes: &[u8]) -> Result<BackupFile, String> {
    let f = BackupFile::decode(bytes).map_err(|e| format!("not a Baton backup: {e}"))?;
    if f.version != 1 {
        return Err(format!("backup version {} (this batond reads version 1)", f.version));
    }
    if sha256(&f.state) != f.sha256 {
        return Err("the backup's checksum does not match: the file is corrupt".into());
    }
    Ok(f)
}

/// Builds a new one-member cluster in the fresh store `kv` from a backup;
/// returns the new cluster id.
pub fn restore(kv: &dyn Kv, file: &BackupFile, id: u64, cluster_id: Option<String>) -> anyhow::Result<String> {
    if !RaftStore::is_fresh(kv)? {
        anyhow::bail!("the data dir is not empty: restore builds a new member from nothing");
    }
    let mut sm = StateMachine::new();
    sm.restore(&file.state)?;
    if sm.applied() != file.index {
        anyhow::bail!("the backup's state is at {} but its header says {}", sm.applied(), file.index);
    }
    if cluster_id.as_deref().is_some_and(|c| c == file.cluster_id) {
        anyhow::bail!(
            "--cluster-id {} is the backup's own cluster id: a restored cluster needs a new one, so members of \
             the old cluster are refused (leave --cluster-id out for a random one)",
            file.cluster_id
        );
    }
    sm.rekey_sessions(&mut rand::thread_rng());
    let cluster_id = cluster_id.unwrap_or_else(|| format!("{:032x}", rand::thread_rng().gen::<u128>()));
    sm.replace_cluster(ClusterRecord { cluster_id: cluster_id.clone(), index: file.index, ..Default::default() });
    RaftStore::found_at(kv, &[id], file.index, file.term.max(1), sm.snapshot())?;
    Ok(cluster_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_backup_is_handed_out_in_chunks_until_another_replaces_it() {
        let data: Vec<u8> = (0..CHUNK + 10).map(|i| i as u8).collect();
        let b = Taken::new(7, 40, 3, data.clone());
        let first = Taken::chunk(Some(&b), 7, 0, "c").expect("first chunk");
        assert_eq!((first.index, first.term, first.total, first.data.len()), (40, 3, data.len() as u64, CHUNK));
        assert_eq!(first.sha256.as_ref(), sha256(&data).as_slice());
        let last = Taken::chunk(Some(&b), 7, CHUNK as u64, "c").expect("last chunk");
        assert_eq!(&last.data[..], &data[CHUNK..]);
        let end = Taken::chunk(Some(&b), 7, data.len() as u64, "c").expect("the end");
        assert!(end.data.is_empty());
        let past = Taken::chunk(Some(&b), 7, data.len() as u64 + 1, "c");
        assert!(matches!(past, Err((ErrorCode::BadRequest, _))));
        assert!(matches!(Taken::chunk(Some(&b), 8, 0, "c"), Err((ErrorCode::NoNode, _))), "another backup's id");
        assert!(matches!(Taken::chunk(None, 7, 0, "c"), Err((ErrorCode::NoNode, _))), "none taken here");
    }

    #[test]
    fn handing_out_the_last_chunk_lets_the_backup_go() {
        let data: Vec<u8> = (0..CHUNK + 10).map(|i| i as u8).collect();
        let mut kept = Some(Taken::new(7, 40, 3, data.clone()));
        let first = Taken::hand_out(&mut kept, 7, 0, "c").expect("first chunk");
        assert_eq!(first.data.len(), CHUNK);
        assert!(kept.is_some(), "kept while chunks remain");
        let again = Taken::hand_out(&mut kept, 7, 0, "c").expect("a chunk fetched again");
        assert_eq!(again.data, first.data);
        let last = Taken::hand_out(&mut kept, 7, CHUNK as u64, "c").expect("last chunk");
        assert_eq!(&last.data[..], &data[CHUNK..]);
        assert!(kept.is_none(), "the last chunk lets it go");
        let gone = Taken::hand_out(&mut kept, 7, CHUNK as u64, "c");
        assert!(matches!(gone, Err((ErrorCode::NoNode, m)) if m.contains("fetched to its end")));
        // A backup of one chunk goes with its first.
        let mut small = Some(Taken::new(8, 41, 3, vec![1, 2, 3]));
        assert_eq!(Taken::hand_out(&mut small, 8, 0, "c").expect("whole").data.len(), 3);
        assert!(small.is_none());
    }
}
