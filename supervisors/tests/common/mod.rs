//! Test support: a probe server that records its lifecycle in a shared log and crashes,
//! panics, stops or blocks on command, plus helpers to wait (under paused time) and to bound
//! every test with a deadline.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use supervisors::{BoxError, ExitReason, Server};

/// Shared event log.
#[derive(Clone, Default, Debug)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, event: impl Into<String>) {
        self.0.lock().unwrap().push(event.into());
    }

    /// Everything logged so far.
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Everything logged so far, and clear.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    pub fn count(&self, event: &str) -> usize {
        self.all().iter().filter(|e| e.as_str() == event).count()
    }
}

/// Commands a probe understands.
#[derive(Debug)]
pub enum Cmd {
    /// Return `Err("boom")` from `handle`.
    Fail,
    /// Panic in `handle`.
    Panic,
    /// Stop normally (`myself.stop(None)`).
    Stop,
    /// Sleep this long inside `handle` (the actor cannot take a stop meanwhile).
    Block(Duration),
    /// Answer with the probe's name and its start number.
    Ping(RpcReplyPort<(String, u32)>),
}

/// A probe server: logs `start NAME`, `terminate NAME REASON`, `terminated NAME`.
#[derive(Clone, Debug)]
pub struct Probe {
    pub name: String,
    pub log: Log,
    /// How many more `init`s fail (counts down).
    pub fail_inits: Arc<AtomicU32>,
    /// How long `terminate` takes (to make a child that ignores shutdown).
    pub slow_terminate: Duration,
    /// Starts so far (shared by all instances of this probe).
    pub starts: Arc<AtomicU32>,
}

impl Probe {
    pub fn new(name: &str, log: &Log) -> Self {
        Self {
            name: name.to_string(),
            log: log.clone(),
            fail_inits: Arc::new(AtomicU32::new(0)),
            slow_terminate: Duration::ZERO,
            starts: Arc::new(AtomicU32::new(0)),
        }
    }

    pub fn failing_inits(self, n: u32) -> Self {
        self.fail_inits.store(n, Ordering::SeqCst);
        self
    }

    pub fn slow_terminate(mut self, d: Duration) -> Self {
        self.slow_terminate = d;
        self
    }
}

/// A probe's state: its start number and its args.
pub struct ProbeState {
    pub start: u32,
    pub arg: String,
}

impl Server for Probe {
    type Msg = Cmd;
    type State = ProbeState;
    type Args = String;

    async fn init(&self, _: ActorRef<Cmd>, arg: String) -> Result<ProbeState, BoxError> {
        let left = self.fail_inits.load(Ordering::SeqCst);
        if left > 0 {
            self.fail_inits.store(left - 1, Ordering::SeqCst);
            self.log.push(format!("init-fail {}", self.name));
            return Err("init refused".into());
        }
        let start = self.starts.fetch_add(1, Ordering::SeqCst) + 1;
        self.log.push(format!("start {}", self.name));
        Ok(ProbeState { start, arg })
    }

    async fn handle(
        &self,
        myself: ActorRef<Cmd>,
        msg: Cmd,
        state: &mut ProbeState,
    ) -> Result<(), BoxError> {
        match msg {
            Cmd::Fail => return Err("boom".into()),
            Cmd::Panic => panic!("kaboom"),
            Cmd::Stop => myself.stop(None),
            Cmd::Block(d) => tokio::time::sleep(d).await,
            Cmd::Ping(reply) => {
                let _ = reply.send((format!("{}:{}", self.name, state.arg), state.start));
            }
        }
        Ok(())
    }

    async fn terminate(&self, _: ActorRef<Cmd>, _: ProbeState, reason: ExitReason) {
        self.log
            .push(format!("terminate {} {}", self.name, show(&reason)));
        if !self.slow_terminate.is_zero() {
            tokio::time::sleep(self.slow_terminate).await;
        }
        self.log.push(format!("terminated {}", self.name));
    }
}

/// A short text for a reason: `normal`, `shutdown`, `error:TEXT`.
pub fn show(reason: &ExitReason) -> String {
    match reason {
        ExitReason::Normal => "normal".into(),
        ExitReason::Shutdown => "shutdown".into(),
        ExitReason::Error(e) => format!("error:{e}"),
    }
}

/// Run `test` with a deadline (virtual time when paused), failing instead of hanging.
pub async fn deadline<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("test hit its deadline");
}

/// Poll `cond` until it holds (sleeping 1 ms between polls; instant under paused time).
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..20_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("condition never held: {what}");
}

/// Ping a probe: its `name:arg` and start number.
pub async fn ping(actor: &ActorRef<Cmd>) -> (String, u32) {
    ractor::call!(actor, Cmd::Ping).expect("ping")
}

/// Lines of `log` that begin with `start ` or `terminate ` (drops `terminated`).
pub fn lifecycle(log: &Log) -> Vec<String> {
    log.all()
        .into_iter()
        .filter(|e| e.starts_with("start ") || e.starts_with("terminate "))
        .collect()
}
