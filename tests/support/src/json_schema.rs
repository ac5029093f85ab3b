//! A JSON Schema checker for the subset duet's schemas use: `type` (one or a list), `const`,
//! `enum`, `required`, `properties`, `additionalProperties: false`, `items`, `minItems`,
//! `maxItems`, `minimum`, `maximum`, `minLength`, `maxLength` (in characters). Keywords outside the subset are refused, so a schema
//! cannot silently check less than it says.

use serde_json::Value;

const KNOWN: [&str; 17] = [
    "$schema",
    "$id",
    "title",
    "description",
    "type",
    "const",
    "enum",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
];

fn type_ok(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.as_i64().is_some() || v.as_u64().is_some(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    }
}

/// Checks `v` against `schema`; the error names the JSON path and the broken rule.
pub fn validate(v: &Value, schema: &Value) -> Result<(), String> {
    check(v, schema, "$")
}

fn check(v: &Value, s: &Value, path: &str) -> Result<(), String> {
    let s = s.as_object().ok_or_else(|| format!("{path}: schema is not an object"))?;
    if let Some(k) = s.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("{path}: schema keyword {k:?} is not supported by this checker"));
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(a) => a.iter().filter_map(|x| x.as_str()).collect(),
            _ => return Err(format!("{path}: bad type keyword")),
        };
        if !types.iter().any(|t| type_ok(v, t)) {
            return Err(format!("{path}: {v} is not of type {t}"));
        }
    }
    if let Some(c) = s.get("const").filter(|c| *c != v) {
        return Err(format!("{path}: {v} is not {c}"));
    }
    if let Some(Value::Array(e)) = s.get("enum")
        && !e.contains(v)
    {
        return Err(format!("{path}: {v} is not one of {e:?}"));
    }
    if let Some(x) = v.as_f64() {
        if let Some(m) = s.get("minimum").and_then(Value::as_f64).filter(|m| x < *m) {
            return Err(format!("{path}: {x} < minimum {m}"));
        }
        if let Some(m) = s.get("maximum").and_then(Value::as_f64).filter(|m| x > *m) {
            return Err(format!("{path}: {x} > maximum {m}"));
        }
    }
    if let Value::String(t) = v {
        let n = t.chars().count() as u64;
        if let Some(m) = s.get("minLength").and_then(Value::as_u64).filter(|m| n < *m) {
            return Err(format!("{path}: {n} characters < minLength {m}"));
        }
        if let Some(m) = s.get("maxLength").and_then(Value::as_u64).filter(|m| n > *m) {
            return Err(format!("{path}: {n} characters > maxLength {m}"));
        }
    }
    if let Value::Object(o) = v {
        for r in s.get("required").and_then(Value::as_array).into_iter().flatten() {
            let r = r.as_str().unwrap_or_default();
            if !o.contains_key(r) {
                return Err(format!("{path}: required key {r:?} is missing"));
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => check(x, ps, &format!("{path}.{k}"))?,
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("{path}: key {k:?} is not in the schema"));
                }
                None => {}
            }
        }
    }
    if let Value::Array(a) = v {
        if let Some(m) = s.get("minItems").and_then(Value::as_u64).filter(|m| (a.len() as u64) < *m) {
            return Err(format!("{path}: {} items < minItems {m}", a.len()));
        }
        if let Some(m) = s.get("maxItems").and_then(Value::as_u64).filter(|m| (a.len() as u64) > *m) {
            return Err(format!("{path}: {} items > maxItems {m}", a.len()));
        }
        if let Some(is) = s.get("items") {
            for (i, x) in a.iter().enumerate() {
                check(x, is, &format!("{path}[{i}]"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::validate;

    #[test]
    fn each_rule_rejects_what_it_should() {
        let s = json!({
            "type": "object", "required": ["a"], "additionalProperties": false,
            "properties": {
                "a": { "type": "array", "minItems": 1, "maxItems": 2, "items": { "type": ["number", "null"], "minimum": 0, "maximum": 1 } },
                "b": { "enum": ["x", "y"] },
                "c": { "const": 3 },
                "d": { "type": "integer" },
                "f": { "type": "string", "minLength": 2, "maxLength": 3 }
            }
        });
        assert!(validate(&json!({"a": [0.5, null], "b": "x", "c": 3, "d": 2, "f": "äöü"}), &s).is_ok());
        for bad in [
            json!({}),
            json!({"a": []}),
            json!({"a": [0.1, 0.2, 0.3]}),
            json!({"a": [2.0]}),
            json!({"a": [-1.0]}),
            json!({"a": ["s"]}),
            json!({"a": [0.1], "b": "z"}),
            json!({"a": [0.1], "c": 4}),
            json!({"a": [0.1], "d": 1.5}),
            json!({"a": [0.1], "e": 1}),
            json!({"a": [0.1], "f": "x"}),
            json!({"a": [0.1], "f": "four"}),
            json!([1]),
        ] {
            assert!(validate(&bad, &s).is_err(), "accepted {bad}");
        }
        assert!(validate(&json!(1), &json!({"pattern": "x"})).is_err(), "unknown keywords are refused");
    }
}
