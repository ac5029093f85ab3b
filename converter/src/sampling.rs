//! `generation_config.json`'s sampling values as llama.cpp's `general.sampling.*` keys
//! (names in `duet_runtime::gguf_names::sampling`). Only when it samples (`do_sample: true`;
//! Hugging Face decodes greedily otherwise, whatever temperature it names); a value out of
//! its range (a negative temperature, a top-p above 1) is left out, not stored for every run
//! to trip on.

use duet_quant::gguf::Value;
use duet_runtime::gguf_names::sampling;
use serde_json::Value as Json;

/// The keys of `config` (generation_config.json), those it sets and that are in range.
pub fn kvs(config: Option<&Json>) -> Vec<(String, Value)> {
    let Some(g) = config.filter(|g| g.get("do_sample").and_then(Json::as_bool) == Some(true)) else {
        return Vec::new();
    };
    let num = |k: &str| g.get(k).and_then(Json::as_f64).filter(|v| v.is_finite());
    let mut out = Vec::new();
    if let Some(t) = num("temperature").filter(|t| *t >= 0.0) {
        out.push((sampling::TEMP.to_string(), Value::F32(t as f32)));
    }
    if let Some(k) = g.get("top_k").and_then(Json::as_i64).filter(|k| (0..=i32::MAX as i64).contains(k)) {
        out.push((sampling::TOP_K.to_string(), Value::I32(k as i32)));
    }
    if let Some(p) = num("top_p").filter(|p| *p > 0.0 && *p <= 1.0) {
        out.push((sampling::TOP_P.to_string(), Value::F32(p as f32)));
    }
    if let Some(p) = num("min_p").filter(|p| (0.0..=1.0).contains(p)) {
        out.push((sampling::MIN_P.to_string(), Value::F32(p as f32)));
    }
    if let Some(r) = num("repetition_penalty").filter(|r| *r > 0.0) {
        out.push((sampling::PENALTY_REPEAT.to_string(), Value::F32(r as f32)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_in_range_become_keys() {
        let g = serde_json::json!({"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0, "repetition_penalty": 1.1, "do_sample": true});
        let kv = kvs(Some(&g));
        let names: Vec<&str> = kv.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [sampling::TEMP, sampling::TOP_K, sampling::TOP_P, sampling::MIN_P, sampling::PENALTY_REPEAT]
        );
        assert_eq!(kv[1].1, Value::I32(20));
        let bad = serde_json::json!({"do_sample": true, "temperature": -1, "top_k": -5, "top_p": 1.5, "repetition_penalty": 0});
        assert!(kvs(Some(&bad)).is_empty());
        let greedy = serde_json::json!({"temperature": 0.6, "top_k": 20});
        assert!(kvs(Some(&greedy)).is_empty(), "without do_sample the model decodes greedily");
        assert!(kvs(None).is_empty());
    }
}
