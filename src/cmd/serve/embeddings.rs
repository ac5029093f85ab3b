//! `POST /v1/embeddings`: OpenAI's request (`input`: a string, an array of strings, or token
//! ids) answered with duet_runtime's mean-pooled, unit-length embeddings
//! (`duet_runtime::tools::embed`), one engine call per input, between generation steps.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use duet_runtime::tools::serve::openai::ApiError;
use serde_json::{Value, json};

use super::App;
use super::guard::{Served, error, object};

/// One input to embed.
enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

/// Inputs one request may give (OpenAI's limit is 2,048; each here is a forward pass over
/// up to a context of tokens, between other requests' steps).
const MAX_INPUTS: usize = 64;

pub async fn embeddings(State(app): State<Arc<App>>, req: Request) -> Response {
    let o = match object(&app, req, &["input", "model", "encoding_format", "user", "dimensions"]).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let bad = |m: String| error(ApiError::bad_request(m));
    // The openai client asks for base64 (the f32s' little-endian bytes) and decodes it.
    let base64 = match o.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(v) => return bad(format!("'encoding_format' must be \"float\" or \"base64\", got {v}")),
    };
    if o.get("dimensions").is_some_and(|d| !d.is_null()) {
        return bad("'dimensions' is not implemented by duet: the embedding has the model's width".into());
    }
    // Texts (tokenized the model's way) or token ids (embedded as given).
    let vocab = app.handle.n_vocab();
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?.iter().map(|x| x.as_u64().filter(|&i| i < vocab as u64).map(|i| i as u32)).collect()
    };
    let bad_ids = || bad(format!("'input' token ids must be whole numbers below the model's vocabulary of {vocab}"));
    let inputs: Vec<Input> = match o.get("input") {
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => {
            a.iter().filter_map(|s| s.as_str().map(|s| Input::Text(s.to_string()))).collect()
        }
        Some(v @ Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_number) => match ids(v) {
            Some(t) => vec![Input::Tokens(t)],
            None => return bad_ids(),
        },
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_array) => {
            match a.iter().map(|x| ids(x).map(Input::Tokens)).collect() {
                Some(t) => t,
                None => return bad_ids(),
            }
        }
        _ => return bad("'input' must be a string, an array of strings, or token ids".into()),
    };
    if inputs.len() > MAX_INPUTS {
        return bad(format!("'input' holds {} inputs; duet takes at most {MAX_INPUTS}", inputs.len()));
    }
    let mut data = Vec::with_capacity(inputs.len());
    let mut tokens = 0;
    for (i, input) in inputs.into_iter().enumerate() {
        let worker = Arc::clone(&app);
        let out = tokio::task::spawn_blocking(move || match input {
            Input::Text(text) => worker.handle.embed(&text),
            Input::Tokens(ids) => worker.handle.embed_tokens(ids),
        })
        .await;
        match out {
            Ok(Ok((v, n))) => {
                tokens += n;
                let embedding = if base64 { json!(encode_base64(&v)) } else { json!(v) };
                data.push(json!({"object": "embedding", "index": i, "embedding": embedding}));
            }
            Ok(Err(e)) => return error(super::complete::submit_error(e)),
            Err(e) => return error(ApiError { status: 500, kind: "server_error", message: e.to_string() }),
        }
    }
    let usage = duet_runtime::tools::serve::openai_reply::Usage { prompt: tokens, completion: 0 };
    let mut r = axum::Json(json!({
        "object": "list",
        "data": data,
        "model": app.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response();
    r.extensions_mut().insert(Served { tokens: Some(usage) });
    r
}

/// Standard base64 (with padding) of `v`'s little-endian bytes.
fn encode_base64(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            out.push(if k <= c.len() { ABC[(n >> shift & 63) as usize] as char } else { '=' });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        // 1.0f32 = 00 00 80 3F; two of them and a half: 00 00 00 3F.
        assert_eq!(super::encode_base64(&[1.0]), "AACAPw==");
        assert_eq!(super::encode_base64(&[1.0, 0.5]), "AACAPwAAAD8=");
        assert_eq!(super::encode_base64(&[]), "");
    }
}
