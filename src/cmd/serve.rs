//! `duet serve`: an OpenAI-compatible HTTP server. The engine (slots, queue, continuous
//! batching) is duet_runtime::serve, the JSON its `openai` module; this wires them to axum.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use duet_runtime::sampler::SamplerConfig;
use duet_runtime::serve::handle::{Engine as ServeEngine, Handle};
use duet_runtime::serve::openai::{self, ApiError, ApiRequest, Kind, Usage};
use duet_runtime::serve::scheduler::Scheduler;
use duet_runtime::serve::{GenEvent, GenRequest, SubmitError};
use serde_json::json;
use tokio::sync::mpsc;

use super::common::{AnyEngine, ModelArgs, SamplingArgs, file_name, load_engine, require_model};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Defaults for requests that do not set them (temperature, top_p and seed can be set
    /// per request)
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 exposes the server to the network)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics
    #[arg(long)]
    pub api_key: Option<String>,
    /// Sequences decoded together (slots, each with its own K/V cache of -c tokens)
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a slot; more are refused with 503
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// No loading messages on stderr
    #[arg(short, long)]
    pub quiet: bool,
}

struct App {
    handle: Handle,
    model: String,
    api_key: Option<String>,
    defaults: SamplerConfig,
    next_id: AtomicU64,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub fn run(args: Args) -> Result<()> {
    if args.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    let path: PathBuf = require_model(&args.model)?;
    let name = file_name(&path);
    let (model_args, quiet, slots, max_queue) = (args.model.clone(), args.quiet, args.parallel, args.max_queue);
    let load_path = path.clone();
    let handle = Handle::start(move || {
        let engine = load_engine(&model_args, &load_path, quiet).map_err(|e| format!("{e:#}"))?;
        let boxed: Box<dyn ServeEngine> = match engine {
            AnyEngine::Cpu(e) => Box::new(Scheduler::new(e, slots, max_queue).map_err(|e| e.to_string())?),
            AnyEngine::Gpu(e) => Box::new(Scheduler::new(e, slots, max_queue).map_err(|e| e.to_string())?),
        };
        Ok(boxed)
    })
    .map_err(anyhow::Error::msg)
    .with_context(|| format!("loading {}", path.display()))?;
    let app = Arc::new(App {
        handle,
        model: name,
        api_key: args.api_key.clone(),
        defaults: args.sampling.config(),
        next_id: AtomicU64::new(1),
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = rt.block_on(serve(Arc::clone(&app), &args.host, args.port, slots));
    app.handle.stop();
    result
}

async fn serve(app: Arc<App>, host: &str, port: u16, slots: usize) -> Result<()> {
    let listener =
        tokio::net::TcpListener::bind((host, port)).await.with_context(|| format!("cannot listen on {host}:{port}"))?;
    let addr = listener.local_addr()?;
    println!(
        "duet serve: listening on http://{addr} (model {}, {slots} slots, context {} tokens each); Ctrl-C stops",
        app.model,
        app.handle.n_ctx()
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let router = Router::new()
        .route("/health", get(|| async { axum::Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions", post(|s, h, b| complete(s, h, b, Kind::Chat)))
        .route("/v1/completions", post(|s, h, b| complete(s, h, b, Kind::Completion)))
        .with_state(app);
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving")
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], e.body()).into_response()
}

/// The 401 response when a key is required and `headers` do not carry it.
fn unauthorized(app: &App, headers: &HeaderMap) -> Option<Response> {
    let key = app.api_key.as_ref()?;
    let given =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    (given != Some(key.as_str())).then(|| {
        error(ApiError {
            status: 401,
            kind: "authentication_error",
            message: "invalid or missing API key (send Authorization: Bearer KEY)".into(),
        })
    })
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorized(&app, &headers) {
        return r;
    }
    axum::Json(json!({
        "object": "list",
        "data": [{"id": app.model, "object": "model", "created": now(), "owned_by": "duet"}],
    }))
    .into_response()
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorized(&app, &headers) {
        return r;
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.handle.metrics().to_prometheus()).into_response()
}

async fn complete(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes, kind: Kind) -> Response {
    if let Some(r) = unauthorized(&app, &headers) {
        return r;
    }
    let mut req = match openai::parse(kind, &body, &app.defaults) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let n = app.next_id.fetch_add(1, Ordering::Relaxed);
    // Requests without a seed each get their own.
    req.sampling.seed = req.seed.unwrap_or_else(|| app.defaults.seed.wrapping_add(n));
    let id = format!("{}-{n}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" });
    let (tx, rx) = mpsc::unbounded_channel();
    let work = GenRequest {
        prompt: req.prompt.clone(),
        sampling: req.sampling.clone(),
        max_tokens: req.max_tokens,
        stop: req.stop.clone(),
        ignore_eos: req.ignore_eos,
        // A closed receiver (the client went away) cancels the request.
        sink: Box::new(move |e| tx.send(e).is_ok()),
    };
    let submit_app = Arc::clone(&app);
    let submitted = tokio::task::spawn_blocking(move || submit_app.handle.submit(work)).await;
    match submitted {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return error(submit_error(e)),
        Err(e) => return error(ApiError { status: 500, kind: "server_error", message: e.to_string() }),
    }
    if req.stream { stream(app, req, id, rx).into_response() } else { whole(&app, &req, &id, rx).await }
}

fn submit_error(e: SubmitError) -> ApiError {
    let status = match e {
        SubmitError::QueueFull { .. } => 503,
        SubmitError::TooLong { .. } | SubmitError::BadPrompt(_) => 400,
        SubmitError::Stopped(_) => 500,
    };
    let kind = if status == 400 { "invalid_request_error" } else { "server_error" };
    ApiError { status, kind, message: e.to_string() }
}

async fn whole(app: &App, req: &ApiRequest, id: &str, mut rx: mpsc::UnboundedReceiver<GenEvent>) -> Response {
    let mut text = String::new();
    while let Some(e) = rx.recv().await {
        match e {
            GenEvent::Text(t) => text.push_str(&t),
            GenEvent::Done { finish, prompt_tokens, completion_tokens } => {
                let usage = Usage { prompt: prompt_tokens, completion: completion_tokens };
                return axum::Json(openai::response(req.kind, id, &app.model, now(), &text, finish, usage))
                    .into_response();
            }
            GenEvent::Failed(m) => return error(ApiError { status: 500, kind: "server_error", message: m }),
        }
    }
    error(ApiError { status: 500, kind: "server_error", message: "the engine stopped before the reply ended".into() })
}

/// Server-sent events: a chunk per piece of text, a last chunk with the finish reason and
/// the usage, then `data: [DONE]`.
fn stream(
    app: Arc<App>,
    req: ApiRequest,
    id: String,
    rx: mpsc::UnboundedReceiver<GenEvent>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let created = now();
    // (receiver, whether the first chunk went out, whether [DONE] is next)
    let state = (rx, false, false);
    let events = futures_util::stream::unfold(state, move |(mut rx, sent_first, done)| {
        let (app, id, kind) = (Arc::clone(&app), id.clone(), req.kind);
        async move {
            if done {
                return None;
            }
            let chunk = |text: Option<&str>, end| openai::chunk(kind, &id, &app.model, created, text, !sent_first, end);
            match rx.recv().await {
                Some(GenEvent::Text(t)) => {
                    Some((Ok(Event::default().data(chunk(Some(&t), None).to_string())), (rx, true, false)))
                }
                Some(GenEvent::Done { finish, prompt_tokens, completion_tokens }) => {
                    let usage = Usage { prompt: prompt_tokens, completion: completion_tokens };
                    let last = chunk(None, Some((finish, usage))).to_string();
                    // The [DONE] marker follows as its own event.
                    Some((Ok(Event::default().data(last)), (rx, true, true)))
                }
                Some(GenEvent::Failed(m)) => {
                    let body = ApiError { status: 500, kind: "server_error", message: m }.body();
                    Some((Ok(Event::default().data(body)), (rx, true, true)))
                }
                None => None,
            }
        }
    });
    let done = futures_util::stream::once(async { Ok(Event::default().data("[DONE]")) });
    Sse::new(futures_util::StreamExt::chain(events, done))
}
