//! Shared change watches: one continuous `_changes` connection per watched database (and
//! credentials), whose changes wake every continuous job reading that database.
//!
//! A continuous job that holds its own `feed=continuous` request keeps a socket open for as
//! long as it runs, so a node running 500 jobs on one source holds 500 sockets that carry
//! nothing but heartbeats. Instead, a job reads the feed in normal requests and, once caught
//! up, waits on the database's [`Watch`]: the first job to watch a database starts a task
//! that follows its continuous feed (see `watch_follower.rs`); each change it sees bumps a
//! [`Tick`], and the waiting jobs read again from their own sequence with their own filter.
//! A watch is shared only between equal endpoints (URL, credentials and headers), so no job
//! learns of changes through credentials it was not given. The task ends (closing its
//! socket) when the last job watching the database lets go.
//!
//! This module only keeps the table and the ticks; it does not know HTTP, so the client can
//! hold a table without the two modules importing each other.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::replication::endpoint::database::Endpoint;

/// What a watch has seen so far. Jobs compare two ticks: more `changes` means the database
/// changed (read again, or only if a changed document is one the job reads, see
/// [`Watch::any_changed`]); more `blind` means the feed (re)connected from "now", so a write
/// just before may have been missed by a job's last read (read again, whatever the filter);
/// more `breaks` means the feed failed (the database may have been deleted or re-created, so
/// check that it is still the one being read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tick {
    /// Changes seen.
    pub changes: u64,
    /// Connections from "now".
    pub blind: u64,
    /// Feed failures seen.
    pub breaks: u64,
}

/// How many recent changed ids a watch keeps: a job that falls further behind reads.
const RECENT_IDS: usize = 4096;

/// The ids of the last [`RECENT_IDS`] changes, each with its change number.
type Recent = Mutex<VecDeque<(u64, Arc<str>)>>;

/// The feed task's side of a watch: what it reports goes to every job waiting on it.
#[derive(Debug)]
pub struct FeedSink {
    ticks: watch::Sender<Tick>,
    recent: Arc<Recent>,
}

impl FeedSink {
    /// Changes to the documents `ids` seen, in feed order. The ids are kept before the tick
    /// moves, so a job woken by the tick finds them.
    pub fn changed(&self, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        let mut first = self.ticks.borrow().changes;
        if let Ok(mut recent) = self.recent.lock() {
            for id in &ids {
                first += 1;
                recent.push_back((first, Arc::from(id.as_str())));
            }
            let excess = recent.len().saturating_sub(RECENT_IDS);
            recent.drain(..excess);
        }
        self.ticks.send_modify(|t| t.changes += ids.len() as u64);
    }

    /// The feed connected from "now".
    pub fn blind(&self) {
        self.ticks.send_modify(|t| t.blind += 1);
    }

    /// The feed failed.
    pub fn broke(&self) {
        self.ticks.send_modify(|t| t.breaks += 1);
    }
}

/// One watched database; the feed task runs while any job holds it.
#[derive(Debug)]
pub struct Watch {
    ticks: watch::Receiver<Tick>,
    recent: Arc<Recent>,
    task: AbortHandle,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watch {
    /// A receiver of the watch's ticks.
    pub fn ticks(&self) -> watch::Receiver<Tick> {
        self.ticks.clone()
    }

    /// Whether a change numbered after `from` and up to `to` was to a document `wanted`
    /// takes; `None` when those changes are no longer all kept (the caller must read).
    pub fn any_changed(&self, from: u64, to: u64, wanted: impl Fn(&str) -> bool) -> Option<bool> {
        if to <= from {
            return Some(false);
        }
        let recent = self.recent.lock().ok()?;
        let oldest = recent.front().map_or(u64::MAX, |(n, _)| *n);
        if oldest > from + 1 {
            return None;
        }
        Some(
            recent
                .iter()
                .filter(|(n, _)| *n > from && *n <= to)
                .any(|(_, id)| wanted(id)),
        )
    }
}

/// The watches of one shared transport, keyed by endpoint.
#[derive(Debug, Default)]
pub struct Watches {
    /// By database URL (cheap to hash); the endpoints under one URL differ in credentials or
    /// headers.
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    by_url: HashMap<String, Vec<(Endpoint, Weak<Watch>)>>,
    /// Size at which the table drops the databases nobody watches any more: twice its live
    /// size at the last sweep, so sweeping costs O(1) per new watch however many databases
    /// come and go.
    sweep_at: usize,
}

impl Watches {
    /// The watch of `ep`, joining the one running or starting one with `start`, which is
    /// given the feed's sink and returns its feed task's abort handle.
    pub fn subscribe(
        &self,
        ep: &Endpoint,
        start: impl FnOnce(FeedSink) -> AbortHandle,
    ) -> Arc<Watch> {
        let Ok(mut table) = self.table.lock() else {
            return new_watch(start);
        };
        let table = &mut *table;
        let list = table.by_url.entry(ep.url().to_owned()).or_default();
        list.retain(|(_, w)| w.strong_count() > 0);
        if let Some(w) = list
            .iter()
            .find(|(e, _)| e == ep)
            .and_then(|(_, w)| w.upgrade())
        {
            return w;
        }
        let w = new_watch(start);
        list.push((ep.clone(), Arc::downgrade(&w)));
        if table.by_url.len() >= table.sweep_at {
            table
                .by_url
                .retain(|_, l| l.iter().any(|(_, w)| w.strong_count() > 0));
            table.sweep_at = (2 * table.by_url.len()).max(16);
        }
        w
    }

    /// Databases watched now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.lock().map_or(0, |t| {
            t.by_url
                .values()
                .flatten()
                .filter(|(_, w)| w.strong_count() > 0)
                .count()
        })
    }

    /// Whether no database is watched.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn new_watch(start: impl FnOnce(FeedSink) -> AbortHandle) -> Arc<Watch> {
    let (tx, ticks) = watch::channel(Tick::default());
    let recent: Arc<Recent> = Arc::default();
    let task = start(FeedSink {
        ticks: tx,
        recent: recent.clone(),
    });
    Arc::new(Watch {
        ticks,
        recent,
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn ep(url: &str) -> Endpoint {
        Endpoint::parse(url).unwrap()
    }

    /// Subscribes, counting the feed tasks started; each task ticks once then waits forever.
    fn subscribe(w: &Watches, url: &str, started: &Arc<AtomicUsize>) -> Arc<Watch> {
        let started = started.clone();
        w.subscribe(&ep(url), move |sink| {
            started.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                sink.changed(vec!["a".into()]);
                std::future::pending::<()>().await;
            })
            .abort_handle()
        })
    }

    #[tokio::test]
    async fn equal_endpoints_share_one_feed_and_others_get_their_own() {
        let w = Watches::default();
        let started = Arc::new(AtomicUsize::new(0));
        let a1 = subscribe(&w, "http://h:1/db", &started);
        let a2 = subscribe(&w, "http://h:1/db", &started);
        assert!(Arc::ptr_eq(&a1, &a2));
        let mut ticks = a2.ticks();
        ticks.wait_for(|t| t.changes == 1).await.unwrap();
        // Other credentials, or another database: a feed of their own.
        let b = subscribe(&w, "http://u:p@h:1/db", &started);
        let c = subscribe(&w, "http://h:1/other", &started);
        assert!(!Arc::ptr_eq(&a1, &b) && !Arc::ptr_eq(&a1, &c));
        assert_eq!(started.load(Ordering::SeqCst), 3);
        assert_eq!(w.len(), 3);
        drop((b, c));
        assert_eq!(w.len(), 1);
    }

    #[tokio::test]
    async fn the_feed_stops_with_its_last_watcher_and_a_new_one_starts_again() {
        let w = Watches::default();
        let started = Arc::new(AtomicUsize::new(0));
        let a1 = subscribe(&w, "http://h:1/db", &started);
        let a2 = subscribe(&w, "http://h:1/db", &started);
        let mut ticks = a1.ticks();
        drop(a1);
        // One watcher left: the feed runs on.
        ticks.wait_for(|t| t.changes == 1).await.unwrap();
        drop(a2);
        // The task was aborted: its sender is gone.
        assert!(ticks.changed().await.is_err());
        assert!(w.is_empty());
        let _a3 = subscribe(&w, "http://h:1/db", &started);
        assert_eq!(started.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_watch_tells_which_documents_changed_while_it_keeps_them() {
        let w = Watches::default();
        let sink = std::sync::Mutex::new(None);
        let watch = w.subscribe(&ep("http://h:1/db"), |s| {
            *sink.lock().unwrap() = Some(s);
            tokio::spawn(std::future::pending::<()>()).abort_handle()
        });
        let sink = sink.into_inner().unwrap().unwrap();
        sink.changed(vec!["a".into(), "b".into()]);
        sink.changed(vec!["c".into()]);
        assert_eq!(watch.ticks().borrow().changes, 3);
        let is = |x: &'static str| move |id: &str| id == x;
        assert_eq!(watch.any_changed(0, 3, is("c")), Some(true));
        assert_eq!(watch.any_changed(0, 2, is("c")), Some(false));
        assert_eq!(watch.any_changed(1, 3, is("a")), Some(false));
        assert_eq!(watch.any_changed(3, 3, is("a")), Some(false));
        // Past what is kept: unknown, so the job reads.
        sink.changed((0..RECENT_IDS).map(|i| format!("x{i}")).collect());
        assert_eq!(watch.any_changed(0, 3 + RECENT_IDS as u64, is("zz")), None);
        assert_eq!(
            watch.any_changed(3, 3 + RECENT_IDS as u64, is("zz")),
            Some(false)
        );
        sink.blind();
        sink.broke();
        let t = *watch.ticks().borrow();
        assert_eq!((t.blind, t.breaks), (1, 1));
    }
}
