//! Shared change watches: one continuous `_changes` connection per watched database (and
//! credentials), whose changes wake every continuous job reading that database.
//!
//! A continuous job that holds its own `feed=continuous` request keeps a socket open for as
//! long as it runs, so a node running 500 jobs on one source holds 500 sockets that carry
//! nothing but heartbeats. Instead, a job reads the feed in normal requests and, once caught
//! up, waits on the database's [`Watch`]: the first job to watch a database starts a task
//! that follows its continuous feed (see [`super::watch_feed`]); each change it sees bumps a
//! [`Tick`], and the waiting jobs read again from their own sequence with their own filter.
//! A watch is shared only between equal endpoints (URL, credentials and headers), so no job
//! learns of changes through credentials it was not given. The task ends (closing its
//! socket) when the last job watching the database lets go.
//!
//! This module only keeps the table and the ticks; it does not know HTTP, so the client can
//! hold a table without the two modules importing each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::endpoint::Endpoint;

/// What a watch has seen so far. Jobs compare two ticks: more `changes` means the database
/// changed (read again); more `breaks` means the watch's feed failed (the database may have
/// been deleted or re-created, so check that it is still the one being read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tick {
    /// Changes seen, plus one each time the feed (re)connected from "now" (anything written
    /// before that moment may have been missed by a job's last read).
    pub changes: u64,
    /// Feed failures seen.
    pub breaks: u64,
}

/// One watched database; the feed task runs while any job holds it.
#[derive(Debug)]
pub struct Watch {
    ticks: watch::Receiver<Tick>,
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
    /// given the sender of the ticks and returns its feed task's abort handle.
    pub fn subscribe(
        &self,
        ep: &Endpoint,
        start: impl FnOnce(watch::Sender<Tick>) -> AbortHandle,
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
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn new_watch(start: impl FnOnce(watch::Sender<Tick>) -> AbortHandle) -> Arc<Watch> {
    let (tx, ticks) = watch::channel(Tick::default());
    let task = start(tx);
    Arc::new(Watch { ticks, task })
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
        w.subscribe(&ep(url), move |tx| {
            started.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                tx.send_modify(|t| t.changes += 1);
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
}
