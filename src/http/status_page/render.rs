//! Server-side rendering of the status page: the embedded template filled with the first
//! snapshot (summary, queue, nodes, first page of jobs), so the page is useful before any
//! script runs; `app.js` then keeps it live. Every value is HTML-escaped.

use std::fmt::Write;

use super::model::{JobRow, Status};
use crate::replication::RepId;
use crate::replicator::NodeName;

const TEMPLATE: &str = include_str!("page.html");

/// `&`, `<`, `>`, `"`, `'` escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn opt(v: Option<&str>) -> String {
    escape(v.unwrap_or(""))
}

/// One `<tr>` (the same cells `app.js` renders).
fn job_row(r: &JobRow) -> String {
    let pending = r.changes_pending.map_or(String::new(), |n| n.to_string());
    let lag = r.lag_seconds.map_or(String::new(), |n| n.to_string());
    let backoff = r
        .retry_in_s
        .map_or(String::new(), |s| format!("retry in {s} s"));
    format!(
        "<tr data-job-id=\"{id}\"><td class=\"id\" title=\"{rep}\">{id}</td>\
         <td class=\"state state-{st}\">{st}</td><td>{src}</td><td>{tgt}</td>\
         <td>{node}</td><td class=\"num docs\">{docs}</td><td class=\"num rate\"></td>\
         <td class=\"num\">{pending}</td><td class=\"num lag\">{lag}</td><td class=\"num\">{errors}</td>\
         <td class=\"reason\">{reason} {backoff}</td></tr>",
        id = escape(r.job_id.as_str()),
        rep = opt(r.rep_id.as_ref().map(RepId::full).as_deref()),
        st = r.state,
        src = opt(r.source.as_deref()),
        tgt = opt(r.target.as_deref()),
        node = opt(r.node.as_ref().map(NodeName::as_str)),
        docs = r.docs_written,
        errors = r.error_count,
        reason = opt(r.reason.as_deref()),
    )
}

/// The page for `status`.
pub fn page(status: &Status) -> String {
    let c = &status.counts;
    let summary = format!(
        "{} jobs: {} running, {} pending, {} crashing, {} completed, {} failed, {} paused",
        c.total, c.running, c.pending, c.crashing, c.completed, c.failed, c.paused
    );
    let rows: String = status.jobs.rows.iter().map(job_row).collect();
    let mut nodes = String::new();
    for n in &status.nodes {
        let _ = write!(
            nodes,
            "<li class=\"{}\">{}{} <small>{} ms ago</small></li>",
            if n.alive { "up" } else { "down" },
            escape(n.name.as_str()),
            if n.this_node { " (this node)" } else { "" },
            n.age_ms
        );
    }
    let mut queues = String::new();
    for q in &status.queues {
        let _ = write!(
            queues,
            "<li>{}: {} pending, {} due</li>",
            escape(&q.job_type),
            q.pending,
            q.due
        );
    }
    TEMPLATE
        .replace("{{NODE}}", &escape(status.node.as_str()))
        .replace("{{SUMMARY}}", &escape(&summary))
        .replace("{{ROWS}}", &rows)
        .replace("{{NODES}}", &nodes)
        .replace("{{QUEUES}}", &queues)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_values_is_escaped() {
        assert_eq!(
            escape("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
    }
}
