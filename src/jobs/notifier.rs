//! The per-type notifier (CouchDB's couch_jobs_type_monitor.erl and couch_jobs_notifier.erl): delivers job state changes to subscribers.
//!
//! [`NotifierCore::round`] is one notification round, testable on its own: a cheap pass over
//! the ACTIVITY entries written since the previous round (running jobs with new data), then
//! an individual read of every other subscribed job; each subscriber gets the new state if it
//! changed, or a `running` event for a newer `Seq`; `finished`/`not_found` end the
//! subscription. [`NotifierActor`] wraps it: messages `Subscribe`, `Unsubscribe`,
//! `TypeUpdated` (from its type monitor task, which watches WATCHES_ACTIVITY with a holdoff)
//! `Round` and `Observe`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use supervisors::Observable;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::store::tuple::Versionstamp;
use crate::store::{Db, RangeOptions, StoreError};

use super::Jobs;
use super::config::{BatchSize, JobsConfig};
use super::error::{JobsError, JobsResult, background_retryable};
use super::event::{EventState, JobEvent};
use super::job_data::{JobData, JobRow, decode_activity};
use super::keys::Keys;

static NEXT_SUB_ID: AtomicU64 = AtomicU64::new(1);

struct Sub {
    events: mpsc::UnboundedSender<JobEvent>,
    last_state: EventState,
    last_seq: Option<Versionstamp>,
}

/// What a round learned about one job.
struct Current {
    state: EventState,
    seq: Option<Versionstamp>,
    data: Option<JobData>,
}

/// The notifier's state and logic for one type.
pub struct NotifierCore {
    db: Db,
    keys: Keys,
    ty: String,
    batch: BatchSize,
    subs: BTreeMap<String, HashMap<u64, Sub>>,
    last_vs: Option<Versionstamp>,
}

impl NotifierCore {
    /// A notifier for type `ty` with batch sizing from `config` and no subscribers.
    pub fn new(db: Db, keys: Keys, ty: &str, config: &JobsConfig) -> Self {
        Self {
            db,
            keys,
            ty: ty.to_string(),
            batch: BatchSize::new(
                config.notifier_init_batch_size,
                config.notifier_batch_increment,
                config.notifier_batch_factor,
            ),
            subs: BTreeMap::new(),
            last_vs: None,
        }
    }

    /// Registers a subscriber that last saw `state`/`seq`; returns its id.
    pub fn subscribe(
        &mut self,
        id: &str,
        state: EventState,
        seq: Option<Versionstamp>,
        events: mpsc::UnboundedSender<JobEvent>,
    ) -> u64 {
        let sub_id = NEXT_SUB_ID.fetch_add(1, Ordering::Relaxed);
        self.subs.entry(id.to_string()).or_default().insert(
            sub_id,
            Sub {
                events,
                last_state: state,
                last_seq: seq,
            },
        );
        sub_id
    }

    /// Forgets the subscription with id `sub_id` (a no-op if it already ended).
    pub fn unsubscribe(&mut self, sub_id: u64) {
        self.subs.retain(|_, subs| {
            subs.remove(&sub_id);
            !subs.is_empty()
        });
    }

    /// Live subscriptions (after dropping those whose subscriber went away).
    pub fn subscriber_count(&mut self) -> usize {
        self.drop_dead();
        self.subs.values().map(HashMap::len).sum()
    }

    fn drop_dead(&mut self) {
        self.subs.retain(|_, subs| {
            subs.retain(|_, s| !s.events.is_closed());
            !subs.is_empty()
        });
    }

    /// One notification round. Returns how many events were delivered.
    pub async fn round(&mut self) -> JobsResult<usize> {
        self.drop_dead();
        if self.subs.is_empty() {
            return Ok(0);
        }
        let (keys, ty) = (&self.keys, self.ty.as_str());
        let watch_vs = self
            .db
            .run(|tx| async move {
                match tx.get(&keys.watches_activity(ty), true).await? {
                    Some(v) => keys.decode_watches_activity(&v).map(Some),
                    None => Ok::<_, JobsError>(None),
                }
            })
            .await?;
        let mut current: HashMap<String, Current> = HashMap::new();
        self.cheap_pass(&mut current).await?;
        self.expensive_pass(&mut current).await?;
        if watch_vs.is_some() {
            self.last_vs = watch_vs;
        }
        Ok(self.deliver(current))
    }

    /// Running jobs with an ACTIVITY entry written since the previous round.
    async fn cheap_pass(&mut self, current: &mut HashMap<String, Current>) -> JobsResult<()> {
        let (mut begin, end) = match &self.last_vs {
            Some(vs) => self.keys.activity_range_from(&self.ty, vs),
            None => self.keys.activity_range(&self.ty),
        };
        loop {
            let limit = self.batch.size;
            let page = self
                .db
                .run(|tx| {
                    let (begin, end) = (begin.clone(), end.clone());
                    async move {
                        tx.get_range(&begin, &end, RangeOptions::all().snapshot().limit(limit))
                            .await
                    }
                })
                .await;
            let page = match page {
                Ok(page) => page,
                Err(e) if shrinkable(&e) => {
                    self.batch.shrink();
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            for kv in &page {
                let decoded = self
                    .keys
                    .decode_activity_key(&kv.key)
                    .and_then(|vs| decode_activity(&kv.value).map(|(id, data)| (vs, id, data)));
                match decoded {
                    Ok((vs, id, data)) if self.subs.contains_key(&id) => {
                        current.insert(
                            id,
                            Current {
                                state: EventState::Running,
                                seq: Some(vs),
                                data: Some(data),
                            },
                        );
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(job_type = %self.ty, error = %e, "skipping corrupt activity entry")
                    }
                }
            }
            match page.last() {
                Some(last) if page.len() >= limit => {
                    self.batch.grow();
                    begin = last.key.clone();
                    begin.push(0x00);
                }
                _ => return Ok(()),
            }
        }
    }

    /// Reads every other subscribed job individually, in batches.
    async fn expensive_pass(&mut self, current: &mut HashMap<String, Current>) -> JobsResult<()> {
        let mut todo: Vec<String> = self
            .subs
            .keys()
            .filter(|id| !current.contains_key(*id))
            .cloned()
            .collect();
        while !todo.is_empty() {
            let n = self.batch.size.min(todo.len());
            let batch: Vec<String> = todo[..n].to_vec();
            let (keys, ty) = (&self.keys, self.ty.as_str());
            let rows = self
                .db
                .run(|tx| {
                    let batch = batch.clone();
                    async move {
                        let mut out = Vec::with_capacity(batch.len());
                        for id in batch {
                            let raw = tx.get(&keys.data(ty, &id), true).await?;
                            out.push((id, raw));
                        }
                        Ok::<_, StoreError>(out)
                    }
                })
                .await;
            let rows = match rows {
                Ok(rows) => rows,
                Err(e) if shrinkable(&e) => {
                    self.batch.shrink();
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if n == self.batch.size {
                self.batch.grow();
            }
            todo.drain(..n);
            for (id, raw) in rows {
                let cur = match raw.map(|bytes| JobRow::decode(&bytes)) {
                    None => Current {
                        state: EventState::NotFound,
                        seq: None,
                        data: None,
                    },
                    Some(Ok(row)) => Current {
                        state: row.state().into(),
                        seq: row.running_vs().cloned(),
                        data: Some(row.data),
                    },
                    Some(Err(e)) => {
                        tracing::error!(job_type = %self.ty, job_id = %id, error = %e, "corrupt job row; not notifying");
                        continue;
                    }
                };
                current.insert(id, cur);
            }
        }
        Ok(())
    }

    fn deliver(&mut self, current: HashMap<String, Current>) -> usize {
        let mut delivered = 0;
        let ty = self.ty.clone();
        for (id, cur) in current {
            let Some(subs) = self.subs.get_mut(&id) else {
                continue;
            };
            subs.retain(|_, sub| {
                let send = match (cur.state, sub.last_state) {
                    (EventState::Running, EventState::Running) => cur.seq > sub.last_seq,
                    (new, old) => new != old,
                };
                if !send {
                    return true;
                }
                let event = JobEvent {
                    job_type: ty.clone(),
                    id: id.clone(),
                    state: cur.state,
                    data: cur.data.clone(),
                };
                if sub.events.send(event).is_err() {
                    return false;
                }
                delivered += 1;
                sub.last_state = cur.state;
                sub.last_seq = cur.seq.clone();
                !matches!(cur.state, EventState::Finished | EventState::NotFound)
            });
        }
        self.subs.retain(|_, subs| !subs.is_empty());
        delivered
    }
}

/// Errors after which a smaller batch may succeed.
fn shrinkable(e: &StoreError) -> bool {
    matches!(e, StoreError::TooLarge(_)) || background_retryable(e)
}

/// Messages of the notifier actor.
pub enum NotifierMsg {
    /// Add a subscriber to job `id` and reply with its subscription id.
    Subscribe {
        /// The subscribed job's id.
        id: String,
        /// The state the subscriber last saw; it hears only of changes from there.
        state: EventState,
        /// The `Seq` versionstamp the subscriber last saw while the job ran.
        seq: Option<Versionstamp>,
        /// Where the subscriber's events go.
        events: mpsc::UnboundedSender<JobEvent>,
        /// Receives the new subscription id.
        reply: RpcReplyPort<u64>,
    },
    /// Remove the subscription with this id.
    Unsubscribe(u64),
    /// The type's activity watch changed.
    TypeUpdated,
    /// Run a round now.
    Round,
    /// The notifier's state.
    Observe(RpcReplyPort<NotifierObservation>),
}

/// What [`NotifierMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NotifierObservation {
    /// The job type.
    pub job_type: String,
    /// Live subscriptions (dead subscribers are dropped first).
    pub subscribers: usize,
    /// Distinct jobs with a subscription.
    pub jobs: usize,
    /// The current AIMD batch size of a round.
    pub batch_size: usize,
    /// A round is queued or waiting to retry.
    pub round_queued: bool,
}

impl Observable for NotifierMsg {
    type Observation = NotifierObservation;
    fn observe(reply: RpcReplyPort<NotifierObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// The notifier actor for one type.
pub struct NotifierActor;

/// The notifier actor's state: the round logic, whether a round is queued, and the type monitor
/// task that watches the activity key.
pub struct NotifierState {
    core: NotifierCore,
    round_queued: bool,
    monitor: AbortHandle,
    holdoff: Duration,
}

impl Actor for NotifierActor {
    type Msg = NotifierMsg;
    type State = NotifierState;
    type Arguments = (Jobs, String);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (jobs, ty): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let core = NotifierCore::new(jobs.db().clone(), jobs.keys().clone(), &ty, jobs.config());
        let monitor = tokio::spawn(type_monitor(jobs.clone(), ty, myself)).abort_handle();
        Ok(NotifierState {
            core,
            round_queued: false,
            monitor,
            holdoff: jobs.config().type_monitor_holdoff,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.monitor.abort();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            NotifierMsg::Subscribe {
                id,
                state: s,
                seq,
                events,
                reply,
            } => {
                let sub_id = state.core.subscribe(&id, s, seq, events);
                let _ = reply.send(sub_id);
                // The job may have changed between the subscriber's read and now, with the
                // type update already processed: check once more.
                queue_round(&myself, state);
            }
            NotifierMsg::Unsubscribe(sub_id) => state.core.unsubscribe(sub_id),
            NotifierMsg::TypeUpdated => queue_round(&myself, state),
            NotifierMsg::Round => {
                state.round_queued = false;
                match state.core.round().await {
                    Ok(_) => {}
                    Err(JobsError::Store(e)) if background_retryable(&e) => {
                        tracing::warn!(error = %e, "notifier round failed; retrying");
                        let holdoff = state.holdoff;
                        myself.send_after(holdoff, || NotifierMsg::Round);
                        state.round_queued = true;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            NotifierMsg::Observe(reply) => {
                let subscribers = state.core.subscriber_count();
                let _ = reply.send(NotifierObservation {
                    job_type: state.core.ty.clone(),
                    subscribers,
                    jobs: state.core.subs.len(),
                    batch_size: state.core.batch.size,
                    round_queued: state.round_queued,
                });
            }
        }
        Ok(())
    }
}

fn queue_round(myself: &ActorRef<NotifierMsg>, state: &mut NotifierState) {
    if !state.round_queued {
        state.round_queued = true;
        let _ = myself.cast(NotifierMsg::Round);
    }
}

/// The type monitor loop (CouchDB's couch_jobs_type_monitor.erl): watch WATCHES_ACTIVITY(Type) and tell the notifier
/// when it changed, at most once per holdoff. Ends when the notifier is gone.
async fn type_monitor(jobs: Jobs, ty: String, notifier: ActorRef<NotifierMsg>) {
    let holdoff = jobs.config().type_monitor_holdoff;
    let wait_limit = jobs.config().type_monitor_timeout;
    let key = jobs.keys().watches_activity(&ty);
    let mut last: Option<Option<Vec<u8>>> = None;
    let mut last_sent: Option<tokio::time::Instant> = None;
    loop {
        let read = jobs
            .db()
            .run(|tx| {
                let key = key.clone();
                async move {
                    let value = tx.get(&key, true).await?;
                    let watch = tx.watch(&key);
                    Ok::<_, StoreError>((value, watch))
                }
            })
            .await;
        let (value, watch) = match read {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(job_type = %ty, error = %e, "type monitor read failed");
                tokio::time::sleep(holdoff).await;
                continue;
            }
        };
        if last.as_ref() != Some(&value) {
            if let Some(sent) = last_sent {
                let since = sent.elapsed();
                if since < holdoff {
                    tokio::time::sleep(holdoff - since).await;
                }
            }
            if notifier.cast(NotifierMsg::TypeUpdated).is_err() {
                return;
            }
            last_sent = Some(tokio::time::Instant::now());
            last = Some(value);
        }
        let fired = match wait_limit {
            Some(t) => tokio::time::timeout(t, watch).await.unwrap_or(Ok(())),
            None => watch.await,
        };
        if fired.is_err() {
            tokio::time::sleep(holdoff).await;
        }
        if notifier.get_status() >= ractor::ActorStatus::Stopping {
            return;
        }
    }
}
