//! [`NodeName`]: a replicator node's name, unique in the cluster sharing one store
//! (`node1@127.0.0.1` by default). Job records, membership keys and `_scheduler` replies carry
//! it as its bare text.

text_id! {
    /// A replicator node's name.
    NodeName
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_their_text_in_json() {
        let n = NodeName::from("node1@127.0.0.1");
        assert_eq!(
            serde_json::to_value(&n).unwrap(),
            serde_json::json!("node1@127.0.0.1")
        );
        assert_eq!(n.as_str(), "node1@127.0.0.1");
        assert_eq!(n, "node1@127.0.0.1");
    }
}
