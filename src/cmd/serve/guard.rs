//! What every request of `duet serve` passes before its handler, and what it leaves: the
//! Host check (DNS rebinding), the API key, JSON bodies for POSTs, CORS (loopback origins by
//! default, others through `--cors`), OpenAI-style JSON for 404 and 405, and one log line per
//! request (method, path, status, tokens, milliseconds) on stderr.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use duet_runtime::tools::serve::openai::{ApiError, Kind};
use duet_runtime::tools::serve::openai_reply::Usage;
use serde_json::{Map, Value};

use super::App;
use crate::cmd::common::{host_name, is_loopback};

pub fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], e.body()).into_response()
}

/// Equal without an early exit at the first difference (the key comparison's time says
/// nothing about the key; its length is not secret).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The refusal, if any, of a request with these headers before anything else looks at it:
/// a Host the server does not answer to (403), and for a POST a body that is not declared
/// JSON (415: a cross-site form or `text/plain` POST cannot start a generation).
pub fn refused_request(app: &App, headers: &HeaderMap, post: bool) -> Option<Response> {
    if let Some(hosts) = &app.hosts {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).map(host_name).unwrap_or_default();
        if !hosts.contains(&host) {
            return Some(error(ApiError {
                status: 403,
                kind: "forbidden",
                message: format!(
                    "this server does not answer to the host '{host}' (start it with --allow-host {host} or --allow-any-host)"
                ),
            }));
        }
    }
    if post {
        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let json = ct.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Some(error(ApiError {
                status: 415,
                kind: "invalid_request_error",
                message: format!("the body must be JSON with Content-Type: application/json (got '{ct}')"),
            }));
        }
    }
    None
}

/// The response that refuses a request: a Host the server does not answer to, a POST body
/// not declared JSON (see [`refused_request`]), or 401 when a key is required and `headers`
/// do not carry it.
pub fn unauthorized(app: &App, headers: &HeaderMap, post: bool) -> Option<Response> {
    if let Some(r) = refused_request(app, headers, post) {
        return Some(r);
    }
    let key = app.api_key.as_ref()?;
    let given =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    (!given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes()))).then(|| {
        error(ApiError {
            status: 401,
            kind: "authentication_error",
            message: "invalid or missing API key (send Authorization: Bearer KEY)".into(),
        })
    })
}

/// Largest request body read (a prompt and its settings).
pub const MAX_BODY_BYTES: usize = 8 << 20;

/// A request's body within its deadline and size: a client that sends headers and then
/// trickles (or never sends) its body holds nothing for long.
pub async fn read_body(app: &App, body: axum::body::Body) -> Result<axum::body::Bytes, Response> {
    match tokio::time::timeout(app.body_timeout, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(error(ApiError {
            status: 413,
            kind: "invalid_request_error",
            message: format!("the request body is larger than {MAX_BODY_BYTES} bytes or was cut off"),
        })),
        Err(_) => Err(error(ApiError {
            status: 408,
            kind: "invalid_request_error",
            message: format!("the request body did not arrive within {} s", app.body_timeout.as_secs()),
        })),
    }
}

/// The body as a JSON object whose fields are all in `known`, or the 400.
pub async fn object(app: &App, req: Request, known: &[&str]) -> Result<Map<String, Value>, Response> {
    let (parts, body) = req.into_parts();
    if let Some(r) = unauthorized(app, &parts.headers, true) {
        return Err(r);
    }
    let body = read_body(app, body).await?;
    let bad = |m: String| error(ApiError::bad_request(m));
    let v: Value = serde_json::from_slice(&body).map_err(|e| bad(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else { return Err(bad("the body must be a JSON object".into())) };
    if let Some(k) = o.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(bad(format!("'{k}' is not a field of this endpoint (it takes {})", known.join(", "))));
    }
    Ok(o)
}

/// Set on a completion's response: its token counts, for the log line.
#[derive(Clone, Copy)]
pub struct Served {
    pub tokens: Option<Usage>,
}

/// Set on a streamed response: its stream writes the log line when it ends.
#[derive(Clone, Copy)]
pub struct Streamed;

/// Whether requests from web page `origin` (`scheme://host[:port]`) may be answered: pages
/// served from loopback always, others when `--cors` names them (`*`: any).
pub fn origin_allowed(allowed: &[String], origin: &str) -> bool {
    if allowed.iter().any(|a| a == "*" || a.eq_ignore_ascii_case(origin.trim_end_matches('/'))) {
        return true;
    }
    let Some((scheme, rest)) = origin.split_once("://") else { return false };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return false;
    }
    let host = rest.split('/').next().unwrap_or("");
    is_loopback(&host_name(host))
}

fn log_line(method: &str, path: &str, status: u16, tokens: Option<Usage>, since: Instant) {
    eprintln!("{}", line(method, path, status, tokens, since));
}

fn line(method: &str, path: &str, status: u16, tokens: Option<Usage>, since: Instant) -> String {
    let tokens = tokens.map_or("-".to_string(), |u| format!("{}+{}", u.prompt, u.completion));
    format!("{method} {path} {status} tokens {tokens} {:.0} ms", since.elapsed().as_secs_f64() * 1e3)
}

/// The log line of a streamed completion, when its stream ends.
pub fn log_stream_end(kind: Kind, status: u16, tokens: Option<Usage>, since: Instant) {
    log_line("POST", completion_path(kind), status, tokens, since);
}

/// The log line of a stream whose client went away before its end: status 499 (nginx's
/// "client closed request"), the tokens of the choices that had finished.
pub fn log_stream_abandoned(kind: Kind, tokens: Usage, since: Instant) {
    let l = line("POST", completion_path(kind), 499, Some(tokens), since);
    eprintln!("{l} (the client closed the stream)");
}

fn completion_path(kind: Kind) -> &'static str {
    if kind == Kind::Chat { "/v1/chat/completions" } else { "/v1/completions" }
}

/// CORS and the log line, around every request.
pub async fn around(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let since = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let origin = req.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_string);
    let asked_headers =
        req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).and_then(|v| v.to_str().ok()).map(str::to_string);
    let mut res = match &origin {
        Some(o) if !origin_allowed(&app.cors, o) => error(ApiError {
            status: 403,
            kind: "forbidden",
            message: format!(
                "requests from the web page origin '{o}' are not allowed (start the server with --cors {o})"
            ),
        }),
        // A preflight: what a page from this origin may send.
        Some(_) if method == Method::OPTIONS => {
            let mut r = StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
            // The headers the page asks for (the OpenAI JS SDK sends x-stainless-*), as long
            // as they are header names.
            let asked = asked_headers
                .as_deref()
                .filter(|a| a.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_, ".contains(&b)));
            let allow = asked.map_or(HeaderValue::from_static("authorization, content-type"), |a| {
                HeaderValue::from_str(a).unwrap_or(HeaderValue::from_static("authorization, content-type"))
            });
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allow);
            h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
            r
        }
        _ => next.run(req).await,
    };
    if let Some(o) = &origin {
        // The answer depends on the Origin, allowed or not: caches must keep them apart.
        res.headers_mut().append(header::VARY, HeaderValue::from_static("Origin"));
        if origin_allowed(&app.cors, o)
            && let Ok(v) = HeaderValue::from_str(o)
        {
            res.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        }
    }
    if app.log && res.extensions().get::<Streamed>().is_none() {
        let tokens = res.extensions().get::<Served>().and_then(|s| s.tokens);
        log_line(method.as_str(), &path, res.status().as_u16(), tokens, since);
    }
    res
}

/// 404 for a path the server does not have.
pub async fn not_found(req: Request) -> Response {
    error(ApiError {
        status: 404,
        kind: "not_found_error",
        message: format!(
            "no endpoint {} (duet serves /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, /tokenize, /detokenize, /health, /metrics)",
            req.uri().path()
        ),
    })
}

/// 405 for a method a path does not take.
pub async fn wrong_method(req: Request) -> Response {
    let mut r = error(ApiError {
        status: 405,
        kind: "invalid_request_error",
        message: format!("{} does not take {}", req.uri().path(), req.method()),
    });
    r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_pages_and_named_origins_are_allowed() {
        let none: Vec<String> = Vec::new();
        for o in ["http://localhost:3000", "http://127.0.0.1", "https://[::1]:8443", "http://LOCALHOST:1"] {
            assert!(origin_allowed(&none, o), "{o}");
        }
        for o in ["http://example.com", "http://localhost.example.com", "file://", "null", "http://127.0.0.2.nip.io"] {
            assert!(!origin_allowed(&none, o), "{o}");
        }
        let named = vec!["https://app.example.com".to_string()];
        assert!(origin_allowed(&named, "https://app.example.com"));
        assert!(!origin_allowed(&named, "https://evil.example.com"));
        assert!(origin_allowed(&["*".to_string()], "https://anything.example"));
    }
}
