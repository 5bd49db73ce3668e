//! One batch-and-flush writer, shared by client connections (listener.rs)
//! and peer links (transport.rs).
//!
//! Rule: wait for the first queued message, then take what is already
//! queued behind it, up to `max`, write them all and flush once. A
//! pipelining client's replies and a burst of Raft messages cost one flush
//! per batch, not one per message, and a lone message is never held back
//! waiting for company.

use bytes::Bytes;
use futures::SinkExt;
use tokio::io::AsyncWrite;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::codec::{FramedWrite, LengthDelimitedCodec};

/// What one kind of connection does with its queued items.
pub trait Outbox {
    /// What the driver queues.
    type Item;
    /// The frame to write for `item`, or `None` to skip it.
    fn frame(&mut self, item: Self::Item) -> Option<Bytes>;
    /// After each batch, with whether it was written and flushed.
    fn flushed(&mut self, _ok: bool) {}
}

/// How one batch went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    /// Written and flushed.
    Written,
    /// The connection failed while writing.
    Failed,
    /// The queue closed (its senders are gone): nothing more will come.
    Closed,
}

/// Writes one batch from `rx` to `w` (see the module doc).
pub async fn write_batch<O, W>(
    w: &mut FramedWrite<W, LengthDelimitedCodec>,
    rx: &mut UnboundedReceiver<O::Item>,
    max: usize,
    out: &mut O,
) -> Batch
where
    O: Outbox,
    W: AsyncWrite + Unpin,
{
    let Some(first) = rx.recv().await else { return Batch::Closed };
    let mut next = Some(first);
    let mut taken = 0;
    let mut ok = true;
    while let Some(item) = next.take() {
        if let Some(bytes) = out.frame(item) {
            if w.feed(bytes).await.is_err() {
                ok = false;
                break;
            }
        }
        taken += 1;
        if taken < max {
            next = rx.try_recv().ok();
        }
    }
    ok = ok && SinkExt::<Bytes>::flush(w).await.is_ok();
    out.flushed(ok);
    if ok {
        Batch::Written
    } else {
        Batch::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tokio_util::codec::FramedRead;

    struct Counted(Vec<bool>);
    impl Outbox for Counted {
        type Item = u8;
        fn frame(&mut self, item: u8) -> Option<Bytes> {
            (item != 0).then(|| Bytes::from(vec![item]))
        }
        fn flushed(&mut self, ok: bool) {
            self.0.push(ok);
        }
    }

    #[tokio::test]
    async fn queued_items_go_out_in_batches_of_at_most_max_with_one_flush_each() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut w = FramedWrite::new(a, baton_proto::codec(1024));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in [1u8, 2, 0, 3, 4] {
            tx.send(i).expect("send");
        }
        let mut out = Counted(Vec::new());
        assert_eq!(write_batch(&mut w, &mut rx, 3, &mut out).await, Batch::Written);
        assert_eq!(write_batch(&mut w, &mut rx, 3, &mut out).await, Batch::Written);
        drop(tx);
        assert_eq!(write_batch(&mut w, &mut rx, 3, &mut out).await, Batch::Closed);
        assert_eq!(out.0, [true, true], "one flush per batch");
        drop(w);
        let got: Vec<u8> = FramedRead::new(b, baton_proto::codec(1024)).map(|f| f.expect("frame")[0]).collect().await;
        assert_eq!(got, [1, 2, 3, 4], "the skipped item is not written; order kept");
    }
}
