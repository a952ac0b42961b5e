//! One-shot reading in pages (`feed=normal&limit=N` from the last sequence read), for readers
//! that gain from overlapping the source's work with theirs: a server that builds a normal
//! feed whole before sending it (pouchdb-server does) would otherwise leave the workers idle
//! until the last row is ready. `verify` reads this way; replications keep one streamed
//! request, whose checkpoints and retries are built around it. Pages ask for sparse row
//! sequences (`seq_interval`): only each page's `last_seq` is used.

use serde_json::Value;
use tokio::sync::mpsc;

use super::{Batch, Change, ChangesReader};
use crate::replication::error::Result;

impl ChangesReader {
    /// Reads the feed from `since` to its end, `page` rows per request, emitting batches of
    /// at most `worker_batch_size` changes. A page of fewer than `page` rows is the last.
    pub async fn run_paged(
        mut self,
        mut since: Value,
        page: usize,
        tx: mpsc::Sender<Batch>,
    ) -> Result<()> {
        let page = page.max(1);
        let max = self.opts.worker_batch_size.max(1);
        loop {
            let (rows, last) = self.read_normal_page(&since, page, true).await?;
            let full = rows.len() >= page;
            // Rows without their own sequence (`seq_interval`) are changes all the same: the
            // page's `last_seq` is what paging and the batches go by.
            let mut changes: Vec<Change> = rows
                .into_iter()
                .filter_map(|mut r| {
                    r.seq.get_or_insert(Value::Null);
                    self.to_change(r)
                })
                .collect();
            while !changes.is_empty() {
                let rest = changes.split_off(changes.len().min(max));
                let batch = std::mem::replace(&mut changes, rest);
                if !self.emit(&tx, batch, last.clone()).await {
                    return Ok(());
                }
            }
            // A full page whose sequence did not move would be read again forever.
            if !full || last == since {
                return Ok(());
            }
            since = last;
        }
    }
}
