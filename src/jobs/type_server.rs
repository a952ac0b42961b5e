//! The type server (CouchDB's couch_jobs_server.erl, `couch_jobs_server`): discovers job types and runs one
//! activity monitor and one notifier per type.
//!
//! Every `type_check_period` + jitter it reads the ACTIVITY_TIMEOUT range, starts the
//! monitor/notifier pair of each new type and stops those of removed types. Messages: `Tick`
//! (timer), `CheckNow` (after `set_type_timeout`), `Ensure` (a subscriber needs the notifier
//! of a type now), `Observe`. Its children are linked to it: if one dies the server fails, and `jobs_sup`
//! restarts it with a fresh set. The [`Registry`] lets callers find the notifiers.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, ActorStatus, RpcReplyPort, SupervisionEvent};
use rand::Rng;
use supervisors::Observable;

use super::Jobs;
use super::activity_monitor::{MonitorActor, MonitorMsg};
use super::error::{JobsError, JobsResult};
use super::lifecycle::get_types;
use super::notifier::{NotifierActor, NotifierMsg};

/// Where callers find this node's running type server and notifiers.
#[derive(Default)]
pub struct Registry {
    server: RwLock<Option<ActorRef<TypeServerMsg>>>,
    notifiers: RwLock<HashMap<String, ActorRef<NotifierMsg>>>,
    monitors: RwLock<HashMap<String, ActorRef<MonitorMsg>>>,
}

fn alive<T>(r: &ActorRef<T>) -> bool {
    r.get_status() < ActorStatus::Stopping
}

impl Registry {
    /// The running type server.
    pub(crate) fn server(&self) -> Option<ActorRef<TypeServerMsg>> {
        let server = self.server.read().unwrap_or_else(|p| p.into_inner());
        server.clone().filter(alive)
    }

    fn set_server(&self, server: Option<ActorRef<TypeServerMsg>>) {
        *self.server.write().unwrap_or_else(|p| p.into_inner()) = server;
    }

    fn set_notifiers(&self, notifiers: HashMap<String, ActorRef<NotifierMsg>>) {
        *self.notifiers.write().unwrap_or_else(|p| p.into_inner()) = notifiers;
    }

    fn set_monitors(&self, monitors: HashMap<String, ActorRef<MonitorMsg>>) {
        *self.monitors.write().unwrap_or_else(|p| p.into_inner()) = monitors;
    }

    /// The running notifier of `ty`, if any (not started on demand).
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn running_notifier(&self, ty: &str) -> Option<ActorRef<NotifierMsg>> {
        let map = self.notifiers.read().unwrap_or_else(|p| p.into_inner());
        map.get(ty).cloned().filter(alive)
    }

    /// The running activity monitor of `ty`, if any.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn monitor(&self, ty: &str) -> Option<ActorRef<MonitorMsg>> {
        let map = self.monitors.read().unwrap_or_else(|p| p.into_inner());
        map.get(ty).cloned().filter(alive)
    }

    /// The notifier of `ty`, started on demand.
    pub async fn notifier(&self, ty: &str) -> JobsResult<ActorRef<NotifierMsg>> {
        let known = {
            let map = self.notifiers.read().unwrap_or_else(|p| p.into_inner());
            map.get(ty).cloned().filter(alive)
        };
        if let Some(n) = known {
            return Ok(n);
        }
        let server = self
            .server()
            .ok_or_else(|| JobsError::Unavailable("couch_jobs background not running".into()))?;
        ractor::call!(server, |reply| TypeServerMsg::Ensure(ty.to_string(), reply))
            .map_err(|e| JobsError::Unavailable(e.to_string()))?
            .map_err(JobsError::Unavailable)
    }

    /// Asks the type server (if running) to re-scan types now, and waits for it.
    pub async fn request_type_check(&self) {
        if let Some(server) = self.server() {
            let _ = ractor::call!(server, TypeServerMsg::CheckNow);
        }
    }
}

/// Messages of the type server.
pub enum TypeServerMsg {
    /// The periodic timer: re-scan the types and schedule the next tick.
    Tick,
    /// Re-scan the types now and reply when done (sent after a type timeout changed).
    CheckNow(RpcReplyPort<()>),
    /// Start the monitor and notifier of this type if needed, and reply with its notifier.
    Ensure(String, RpcReplyPort<Result<ActorRef<NotifierMsg>, String>>),
    /// The server's state.
    Observe(RpcReplyPort<TypeServerObservation>),
}

/// What [`TypeServerMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TypeServerObservation {
    /// Job types with a running activity monitor and notifier, sorted.
    pub types: Vec<String>,
}

impl Observable for TypeServerMsg {
    type Observation = TypeServerObservation;
    fn observe(reply: RpcReplyPort<TypeServerObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// The type server actor (`couch_jobs_server`); its children are the per-type monitors and
/// notifiers.
pub struct TypeServer;

struct Pair {
    monitor: ActorRef<MonitorMsg>,
    notifier: ActorRef<NotifierMsg>,
}

/// The type server's state: the jobs handle and the running monitor/notifier pair per type.
pub struct TypeServerState {
    jobs: Jobs,
    children: HashMap<String, Pair>,
}

impl TypeServerState {
    async fn start_type(
        &mut self,
        myself: &ActorRef<TypeServerMsg>,
        ty: &str,
    ) -> Result<(), ActorProcessingErr> {
        if self.children.contains_key(ty) {
            return Ok(());
        }
        let args = (self.jobs.clone(), ty.to_string());
        let (monitor, _) =
            Actor::spawn_linked(None, MonitorActor, args.clone(), myself.get_cell()).await?;
        let (notifier, _) =
            Actor::spawn_linked(None, NotifierActor, args, myself.get_cell()).await?;
        tracing::debug!(job_type = ty, "started activity monitor and notifier");
        self.children
            .insert(ty.to_string(), Pair { monitor, notifier });
        self.publish();
        Ok(())
    }

    fn stop_type(&mut self, ty: &str) {
        if let Some(pair) = self.children.remove(ty) {
            pair.monitor.stop(None);
            pair.notifier.stop(None);
            tracing::debug!(job_type = ty, "stopped activity monitor and notifier");
        }
        self.publish();
    }

    fn publish(&self) {
        let map = self
            .children
            .iter()
            .map(|(ty, p)| (ty.clone(), p.notifier.clone()))
            .collect();
        self.jobs.registry().set_notifiers(map);
        let monitors = self
            .children
            .iter()
            .map(|(ty, p)| (ty.clone(), p.monitor.clone()))
            .collect();
        self.jobs.registry().set_monitors(monitors);
    }

    async fn check(&mut self, myself: &ActorRef<TypeServerMsg>) -> Result<(), ActorProcessingErr> {
        let jobs = self.jobs.clone();
        let types = jobs
            .db()
            .run(|tx| {
                let jobs = jobs.clone();
                async move { get_types(jobs.keys(), &tx).await }
            })
            .await;
        let types = match types {
            Ok(t) => t,
            Err(e) => {
                // CouchDB treats this as "no types"; keeping the running set avoids stopping
                // every monitor on one failed read.
                tracing::warn!(error = %e, "type check failed; keeping current types");
                return Ok(());
            }
        };
        let gone: Vec<String> = self
            .children
            .keys()
            .filter(|t| !types.contains(t))
            .cloned()
            .collect();
        for ty in gone {
            self.stop_type(&ty);
        }
        for ty in types {
            self.start_type(myself, &ty).await?;
        }
        Ok(())
    }

    fn next_tick(&self) -> Duration {
        let cfg = self.jobs.config();
        let period_ms = cfg.type_check_period.as_millis() as u64;
        let bound = (period_ms / 2)
            .max(cfg.type_check_max_jitter.as_millis() as u64)
            .max(1);
        let jitter = rand::rng().random_range(0..bound);
        Duration::from_millis(period_ms + jitter)
    }
}

impl Actor for TypeServer {
    type Msg = TypeServerMsg;
    type State = TypeServerState;
    type Arguments = Jobs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        jobs: Jobs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = TypeServerState {
            jobs,
            children: HashMap::new(),
        };
        state.publish();
        state.check(&myself).await?;
        state.jobs.registry().set_server(Some(myself.clone()));
        myself.send_after(state.next_tick(), || TypeServerMsg::Tick);
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.jobs.registry().set_server(None);
        let tys: Vec<String> = state.children.keys().cloned().collect();
        for ty in tys {
            if let Some(pair) = state.children.remove(&ty) {
                let _ = pair
                    .monitor
                    .stop_and_wait(None, Some(Duration::from_secs(5)))
                    .await;
                let _ = pair
                    .notifier
                    .stop_and_wait(None, Some(Duration::from_secs(5)))
                    .await;
            }
        }
        state.publish();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TypeServerMsg::Tick => {
                state.check(&myself).await?;
                myself.send_after(state.next_tick(), || TypeServerMsg::Tick);
            }
            TypeServerMsg::CheckNow(reply) => {
                state.check(&myself).await?;
                let _ = reply.send(());
            }
            TypeServerMsg::Ensure(ty, reply) => {
                state.start_type(&myself, &ty).await?;
                let found = state
                    .children
                    .get(&ty)
                    .map(|p| p.notifier.clone())
                    .ok_or_else(|| format!("no notifier for type {ty}"));
                let _ = reply.send(found);
            }
            TypeServerMsg::Observe(reply) => {
                let mut types: Vec<String> = state.children.keys().cloned().collect();
                types.sort();
                let _ = reply.send(TypeServerObservation { types });
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let who = match &event {
            SupervisionEvent::ActorTerminated(who, _, _)
            | SupervisionEvent::ActorFailed(who, _) => who.get_id(),
            _ => return Ok(()),
        };
        let ours = state
            .children
            .values()
            .any(|p| p.monitor.get_id() == who || p.notifier.get_id() == who);
        if ours {
            // A monitor or notifier died unexpectedly: fail so jobs_sup restarts everything.
            return Err(format!("couch_jobs child died: {event}").into());
        }
        Ok(())
    }
}
