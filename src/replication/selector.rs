//! Normal form of a Mango selector for the replication id (digest D.4: "normalized selector
//! with dotted keys"), so selectors that mean the same select the same id: nested field
//! objects become dotted paths, bare values become `$eq`, nested `$and`s are flattened, and
//! the conditions of an `$and` are put in a canonical order. Takes a selector value; pure.

use serde_json::{Map, Value, json};

/// Operators that combine whole sub-selectors.
const COMBINATORS: [&str; 4] = ["$or", "$nor", "$all", "$elemMatch"];

/// The normal form of `sel`.
pub fn normalize(sel: &Value) -> Value {
    let mut conds = Vec::new();
    collect(sel, "", &mut conds);
    if conds.len() == 1 {
        conds.pop().unwrap_or(Value::Null)
    } else {
        // `$and` is commutative: order its conditions by their text.
        conds.sort_by_cached_key(|c| c.to_string());
        json!({ "$and": conds })
    }
}

fn single(k: String, v: Value) -> Value {
    let mut m = Map::new();
    m.insert(k, v);
    Value::Object(m)
}

fn is_operator_object(v: &Value) -> bool {
    v.as_object()
        .is_some_and(|m| !m.is_empty() && m.keys().all(|k| k.starts_with('$')))
}

/// Appends the single-field conditions of `sel` (under field path `prefix`) to `out`.
fn collect(sel: &Value, prefix: &str, out: &mut Vec<Value>) {
    let Some(m) = sel.as_object() else {
        out.push(single(prefix.to_owned(), json!({ "$eq": sel })));
        return;
    };
    if m.is_empty() {
        out.push(if prefix.is_empty() {
            json!({})
        } else {
            single(prefix.to_owned(), json!({ "$eq": {} }))
        });
        return;
    }
    for (k, v) in m {
        if k == "$and" && prefix.is_empty() {
            for sub in v.as_array().into_iter().flatten() {
                collect(sub, "", out);
            }
        } else if k == "$not" && prefix.is_empty() {
            out.push(json!({ "$not": normalize(v) }));
        } else if COMBINATORS.contains(&k.as_str()) && prefix.is_empty() {
            let subs: Vec<Value> = v
                .as_array()
                .map(|a| a.iter().map(normalize).collect())
                .unwrap_or_else(|| vec![v.clone()]);
            out.push(single(k.clone(), Value::Array(subs)));
        } else if k.starts_with('$') {
            // An operator applied to the field at `prefix`.
            out.push(single(prefix.to_owned(), single(k.clone(), v.clone())));
        } else {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            if is_operator_object(v) {
                for (op, arg) in v.as_object().into_iter().flatten() {
                    out.push(single(path.clone(), single(op.clone(), arg.clone())));
                }
            } else if v.as_object().is_some_and(|o| !o.is_empty()) {
                collect(v, &path, out);
            } else {
                out.push(single(path, json!({ "$eq": v })));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equivalent_selectors_share_a_normal_form() {
        let n = normalize(&json!({"a": 1, "b": {"c": 2}}));
        assert_eq!(n, json!({"$and": [{"a": {"$eq": 1}}, {"b.c": {"$eq": 2}}]}));
        assert_eq!(
            n,
            normalize(&json!({"$and": [{"b.c": {"$eq": 2}}, {"a": 1}]}))
        );
        assert_ne!(n, normalize(&json!({"a": 1, "b": {"c": 3}})));
        assert_eq!(
            normalize(&json!({"x": {"$gt": 1}})),
            json!({"x": {"$gt": 1}})
        );
    }
}
