//! The `/_node/_local/_stats/couch_replicator` body: CouchDB's nested shape, one object per
//! path segment, each series a leaf `{"value", "type", "desc"}`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::couch_series::CouchStats;

/// A node of the stats tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StatNode {
    /// One series.
    Leaf {
        /// Current value.
        value: u64,
        /// `counter` or `gauge`.
        #[serde(rename = "type")]
        kind: &'static str,
        /// Description.
        desc: &'static str,
    },
    /// A group (`jobs`, `responses`, ...).
    Group(BTreeMap<&'static str, StatNode>),
}

/// The tree of every series' current value.
pub fn stats_tree(stats: &CouchStats) -> StatNode {
    let mut root = BTreeMap::new();
    for (def, value) in stats.snapshot() {
        let leaf = StatNode::Leaf {
            value,
            kind: def.kind.as_str(),
            desc: def.desc,
        };
        insert(&mut root, def.path, leaf);
    }
    StatNode::Group(root)
}

fn insert(group: &mut BTreeMap<&'static str, StatNode>, path: &[&'static str], leaf: StatNode) {
    match path {
        [] => {}
        [last] => {
            group.insert(last, leaf);
        }
        [first, rest @ ..] => {
            let child = group
                .entry(first)
                .or_insert_with(|| StatNode::Group(BTreeMap::new()));
            // A path prefix that is itself a leaf cannot happen with CouchDB's table.
            if let StatNode::Group(g) = child {
                insert(g, rest, leaf);
            }
        }
    }
}
