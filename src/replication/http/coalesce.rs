//! Coalesced reads: identical `GET`s that jobs send at the same time through one shared
//! transport become one request, whose answer every waiting job reads.
//!
//! A rotation starts hundreds of jobs at once, and jobs that replicate the same database
//! (per-user filtered replications from one source, many sources into one target) each open
//! it with a `GET db` that returns the same database info. The first job to ask sends the
//! request; jobs asking for the same endpoint and path while it is in flight wait for its
//! answer instead of sending their own. Two requests are the same only when their endpoints
//! are equal, credentials and headers included, so no job reads an answer given to other
//! credentials. If the first request fails or is dropped (its job was stopped), each
//! waiting job sends its own request, so errors keep their per-job retries and meaning.
//!
//! Nothing is cached: a request that starts after the answer arrived is sent again.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::replication::endpoint::database::Endpoint;

struct Flight<T> {
    id: u64,
    ep: Endpoint,
    path: String,
    answer: watch::Receiver<Option<Arc<T>>>,
}

/// The reads in flight through one shared transport (a list: only a few distinct reads are
/// in flight at once, however many jobs wait for them).
pub struct Coalescer<T> {
    flights: Mutex<Vec<Flight<T>>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl<T> Default for Coalescer<T> {
    fn default() -> Self {
        Self {
            flights: Mutex::new(Vec::new()),
            next_id: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl<T> std::fmt::Debug for Coalescer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Coalescer({} in flight)", self.in_flight())
    }
}

/// Removes its flight from the table when the sending job is done or dropped.
struct Landing<'a, T> {
    table: &'a Coalescer<T>,
    id: u64,
}

impl<T> Drop for Landing<'_, T> {
    fn drop(&mut self) {
        if let Ok(mut f) = self.table.flights.lock() {
            f.retain(|x| x.id != self.id);
        }
    }
}

impl<T> Coalescer<T> {
    /// Reads in flight now.
    pub fn in_flight(&self) -> usize {
        self.flights.lock().map_or(0, |f| f.len())
    }

    /// The answer to reading `path` on `ep`: joins the identical read in flight if there is
    /// one, else sends it with `send`. A joined read that fails is sent again with `send`.
    pub async fn read<E, F, Fut>(&self, ep: &Endpoint, path: &str, send: F) -> Result<Arc<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let joined = self.flights.lock().ok().and_then(|f| {
            f.iter()
                .find(|x| x.path == path && x.ep == *ep)
                .map(|x| x.answer.clone())
        });
        if let Some(mut answer) = joined {
            if let Ok(a) = answer.wait_for(Option::is_some).await
                && let Some(a) = a.as_ref()
            {
                return Ok(a.clone());
            }
            return send().await.map(Arc::new);
        }
        let (tx, rx) = watch::channel(None);
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut f) = self.flights.lock() {
            f.push(Flight {
                id,
                ep: ep.clone(),
                path: path.to_owned(),
                answer: rx,
            });
        }
        let landing = Landing { table: self, id };
        let answer = send().await.map(Arc::new);
        drop(landing);
        if let Ok(a) = &answer {
            // Nobody waiting is not an error.
            let _ = tx.send(Some(a.clone()));
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn ep(url: &str) -> Endpoint {
        Endpoint::parse(url).unwrap()
    }

    #[tokio::test]
    async fn reads_at_the_same_time_share_one_request() {
        let c: Arc<Coalescer<u32>> = Arc::default();
        let sent = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let (c, sent) = (c.clone(), sent.clone());
            tasks.push(tokio::spawn(async move {
                c.read(&ep("http://h:1/db"), "", || async {
                    sent.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, ()>(7)
                })
                .await
            }));
        }
        for t in tasks {
            assert_eq!(*t.await.unwrap().unwrap(), 7);
        }
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        assert_eq!(c.in_flight(), 0, "the flight lands");
        // Afterwards nothing is cached.
        let db = ep("http://h:1/db");
        let again = c.read(&db, "", || async { Ok::<_, ()>(8) }).await;
        assert_eq!(*again.unwrap(), 8);
    }

    #[tokio::test]
    async fn other_credentials_or_paths_are_not_joined() {
        let c: Arc<Coalescer<String>> = Arc::default();
        let slow = |v: &'static str| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, ()>(v.to_owned())
        };
        let (u, v) = (ep("http://u:p@h:1/db"), ep("http://v:q@h:1/db"));
        let (a, b, d) = tokio::join!(
            c.read(&u, "", || slow("u")),
            c.read(&v, "", || slow("v")),
            c.read(&u, "_local/x", || slow("local")),
        );
        assert_eq!(*a.unwrap(), "u");
        assert_eq!(*b.unwrap(), "v");
        assert_eq!(*d.unwrap(), "local");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_sent_again_by_each_waiting_job() {
        let c: Arc<Coalescer<u32>> = Arc::default();
        let db = ep("http://h:1/db");
        let first = c.read(&db, "", || async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err::<u32, &str>("refused")
        });
        let second = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            c.read(&db, "", || async { Ok::<_, &str>(3) }).await
        };
        let (first, second) = tokio::join!(first, second);
        assert_eq!(first, Err("refused"));
        assert_eq!(
            *second.unwrap(),
            3,
            "its own request, not the first one's error"
        );
    }
}
