//! The normal form CouchDB's Mango gives a selector before it enters a replication id (its
//! three passes: explicit operators, dotted field paths, negations pushed to the leaves), and
//! the checks that reject a selector CouchDB would reject. Pure: takes and returns JSON.

use serde_json::{Map, Value};

/// Why a selector is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selector: {0}")]
pub struct SelectorError(pub String);

type Res = std::result::Result<Value, SelectorError>;

fn err<T>(msg: impl Into<String>) -> std::result::Result<T, SelectorError> {
    Err(SelectorError(msg.into()))
}

fn one(k: impl Into<String>, v: Value) -> Value {
    let mut m = Map::new();
    m.insert(k.into(), v);
    Value::Object(m)
}

/// The single key and value of a one-key object.
fn single(v: &Value) -> Option<(&str, &Value)> {
    let m = v.as_object()?;
    if m.len() != 1 {
        return None;
    }
    m.iter().next().map(|(k, v)| (k.as_str(), v))
}

/// The normal form of `sel` (an object), or why CouchDB would refuse it.
pub fn normalize(sel: &Value) -> Res {
    if sel.as_object().is_some_and(Map::is_empty) {
        return Ok(sel.clone());
    }
    let n = norm_negations(&norm_fields(&norm_ops(sel)?, "")?)?;
    if n.as_object().is_some_and(|m| m.contains_key("")) {
        return err("missing field name");
    }
    Ok(n)
}

fn map_list(args: &Value, op: &str, f: impl Fn(&Value) -> Res) -> Res {
    match args.as_array() {
        Some(a) => Ok(one(
            op,
            Value::Array(a.iter().map(f).collect::<Result<_, _>>()?),
        )),
        None => err(format!("bad argument to {op}")),
    }
}

/// Pass 1: every condition as an explicit operator; bare values become `$eq`, objects with
/// several keys an implicit `$and`.
fn norm_ops(v: &Value) -> Res {
    if let Some(m) = v.as_object()
        && m.len() > 1
    {
        let parts = m
            .iter()
            .map(|(k, x)| norm_ops(&one(k.clone(), x.clone())))
            .collect::<Result<_, _>>()?;
        return Ok(one("$and", Value::Array(parts)));
    }
    let Some((k, arg)) = single(v) else {
        return Ok(one("$eq", v.clone()));
    };
    let bad = || err(format!("bad argument to {k}"));
    match k {
        "$and" | "$or" | "$nor" => map_list(arg, k, norm_ops),
        "$not" | "$elemMatch" | "$allMatch" | "$keyMapMatch" if arg.is_object() => {
            Ok(one(k, norm_ops(arg)?))
        }
        "$not" | "$elemMatch" | "$allMatch" | "$keyMapMatch" => bad(),
        "$in" | "$nin" | "$all" if arg.is_array() => Ok(v.clone()),
        "$exists" if arg.is_boolean() => Ok(v.clone()),
        "$type" | "$regex" | "$beginsWith" if arg.is_string() => Ok(v.clone()),
        "$mod" => match arg.as_array().map(Vec::as_slice) {
            Some([d, r]) if is_int(d) && is_int(r) => Ok(v.clone()),
            _ => bad(),
        },
        "$size" if arg.is_u64() => Ok(v.clone()),
        "$text" if arg.is_string() || arg.is_number() || arg.is_boolean() => {
            Ok(one("$default", v.clone()))
        }
        "$default" | "$lt" | "$lte" | "$eq" | "$ne" | "$gte" | "$gt" => Ok(v.clone()),
        "$where" | "$geoWithin" | "$geoIntersects" | "$near" | "$nearSphere" => {
            err(format!("{k} is not supported"))
        }
        _ if k.starts_with('$') && is_checked_op(k) => bad(),
        _ if k.starts_with('$') => err(format!("invalid operator {k}")),
        field => Ok(one(field, norm_ops(arg)?)),
    }
}

fn is_int(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

fn is_checked_op(k: &str) -> bool {
    matches!(
        k,
        "$in"
            | "$nin"
            | "$all"
            | "$exists"
            | "$type"
            | "$regex"
            | "$beginsWith"
            | "$size"
            | "$text"
    )
}

/// Pass 2: field names pushed down to the operators as dotted paths.
fn norm_fields(v: &Value, path: &str) -> Res {
    if v.as_object().is_some_and(Map::is_empty) {
        return if path.is_empty() {
            Ok(v.clone())
        } else {
            err("bad field")
        };
    }
    let Some((k, arg)) = single(v) else {
        return err("bad field");
    };
    match k {
        "$and" | "$or" | "$nor" => map_list(arg, k, |a| norm_fields(a, path)),
        "$not" => Ok(one(k, norm_fields(arg, path)?)),
        "$elemMatch" | "$allMatch" | "$keyMapMatch" => {
            let inner = if arg.as_object().is_some_and(Map::is_empty) {
                arg.clone()
            } else {
                norm_fields(arg, "")?
            };
            Ok(one(path, one(k, inner)))
        }
        "$default" => match single(arg) {
            Some(("$text", _)) if path.is_empty() => Ok(v.clone()),
            _ => err("bad field"),
        },
        _ if k.starts_with('$') => Ok(one(path, v.clone())),
        field if path.is_empty() => norm_fields(arg, field),
        field => norm_fields(arg, &format!("{path}.{field}")),
    }
}

/// Pass 3: `$not` and `$nor` moved down to the leaves (De Morgan, inverted comparisons).
fn norm_negations(v: &Value) -> Res {
    let Some((k, arg)) = single(v) else {
        return Ok(v.clone());
    };
    match k {
        "$not" => negate(arg),
        "$nor" => map_list(arg, "$and", negate),
        "$and" | "$or" => map_list(arg, k, norm_negations),
        "$elemMatch" | "$allMatch" | "$keyMapMatch" => Ok(one(k, norm_negations(arg)?)),
        _ => Ok(v.clone()),
    }
}

fn negate(v: &Value) -> Res {
    let Some((k, arg)) = single(v) else {
        return err("bad argument to $not");
    };
    let flipped = match k {
        "$not" => return norm_negations(arg),
        "$nor" => return map_list(arg, "$or", norm_negations),
        "$and" => return map_list(arg, "$or", negate),
        "$or" => return map_list(arg, "$and", negate),
        "$default" => return err("bad argument to $not"),
        "$exists" => return Ok(one(k, Value::Bool(!arg.as_bool().unwrap_or(false)))),
        "$lt" => "$gte",
        "$lte" => "$gt",
        "$eq" => "$ne",
        "$ne" => "$eq",
        "$gte" => "$lt",
        "$gt" => "$lte",
        "$in" => "$nin",
        "$nin" => "$in",
        _ if k.starts_with('$') => return Ok(one("$not", v.clone())),
        field => return Ok(one(field, negate(arg)?)),
    };
    Ok(one(flipped, arg.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Known answers from `mango_selector:normalize/1` of CouchDB 3.4.3.
    #[test]
    fn normal_forms_match_mango() {
        let cases = [
            (json!({"a": 1}), json!({"a": {"$eq": 1}})),
            (
                json!({"a": 1, "b": {"c": 2}}),
                json!({"$and": [{"a": {"$eq": 1}}, {"b.c": {"$eq": 2}}]}),
            ),
            (json!({"x": {"$gt": 1}}), json!({"x": {"$gt": 1}})),
            (
                json!({"$not": {"x": {"$gt": 1}}}),
                json!({"x": {"$lte": 1}}),
            ),
            (
                json!({"$nor": [{"a": 1}, {"b": {"$in": [1]}}]}),
                json!({"$and": [{"a": {"$ne": 1}}, {"b": {"$nin": [1]}}]}),
            ),
            (
                json!({"a": {"$elemMatch": {"b": 1}}}),
                json!({"a": {"$elemMatch": {"b": {"$eq": 1}}}}),
            ),
            (
                json!({"a": {"$not": {"$regex": "x"}}}),
                json!({"a": {"$not": {"$regex": "x"}}}),
            ),
            (json!({"$text": "hi"}), json!({"$default": {"$text": "hi"}})),
            (json!({}), json!({})),
            (json!({"a": {}}), json!({"a": {"$eq": {}}})),
            (
                json!({"$and": [{"a": {"$gt": 1}}, {"$or": [{"b": {"c": {"$exists": true}}}]}],
                    "z": [1, {"y": 2, "x": 1}]}),
                json!({"$and": [{"$and": [{"a": {"$gt": 1}}, {"$or": [{"b.c": {"$exists": true}}]}]},
                    {"z": {"$eq": [1, {"y": 2, "x": 1}]}}]}),
            ),
            (
                json!({"a": {"$not": {"$or": [{"$gt": 1}, {"$exists": false}]}}}),
                json!({"$and": [{"a": {"$lte": 1}}, {"a": {"$exists": true}}]}),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(&input).unwrap(), want, "{input}");
        }
    }

    #[test]
    fn selectors_couchdb_refuses_are_errors() {
        for bad in [
            json!({"a": {"$bogus": 1}}),
            json!({"a": {"$in": 1}}),
            json!({"$and": {"a": 1}}),
            json!({"a": {"$size": -1}}),
            json!({"a": {"$where": "x"}}),
            json!({"$gt": 1}),
        ] {
            assert!(normalize(&bad).is_err(), "{bad}");
        }
    }
}
