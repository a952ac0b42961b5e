//! Tracing: a subscriber (the process-wide one, for this crate's spans and events) captures
//! what one replication job logs. Every event
//! of the job's changes reader, workers and checkpointer carries the `replication_job` span
//! with the job id, the replication id and masked endpoints; couch_jobs' accept, update and
//! finish have their own spans; the source's password appears nowhere.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::http::{Node, Pouch};
use couch_replicator::http::HttpConfig;
use couch_replicator::replicator::{JobKind, NewJob, WaitFor};
use serde_json::json;
use tracing::Level;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = BTreeMap<String, String>;

/// A span as seen when an event fired or the span closed: its name, its fields, and the
/// names of the spans around it (outermost first).
#[derive(Clone, Debug)]
struct SpanRec {
    name: String,
    fields: Fields,
    parents: Vec<(String, Fields)>,
}

#[derive(Clone, Debug)]
struct EventRec {
    fields: Fields,
    scope: Vec<(String, Fields)>,
}

#[derive(Default)]
struct Captured {
    events: Vec<EventRec>,
    spans: Vec<SpanRec>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Captured>>);

struct SpanFields(Fields);

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

fn scope_of<S>(span: &tracing_subscriber::registry::SpanRef<'_, S>) -> Vec<(String, Fields)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    span.scope()
        .from_root()
        .map(|s| {
            let f = s
                .extensions()
                .get::<SpanFields>()
                .map(|f| f.0.clone())
                .unwrap_or_default();
            (s.name().to_owned(), f)
        })
        .collect()
}

impl<S> Layer<S> for Capture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Fields::new();
        attrs.record(&mut Visitor(&mut f));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(f));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(f) = span.extensions_mut().get_mut::<SpanFields>()
        {
            values.record(&mut Visitor(&mut f.0));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        let scope = ctx
            .event_span(event)
            .map(|s| scope_of(&s))
            .unwrap_or_default();
        self.0
            .lock()
            .unwrap()
            .events
            .push(EventRec { fields, scope });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let mut parents = scope_of(&span);
            let (name, fields) = parents.pop().unwrap();
            self.0.lock().unwrap().spans.push(SpanRec {
                name,
                fields,
                parents,
            });
        }
    }
}

const PASSWORD: &str = "s3cret-pw";

#[test]
fn a_jobs_tasks_log_under_its_span() {
    let capture = Capture::default();
    let ours = Targets::new().with_target("couch_replicator", Level::TRACE);
    let subscriber = tracing_subscriber::registry().with(capture.clone().with_filter(ours));
    // The process-wide subscriber, not one for this thread: other tests of this binary run
    // on other threads with none, and a callsite they register while a thread-local one is
    // being set can keep a cached "never" (under plain `cargo test` the acceptors' spans were
    // then never seen). It records only this crate's spans and events, and every check below
    // picks this test's job by its id.
    tracing::subscriber::set_global_default(subscriber)
        .expect("no other test of this binary installs a global subscriber");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (job_id, rep_id) = rt.block_on(crate::support::deadline(
        90,
        "a traced replication",
        async {
            let pouch = Pouch::start().await;
            let couch = Couch::new(&format!("{}/", pouch.url));
            couch.create_db("s").await;
            couch.bulk_insert("s", &numbered_docs("d", 30)).await;
            // A user, so the source URL can carry a password that must never be logged.
            pouch
                .put(
                    "_users/org.couchdb.user:alice",
                    json!({"name": "alice", "password": PASSWORD, "roles": [], "type": "user"}),
                )
                .await;
            let source = pouch
                .db("s")
                .replace("http://", &format!("http://alice:{PASSWORD}@"));
            let node = Node::start(HttpConfig::default()).await;
            let view = node
                .replicator
                .add(NewJob::from_body(
                    JobKind::Transient { user: None },
                    json!({"source": source, "target": pouch.db("t"), "create_target": true}),
                ))
                .await
                .unwrap();
            let done = node
                .replicator
                .wait(&view.job_id, WaitFor::Completed, Duration::from_secs(60))
                .await
                .unwrap();
            assert_eq!(couch.assert_same("s", &couch, "t").await, 30);
            (view.job_id.to_string(), done.rep_id.unwrap().full())
        },
    ));
    drop(rt);

    let cap = capture.0.lock().unwrap();
    let job_span = |scope: &[(String, Fields)]| -> Option<Fields> {
        scope
            .iter()
            .find(|(n, _)| n == "replication_job")
            .map(|(_, f)| f.clone())
    };
    // Events of every task of the job carry its span with both ids and masked endpoints.
    for message in [
        "replication starting",
        "changes reader started",
        "worker started",
        "checkpoint written",
        "replication finished",
    ] {
        let ours = |e: &&EventRec| {
            job_span(&e.scope).and_then(|f| f.get("job_id").cloned()) == Some(job_id.clone())
        };
        let of_message: Vec<&EventRec> = cap
            .events
            .iter()
            .filter(|e| e.fields.get("message").map(String::as_str) == Some(message))
            .collect();
        assert!(!of_message.is_empty(), "no `{message}` event was captured");
        let ev = of_message
            .iter()
            .copied()
            .find(ours)
            .unwrap_or_else(|| panic!("no `{message}` inside this job's span: {of_message:?}"));
        let f = job_span(&ev.scope).unwrap_or_default();
        assert_eq!(f.get("job_id"), Some(&job_id), "{message}: {f:?}");
        assert_eq!(f.get("rep_id"), Some(&rep_id), "{message}: {f:?}");
        let src = f.get("source").unwrap();
        assert!(src.contains("alice:*****@"), "{message}: source {src}");
    }
    // couch_jobs' spans: the accept names the job; update and finish run inside the job span.
    let named = |name: &str| -> Vec<&SpanRec> {
        cap.spans
            .iter()
            .filter(|s| s.name == name && s.fields.get("job_id") == Some(&job_id))
            .collect()
    };
    assert!(
        !named("couch_jobs.accept").is_empty(),
        "no accept span for {job_id}: {:?}",
        cap.spans
            .iter()
            .filter(|s| s.name.starts_with("couch_jobs"))
            .map(|s| (&s.name, &s.fields))
            .collect::<Vec<_>>()
    );
    for name in ["couch_jobs.update", "couch_jobs.finish"] {
        let spans = named(name);
        assert!(!spans.is_empty(), "no {name} span");
        assert!(
            spans.iter().any(|s| job_span(&s.parents).is_some()),
            "{name} never ran inside the job span"
        );
    }
    // Nothing captured carries the password.
    let all = format!("{:?}{:?}", cap.events, cap.spans);
    assert!(
        !all.contains(PASSWORD),
        "the password leaked into a span or event"
    );
}
