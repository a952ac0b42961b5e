//! A replication's start-up (CouchDB's couch_replicator_scheduler_job.erl init): the target
//! created when asked, both databases opened, the replication id computed (with the filter's
//! code read from the source), and the start point found from the checkpoints. The pipeline
//! ([`super::run`]) calls [`open`] and runs from what it returns.

use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::checkpoint::{Checkpointer, StartPoint, checkpoint_path, instance_start_of, read_local};
use super::context::{Context, clients};
use super::revs_diff::TargetAtStart;
use crate::replication::changes::reader::feed_request;
use crate::replication::endpoint::database::{encode_doc_id, encode_query};
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{HttpClient, Req};
use crate::replication::id::rep_id::{RepId, checkpoint_ids, replication_id};
use crate::replication::options::spec::{Filter, ReplicationOptions, ReplicationSpec};

/// Fetches a user filter's source code (`ddoc/name`) from the source.
async fn filter_code(src: &HttpClient, name: &str) -> Result<String> {
    let (ddoc, fname) = name.split_once('/').ok_or_else(|| {
        ReplicationError::InvalidOptions(format!("filter `{name}` is not `ddoc/name`"))
    })?;
    let r = src
        .send(&Req::get(encode_doc_id(&format!("_design/{ddoc}"))))
        .await?;
    if r.status != StatusCode::OK {
        return Err(ReplicationError::FilterFetch(format!(
            "design document `_design/{ddoc}` answered {}",
            r.status
        )));
    }
    let doc: Value = r.json("design document")?;
    doc.get("filters")
        .and_then(|f| f.get(fname))
        .and_then(Value::as_str)
        // Untrimmed: the id code trims it the way CouchDB does.
        .map(str::to_owned)
        .ok_or_else(|| {
            ReplicationError::FilterFetch(format!("`_design/{ddoc}` has no filter `{fname}`"))
        })
}

/// Computes the replication id (fetching the filter code from the source when needed).
pub async fn compute_id(spec: &ReplicationSpec, ctx: &Context) -> Result<RepId> {
    let (src, _) = clients(spec, ctx)?;
    compute_id_with(&src, spec, ctx).await
}

async fn compute_id_with(src: &HttpClient, spec: &ReplicationSpec, ctx: &Context) -> Result<RepId> {
    Ok(compute_ids_with(src, spec, ctx).await?.0)
}

/// The id and the base ids of every id version (where checkpoints may be found).
async fn compute_ids_with(
    src: &HttpClient,
    spec: &ReplicationSpec,
    ctx: &Context,
) -> Result<(RepId, Vec<String>)> {
    let code = match crate::replication::id::rep_id::filter_needing_code(spec) {
        Some(name) => Some(filter_code(src, name).await?),
        None => None,
    };
    Ok((
        replication_id(&ctx.server_uuid, spec, code.as_deref()),
        checkpoint_ids(&ctx.server_uuid, spec, code.as_deref()),
    ))
}

/// `GET db` (D.2 step 2): returns the db info or the error class.
pub(crate) async fn open_db(c: &HttpClient) -> Result<Value> {
    // Jobs starting together on the same database share this read.
    let r = c.read_shared("").await?;
    let ep = c.endpoint().to_string();
    match r.status {
        StatusCode::OK => {
            // CouchDB's tag, with what was wrong.
            let v: Value = r
                .json("database info")
                .map_err(|e| ReplicationError::DbNotFound(format!("{ep} ({e})")))?;
            if v.get("update_seq").is_none() {
                return Err(ReplicationError::DbNotFound(ep));
            }
            Ok(v)
        }
        StatusCode::UNAUTHORIZED => Err(c.unauthorized()),
        StatusCode::FORBIDDEN => Err(c.forbidden()),
        _ => Err(ReplicationError::DbNotFound(ep)),
    }
}

/// Creates the target; true when this request created it (201), so it holds nothing yet.
async fn create_target(tgt: &HttpClient, spec: &ReplicationSpec) -> Result<bool> {
    let mut q = String::new();
    for (k, v) in &spec.options.create_target_params {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        q.push(if q.is_empty() { '?' } else { '&' });
        q.push_str(&format!("{}={}", encode_query(k), encode_query(&v)));
    }
    let r = tgt
        .send(&Req {
            body: None,
            ..Req::json(Method::PUT, q, "")
        })
        .await?;
    match r.status {
        StatusCode::UNAUTHORIZED => Err(tgt.unauthorized()),
        StatusCode::FORBIDDEN => Err(tgt.forbidden()),
        StatusCode::CREATED => Ok(true),
        _ => Ok(false), // 412 exists, anything else shows up at GET db
    }
}

/// What start-up found: the endpoints' clients, the source's database info, the
/// replication id, and where to start (with the checkpointer that found it).
pub(crate) struct Opened {
    pub(crate) src: Arc<HttpClient>,
    pub(crate) tgt: Arc<HttpClient>,
    pub(crate) src_info: Value,
    pub(crate) keep_encoding: bool,
    /// What the target held at start.
    pub(crate) target: TargetAtStart,
    pub(crate) rep_id: RepId,
    pub(crate) checkpointer: Option<Checkpointer>,
    pub(crate) start_point: StartPoint,
    /// The one-shot feed's first answer, asked for ahead (from the `since` it holds).
    pub(crate) first_changes: Option<(Value, reqwest::Response)>,
}

/// Start-up (CouchDB's couch_replicator_scheduler_job.erl init): the clients, the target
/// created when asked, both databases opened, the ids computed, the start point found.
pub(crate) async fn open(spec: &ReplicationSpec, ctx: &Context) -> Result<Opened> {
    let (src, tgt) = clients(spec, ctx)?;
    let (rep_id, checkpoint_ids) = compute_ids_with(&src, spec, ctx).await?;
    let o = &spec.options;
    // On a long round trip every step taken one after the other costs a round trip (and a
    // new connection another), so the source is opened and its current checkpoint read while
    // the target is created. A target created now holds no checkpoint: that read is then all
    // the start needs (an existing target's search of older id versions does not repeat it).
    // Only the target's own reads wait for its creation.
    let early = o.create_target && o.use_checkpoints;
    let current = checkpoint_path(&checkpoint_ids);
    let (created, source_side) = tokio::join!(
        async {
            match o.create_target {
                true => create_target(&tgt, spec).await,
                false => Ok(false),
            }
        },
        async {
            tokio::try_join!(open_db(&src), async {
                match early {
                    true => read_local(&src, &current).await.map(Some),
                    false => Ok(None),
                }
            })
        }
    );
    let created = created?;
    // A database that cannot be opened is the error reported, whatever the checkpoint reads met.
    let (src_info, src_doc) = source_side?;
    // A one-shot run into a target created now starts from 0 (or `since_seq`), so its feed
    // is asked for while the target is opened; the reader takes that answer.
    let first_since = (created && !o.continuous).then(|| o.since_seq.clone().unwrap_or(json!(0)));
    let (tgt_info, found, first_changes) = tokio::join!(
        open_db(&tgt),
        find_start(&src, &tgt, o, &checkpoint_ids, created, src_doc),
        async {
            let since = first_since?;
            let req = feed_request(o, "normal", &since, None);
            // A failure here is the reader's to meet again, with its retries.
            src.send_streaming(&req).await.ok().map(|r| (since, r))
        }
    );
    let tgt_info = tgt_info?;
    let (mut checkpointer, start_point) = found?;
    if let Some(cp) = checkpointer.as_mut() {
        cp.expect_instance_start(instance_start_of(&src_info), instance_start_of(&tgt_info));
    }
    // CouchDB (its database info names its storage's `disk_format_version`) sends
    // gzip-encoded attachments as stored in any multipart answer, and only a CouchDB target
    // stores them so; pouchdb-server would keep the gzip bytes as the content. So from a
    // CouchDB source to any other target, attachments travel decoded (JSON).
    let is_couch = |info: &Value| info.get("disk_format_version").is_some();
    let keep_encoding = is_couch(&tgt_info) || !is_couch(&src_info);
    let count = |k: &str| tgt_info.get(k).and_then(Value::as_u64);
    let target = if created {
        TargetAtStart::Created
    } else if count("doc_count") == Some(0) && count("doc_del_count") == Some(0) {
        TargetAtStart::Empty
    } else {
        TargetAtStart::Holding
    };
    Ok(Opened {
        src,
        tgt,
        src_info,
        keep_encoding,
        target,
        rep_id,
        checkpointer,
        start_point,
        first_changes,
    })
}

/// Where the replication starts: the checkpoint found on both sides (under the current id
/// or an older one) and its sequence, unless checkpoints are off. `since_seq` overrides the
/// sequence but keeps the checkpoint's history and counters (CouchDB 3.4). `new_target`: the
/// target was created just now, so it holds no checkpoint and the replication starts from
/// scratch. `source_current`: the source's current checkpoint document when it was read
/// already (`Some(None)`: it has none).
async fn find_start(
    src: &Arc<HttpClient>,
    tgt: &Arc<HttpClient>,
    o: &ReplicationOptions,
    checkpoint_ids: &[String],
    new_target: bool,
    source_current: Option<Option<Value>>,
) -> Result<(Option<Checkpointer>, StartPoint)> {
    let mut checkpointer = None;
    let mut start_point = StartPoint {
        seq: json!(0),
        seed: None,
    };
    if o.use_checkpoints {
        let (mut cp, sp) = Checkpointer::load(
            src.clone(),
            tgt.clone(),
            checkpoint_ids,
            new_target,
            source_current,
        )
        .await?;
        cp.set_doc_ids(matches!(o.filter, Filter::DocIds(_)));
        checkpointer = Some(cp);
        start_point = sp;
    }
    if let Some(since) = &o.since_seq {
        start_point.seq = since.clone();
        if let Some(cp) = checkpointer.as_mut() {
            cp.set_start_seq(since.clone());
        }
    }
    Ok((checkpointer, start_point))
}
