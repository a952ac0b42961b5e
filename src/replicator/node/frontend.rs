//! The `api_frontend` children of the tree: `doc_processor` and `http`, last in
//! `replicator_sup`'s `rest_for_one` order, started only on nodes whose types include
//! `api_frontend`.
//!
//! Each is a `FrontendService` actor running one future (a service) on a task. The service
//! gets the node's [`Replicator`] handle; because the handle only exists once the tree has
//! started, the task waits for it on a watch channel the handle fills right after start. The
//! service ending with an error fails the actor (the supervisor restarts it); stopping or
//! killing the actor aborts the task (dropping the service: its listener, its followers). `http` lives in
//! the `http` module, which depends on this one, so the host passes it in as a [`ServiceFn`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use supervisors::{BoxError, ExitReason, Observable, Server};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::replicator::Replicator;
use crate::replicator::replicator_db::doc_processor::{DocProcessor, DocProcessorConfig};

/// A running service; `Err` is a crash (the actor fails and is restarted).
pub type ServiceFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
/// Starts a service on the node's handle (called again at every restart).
pub type ServiceFn = Arc<dyn Fn(Arc<Replicator>) -> ServiceFuture + Send + Sync>;

/// Child id of the doc_processor.
pub(crate) const DOC_PROCESSOR: &str = "doc_processor";
/// Child id of the HTTP API.
pub const HTTP: &str = "http";

/// What the `api_frontend` part of a node runs (ignored on nodes without that type).
#[derive(Clone, Default)]
pub struct Frontend {
    /// Follow these `_replicator` databases (`None` or no databases: no doc_processor).
    pub doc_processor: Option<DocProcessorConfig>,
    /// The HTTP API (built by the host from `crate::http`).
    pub http: Option<ServiceFn>,
}

impl std::fmt::Debug for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frontend")
            .field("doc_processor", &self.doc_processor)
            .field("http", &self.http.is_some())
            .finish()
    }
}

impl Frontend {
    /// The doc_processor as a service, if there are databases to follow.
    pub(crate) fn doc_processor_service(&self) -> Option<ServiceFn> {
        let cfg = self.doc_processor.clone().filter(|c| !c.dbs.is_empty())?;
        Some(Arc::new(move |rep| {
            let cfg = cfg.clone();
            Box::pin(async move {
                // Held until the task is aborted; dropping it aborts the followers.
                let _docs = DocProcessor::start(rep, cfg).map_err(|e| e.to_string())?;
                std::future::pending::<()>().await;
                Ok(())
            })
        }))
    }
}

/// Where services wait for the node's handle.
pub(crate) type HandleRx = watch::Receiver<Option<Arc<Replicator>>>;

/// The actor running one service.
#[derive(Clone)]
pub(crate) struct FrontendService {
    pub name: &'static str,
    pub run: ServiceFn,
    pub handle: HandleRx,
}

/// The service's task. Dropping it aborts the service, so that a killed actor (which runs
/// no `terminate`) does not leave its listener or followers behind for the restart to
/// collide with.
pub(crate) struct ServiceTask(Option<JoinHandle<()>>);

impl Drop for ServiceTask {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

/// Messages of a frontend service actor.
#[derive(Debug)]
pub enum ServiceMsg {
    /// Sent by the service task when the service returns (`Err`: crashed).
    Ended(Result<(), String>),
    /// The service's state.
    Observe(RpcReplyPort<FrontendObservation>),
}

/// What [`ServiceMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FrontendObservation {
    /// The child id (`doc_processor`, `http`).
    pub service: String,
    /// The node's handle is there (before, the service waits for it).
    pub handle_ready: bool,
    /// The service's task is still running.
    pub running: bool,
}

impl Observable for ServiceMsg {
    type Observation = FrontendObservation;
    fn observe(reply: RpcReplyPort<FrontendObservation>) -> Self {
        Self::Observe(reply)
    }
}

impl Server for FrontendService {
    type Msg = ServiceMsg;
    type State = ServiceTask;
    type Args = ();

    async fn init(&self, myself: ActorRef<ServiceMsg>, _: ()) -> Result<ServiceTask, BoxError> {
        let mut handle = self.handle.clone();
        let run = self.run.clone();
        Ok(ServiceTask(Some(tokio::spawn(async move {
            // After the first start the sender is gone; the value stays.
            let current = handle.borrow().clone();
            let rep = match current {
                Some(r) => r,
                None => match handle.wait_for(Option::is_some).await {
                    Ok(r) => match r.clone() {
                        Some(r) => r,
                        None => return,
                    },
                    Err(_) => return,
                },
            };
            let res = run(rep).await;
            let _ = myself.send_message(ServiceMsg::Ended(res));
        }))))
    }

    async fn handle(
        &self,
        myself: ActorRef<ServiceMsg>,
        msg: ServiceMsg,
        task: &mut ServiceTask,
    ) -> Result<(), BoxError> {
        match msg {
            ServiceMsg::Observe(reply) => {
                let _ = reply.send(FrontendObservation {
                    service: self.name.to_owned(),
                    handle_ready: self.handle.borrow().is_some(),
                    running: task.0.as_ref().is_some_and(|t| !t.is_finished()),
                });
                Ok(())
            }
            ServiceMsg::Ended(Ok(())) => {
                tracing::info!(service = self.name, "frontend service ended");
                myself.stop(None);
                Ok(())
            }
            ServiceMsg::Ended(Err(e)) => Err(format!("{} failed: {e}", self.name).into()),
        }
    }

    async fn terminate(&self, _: ActorRef<ServiceMsg>, mut task: ServiceTask, _: ExitReason) {
        if let Some(t) = task.0.take() {
            t.abort();
            let _ = t.await;
        }
    }
}
