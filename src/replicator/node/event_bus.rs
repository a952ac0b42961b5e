//! event_bus: the replicator's typed publish/subscribe (CouchDB's `couch_replicator_notifier`,
//! its `couch_replication` gen_event), the first child of the tree.
//!
//! Messages: [`EventBusMsg::Subscribe`] (a channel sender; the subscription dies with the
//! subscriber: when its receiver is dropped — the subscribing task or actor ended — the entry
//! is pruned), [`EventBusMsg::Publish`] (delivered in publish order to every live subscriber;
//! delivery errors are swallowed, as `gen_event:notify` does), [`EventBusMsg::Observe`].
//! Subscriptions live in the actor, so a restarted bus starts empty and every subscriber
//! sees its channel close (like gen_event handlers dying with their manager) and can
//! subscribe again.

use ractor::{ActorRef, RpcReplyPort};
use supervisors::{BoxError, Observable, Server};
use tokio::sync::mpsc;

use super::child_id::ChildId;
use crate::replication::{RepId, ReplicationStats};
use crate::replicator::job::id::JobId;
use crate::replicator::job::record::JobError;

/// Cluster stability (docs/architecture.md, "The supervision tree", clustering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterStatus {
    /// Membership changed less than `cluster_quiet_period` ago.
    Unstable,
    /// No membership change for `cluster_quiet_period`.
    Stable,
}

/// One replicator event.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplicatorEvent {
    /// `{cluster, stable|unstable}`.
    Cluster(ClusterStatus),
    /// A job actor started running a job.
    Started {
        /// The couch_jobs id.
        job_id: JobId,
        /// The replication id.
        rep_id: RepId,
    },
    /// `{finished, RepId, CheckpointHistory}`: a one-shot job completed.
    Finished {
        /// The couch_jobs id.
        job_id: JobId,
        /// The replication id.
        rep_id: RepId,
        /// Final stats.
        stats: Box<ReplicationStats>,
    },
    /// `{error, RepId, Reason}`: the job crashed and was rescheduled with backoff.
    Crashed {
        /// The couch_jobs id.
        job_id: JobId,
        /// Why (its text is CouchDB's reason).
        error: JobError,
    },
    /// The job failed permanently.
    Failed {
        /// The couch_jobs id.
        job_id: JobId,
        /// Why (its text is CouchDB's reason).
        error: JobError,
    },
    /// `{stopped, RepId}`: the job was stopped (rotation, shutdown, cancel).
    Stopped {
        /// The couch_jobs id.
        job_id: JobId,
    },
}

impl ReplicatorEvent {
    /// The job the event is about, if any.
    pub fn job_id(&self) -> Option<&JobId> {
        match self {
            ReplicatorEvent::Cluster(_) => None,
            ReplicatorEvent::Started { job_id, .. }
            | ReplicatorEvent::Finished { job_id, .. }
            | ReplicatorEvent::Crashed { job_id, .. }
            | ReplicatorEvent::Failed { job_id, .. }
            | ReplicatorEvent::Stopped { job_id } => Some(job_id),
        }
    }
}

/// The receiving end of a subscription. Dropping it unsubscribes.
pub type EventReceiver = mpsc::UnboundedReceiver<ReplicatorEvent>;

/// The event bus, the tree's first child.
pub(crate) const EVENT_BUS: ChildId<EventBusMsg> = ChildId::new("event_bus");

/// Messages of the event bus.
#[derive(Debug)]
pub enum EventBusMsg {
    /// Add a subscriber.
    Subscribe(mpsc::UnboundedSender<ReplicatorEvent>),
    /// Deliver an event to every live subscriber.
    Publish(ReplicatorEvent),
    /// The bus's state.
    Observe(RpcReplyPort<EventBusObservation>),
}

/// What [`EventBusMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EventBusObservation {
    /// Live subscribers (dead ones are pruned first).
    pub subscribers: usize,
    /// Events published since this bus started.
    pub published: u64,
}

impl Observable for EventBusMsg {
    type Observation = EventBusObservation;
    fn observe(reply: RpcReplyPort<EventBusObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// The event bus server.
#[derive(Debug, Clone, Default)]
pub struct EventBus;

/// Live subscribers.
#[derive(Debug, Default)]
pub struct EventBusState {
    subscribers: Vec<mpsc::UnboundedSender<ReplicatorEvent>>,
    published: u64,
}

impl Server for EventBus {
    type Msg = EventBusMsg;
    type State = EventBusState;
    type Args = ();

    async fn init(&self, _: ActorRef<EventBusMsg>, _: ()) -> Result<EventBusState, BoxError> {
        Ok(EventBusState::default())
    }

    async fn handle(
        &self,
        _: ActorRef<EventBusMsg>,
        msg: EventBusMsg,
        state: &mut EventBusState,
    ) -> Result<(), BoxError> {
        match msg {
            EventBusMsg::Subscribe(tx) => state.subscribers.push(tx),
            EventBusMsg::Publish(ev) => {
                tracing::debug!(event = ?ev, "replicator event");
                state.published += 1;
                state.subscribers.retain(|s| s.send(ev.clone()).is_ok());
            }
            EventBusMsg::Observe(reply) => {
                state.subscribers.retain(|s| !s.is_closed());
                let _ = reply.send(EventBusObservation {
                    subscribers: state.subscribers.len(),
                    published: state.published,
                });
            }
        }
        Ok(())
    }
}

/// Subscribes on `bus`; the returned receiver yields every later event.
pub fn subscribe(bus: &ActorRef<EventBusMsg>) -> Option<EventReceiver> {
    let (tx, rx) = mpsc::unbounded_channel();
    bus.send_message(EventBusMsg::Subscribe(tx)).ok()?;
    Some(rx)
}

/// Publishes on `bus`, ignoring a bus that is not running.
pub fn publish(bus: Option<&ActorRef<EventBusMsg>>, ev: ReplicatorEvent) {
    if let Some(bus) = bus {
        let _ = bus.send_message(EventBusMsg::Publish(ev));
    }
}
