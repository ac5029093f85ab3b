//! llama-server's `POST /tokenize` (`{"content", "add_special", "with_pieces"}` →
//! `{"tokens"}`) and `POST /detokenize` (`{"tokens"}` → `{"content"}`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use duet_runtime::tools::serve::openai::ApiError;
use serde_json::{Map, Value, json};

use super::App;
use super::guard::{error, object};

fn flag(o: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(format!("'{key}' must be a boolean"))),
    }
}

pub async fn tokenize(State(app): State<Arc<App>>, req: Request) -> Response {
    let o = match object(&app, req, &["content", "add_special", "with_pieces"]).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let (add_special, with_pieces) = match (flag(&o, "add_special"), flag(&o, "with_pieces")) {
        (Ok(a), Ok(w)) => (a, w),
        (Err(e), _) | (_, Err(e)) => return error(e),
    };
    let Some(Value::String(content)) = o.get("content") else {
        return error(ApiError::bad_request("'content' must be a string"));
    };
    let tok = Arc::clone(app.handle.tokenizer());
    // Special-token text stays text, as in chat messages (llama-server parses it only when
    // asked to). Off the async workers: a large text takes a while.
    let (worker, text) = (Arc::clone(&tok), content.clone());
    let ids = match tokio::task::spawn_blocking(move || worker.encode_literal(&text)).await {
        Ok(Ok(ids)) => ids,
        Ok(Err(e)) => return error(ApiError::bad_request(e.to_string())),
        Err(e) => return error(ApiError { status: 500, kind: "server_error", message: e.to_string() }),
    };
    let ids: Vec<u32> = tok.bos.filter(|_| add_special && tok.add_bos).into_iter().chain(ids).collect();
    let tokens: Vec<Value> = if with_pieces {
        ids.iter().map(|&id| json!({"id": id, "piece": tok.decode(&[id], true).unwrap_or_default()})).collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    axum::Json(json!({ "tokens": tokens })).into_response()
}

pub async fn detokenize(State(app): State<Arc<App>>, req: Request) -> Response {
    let o = match object(&app, req, &["tokens"]).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let tok = app.handle.tokenizer();
    let n = tok.vocab_size() as u64;
    let ids: Option<Vec<u32>> = match o.get("tokens") {
        Some(Value::Array(a)) => a.iter().map(|v| v.as_u64().filter(|&id| id < n).map(|id| id as u32)).collect(),
        _ => None,
    };
    let Some(ids) = ids else {
        return error(ApiError::bad_request(format!("'tokens' must be an array of token ids below {n}")));
    };
    match tok.decode(&ids, true) {
        Ok(content) => axum::Json(json!({ "content": content })).into_response(),
        Err(e) => error(ApiError::bad_request(e.to_string())),
    }
}
