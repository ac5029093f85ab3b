//! `POST /v1/chat/completions` and `POST /v1/completions`: the body read within its deadline
//! and size, checked (duet_runtime's `openai::parse`), submitted as one engine request per
//! choice (`n`; one group, so that they share the prompt's cache pages), and answered whole
//! or as server-sent events.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use duet_runtime::tools::serve::openai::{self, ApiError, ApiRequest, Kind};
use duet_runtime::tools::serve::openai_reply::{self, Choice, Piece, Usage};
use duet_runtime::tools::serve::tool_calls::{self, Format, ToolChoice};
use duet_runtime::tools::serve::{GenEvent, GenRequest, SubmitError, TokenLogprob};
use tokio::sync::mpsc;

use super::guard::{Served, error, read_body, unauthorized};
use super::{App, now};

/// A choice's event.
type Tagged = (usize, GenEvent);

pub async fn complete(State(app): State<Arc<App>>, req: axum::extract::Request, kind: Kind) -> Response {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    if let Some(r) = unauthorized(&app, &headers, true) {
        return r;
    }
    let body = match read_body(&app, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut req = match openai::parse(kind, &body, &app.defaults) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    // As many numbers as choices: unseeded requests' choices never share a seed.
    let n = app.next_id.fetch_add(req.n as u64, Ordering::Relaxed);
    // Requests without a seed each get their own.
    req.sampling.seed = req.seed.unwrap_or_else(|| app.defaults.seed.wrapping_add(n));
    let id = format!("{}-{}{n:06}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, app.id_prefix);
    // One channel for every choice's events, tagged with its index. Dropping the receiver
    // (the client went away, a choice could not be queued) cancels them all.
    let (tx, rx) = mpsc::unbounded_channel::<Tagged>();
    let mut prompt_tokens = 0;
    for index in 0..req.n {
        let tx = tx.clone();
        let mut sampling = req.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add(index as u64);
        let work = GenRequest {
            prompt: req.prompt.clone(),
            sampling,
            max_tokens: req.max_tokens,
            stop: req.stop.clone(),
            ignore_eos: req.ignore_eos,
            grammar: req.grammar.clone(),
            tools: req.tools.clone(),
            logprobs: req.logprobs,
            group: (req.n > 1).then_some(n),
            sink: Box::new(move |e| tx.send((index, e)).is_ok()),
        };
        let submit_app = Arc::clone(&app);
        match tokio::task::spawn_blocking(move || submit_app.handle.submit(work)).await {
            Ok(Ok(p)) => prompt_tokens = p,
            Ok(Err(e)) => return error(submit_error(e)),
            Err(e) => return error(ApiError { status: 500, kind: "server_error", message: e.to_string() }),
        }
    }
    drop(tx);
    if req.stream { stream(app, req, id, prompt_tokens, rx) } else { whole(&app, &req, &id, prompt_tokens, rx).await }
}

pub fn submit_error(e: SubmitError) -> ApiError {
    let status = match e {
        SubmitError::QueueFull { .. } => 503,
        SubmitError::TooLong { .. } | SubmitError::BadPrompt(_) | SubmitError::BadGrammar(_) => 400,
        SubmitError::Stopped(_) => 500,
    };
    let kind = if status == 400 { "invalid_request_error" } else { "server_error" };
    ApiError { status, kind, message: e.to_string() }
}

async fn whole(
    app: &App,
    req: &ApiRequest,
    id: &str,
    prompt: usize,
    mut rx: mpsc::UnboundedReceiver<Tagged>,
) -> Response {
    let mut choices: Vec<Choice> =
        (0..req.n).map(|_| Choice { logprobs: req.logprobs.map(|_| Vec::new()), ..Choice::default() }).collect();
    let mut usage = Usage { prompt, completion: 0 };
    let mut open = req.n;
    while let Some((i, e)) = rx.recv().await {
        let c = &mut choices[i];
        match e {
            GenEvent::Text(t) => c.text.push_str(&t),
            GenEvent::Logprob(lp) => c.logprobs.get_or_insert_with(Vec::new).push(lp),
            GenEvent::Done { finish, prompt_tokens, completion_tokens } => {
                c.finish = Some(finish);
                usage.prompt = prompt_tokens;
                usage.completion += completion_tokens;
                open -= 1;
                if let Some(format) = calls_format(app, req)
                    && let Some(tools) = &req.tools
                    && let Some((text, calls)) = tool_calls::parse_reply(&c.text, format, &tool_calls::names(tools))
                {
                    c.text = text.unwrap_or_default();
                    c.calls = calls;
                }
                if open == 0 {
                    let body = openai_reply::response(req.kind, id, &app.model, now(), &choices, usage);
                    let mut r = axum::Json(body).into_response();
                    r.extensions_mut().insert(Served { tokens: Some(usage) });
                    return r;
                }
            }
            GenEvent::Failed(m) => return error(ApiError { status: 500, kind: "server_error", message: m }),
        }
    }
    error(ApiError { status: 500, kind: "server_error", message: "the engine stopped before the reply ended".into() })
}

/// The format to read tool calls in, when the request's reply may hold them.
fn calls_format(app: &App, req: &ApiRequest) -> Option<Format> {
    req.tools.as_ref().filter(|t| t.choice != ToolChoice::None).map(|_| app.handle.tool_format())
}

/// What the stream has sent and holds.
struct StreamState {
    rx: mpsc::UnboundedReceiver<Tagged>,
    /// Per choice: whether its first chunk went out, its text's bytes so far, and log
    /// probabilities waiting for the text they belong to.
    started: Vec<bool>,
    offsets: Vec<usize>,
    pending: Vec<Vec<TokenLogprob>>,
    /// Per choice, with tools: the text held back while it may still be a call (None once
    /// it cannot; then text streams as it comes).
    held: Vec<Option<String>>,
    open: usize,
    usage: Usage,
    /// `data: [DONE]` is next.
    done: bool,
    /// Where the log line goes when the stream is dropped before its end (the client went
    /// away): the request's kind and start; None without a log.
    log: Option<(Kind, std::time::Instant)>,
}

impl Drop for StreamState {
    fn drop(&mut self) {
        if let (false, Some((kind, since))) = (self.done, self.log) {
            super::guard::log_stream_abandoned(kind, self.usage, since);
        }
    }
}

/// Server-sent events: a chunk per piece of text of each choice (with its tokens' log
/// probabilities when asked for), a chunk with each choice's finish reason, the last one
/// also carrying the usage of them all, then `data: [DONE]`.
fn stream(app: Arc<App>, req: ApiRequest, id: String, prompt: usize, rx: mpsc::UnboundedReceiver<Tagged>) -> Response {
    let created = now();
    let n = req.n;
    let state = StreamState {
        rx,
        started: vec![false; n],
        offsets: vec![0; n],
        pending: vec![Vec::new(); n],
        held: vec![calls_format(&app, &req).map(|_| String::new()); n],
        open: n,
        usage: Usage { prompt, completion: 0 },
        done: false,
        log: app.log.then(|| (req.kind, std::time::Instant::now())),
    };
    let (kind, log_start) = (req.kind, std::time::Instant::now());
    let format = calls_format(&app, &req);
    // The declared function names, to check the calls a reply makes.
    let names: Vec<String> =
        req.tools.as_ref().map(|t| tool_calls::names(t).into_iter().map(str::to_string).collect()).unwrap_or_default();
    let events = futures_util::stream::unfold(state, move |mut st| {
        let (app, id, names) = (Arc::clone(&app), id.clone(), names.clone());
        async move {
            if st.done {
                return None;
            }
            let chunk =
                |p: Piece| Event::default().data(openai_reply::chunk(kind, &id, &app.model, created, p).to_string());
            loop {
                let Some((i, e)) = st.rx.recv().await else {
                    // The engine stopped (the server is shutting down): not the client's doing.
                    if app.log {
                        super::guard::log_stream_end(kind, 500, None, log_start);
                    }
                    let message = "the engine stopped before the reply ended".to_string();
                    let body = ApiError { status: 500, kind: "server_error", message }.body();
                    st.done = true;
                    return Some((Ok(Event::default().data(body)), st));
                };
                let mut first = || !std::mem::replace(&mut st.started[i], true);
                match e {
                    GenEvent::Logprob(lp) => st.pending[i].push(lp),
                    GenEvent::Text(t) => {
                        let t = match (&mut st.held[i], format) {
                            (Some(held), Some(f)) => {
                                held.push_str(&t);
                                if f.could_be_call(held) {
                                    continue;
                                }
                                st.held[i].take().unwrap_or_default()
                            }
                            _ => t,
                        };
                        let first = first();
                        let lps = std::mem::take(&mut st.pending[i]);
                        let logprobs = (!lps.is_empty()).then_some(lps.as_slice());
                        let p = Piece {
                            index: i,
                            text: Some(&t),
                            first,
                            logprobs,
                            offset: st.offsets[i],
                            ..Piece::default()
                        };
                        st.offsets[i] += t.len();
                        return Some((Ok::<_, Infallible>(chunk(p)), st));
                    }
                    GenEvent::Done { finish, prompt_tokens, completion_tokens } => {
                        let first = first();
                        st.usage.prompt = prompt_tokens;
                        st.usage.completion += completion_tokens;
                        st.open -= 1;
                        let last = st.open == 0;
                        let lps = std::mem::take(&mut st.pending[i]);
                        // Text held back: calls, or text after all.
                        let held = st.held[i].take().unwrap_or_default();
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        let (text, calls) = match format.and_then(|f| tool_calls::parse_reply(&held, f, &names)) {
                            Some((text, calls)) => (text.unwrap_or_default(), calls),
                            None => (held, Vec::new()),
                        };
                        let p = Piece {
                            index: i,
                            first,
                            text: (!text.is_empty()).then_some(text.as_str()),
                            logprobs: (!lps.is_empty()).then_some(lps.as_slice()),
                            offset: st.offsets[i],
                            finish: Some(finish),
                            calls: &calls,
                            usage: last.then_some(st.usage),
                        };
                        let event = chunk(p);
                        if last {
                            if app.log {
                                super::guard::log_stream_end(kind, 200, Some(st.usage), log_start);
                            }
                            // The [DONE] marker follows as its own event.
                            st.done = true;
                        }
                        return Some((Ok(event), st));
                    }
                    GenEvent::Failed(m) => {
                        if app.log {
                            super::guard::log_stream_end(kind, 500, None, log_start);
                        }
                        let body = ApiError { status: 500, kind: "server_error", message: m }.body();
                        st.done = true;
                        return Some((Ok(Event::default().data(body)), st));
                    }
                }
            }
        }
    });
    let done = futures_util::stream::once(async { Ok(Event::default().data("[DONE]")) });
    let mut r = Sse::new(futures_util::StreamExt::chain(events, done)).into_response();
    // The stream logs its own line when it ends.
    r.extensions_mut().insert(Served { tokens: None });
    r.extensions_mut().insert(super::guard::Streamed);
    r
}
