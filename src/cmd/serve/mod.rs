//! `duet serve`: an OpenAI-compatible HTTP server. The engine (slots, queue, continuous
//! batching) is duet_runtime::tools::serve, the JSON its `openai` module; this wires them to axum.

mod complete;
mod embeddings;
mod guard;
mod tokenize;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use duet_runtime::sampler::SamplerConfig;
use duet_runtime::tools::serve::handle::{Engine as ServeEngine, Handle};
use duet_runtime::tools::serve::openai::Kind;
use duet_runtime::tools::serve::scheduler::Scheduler;
use serde_json::json;

use super::common::{host_name, is_loopback};
use guard::{refused_request, unauthorized};

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
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics (not empty; listening
    /// beyond loopback without a key prints a warning)
    #[arg(long)]
    pub api_key: Option<String>,
    /// Also accept requests whose Host header names NAME (repeatable). A server on loopback
    /// accepts only localhost, 127.0.0.1 and [::1] by default, so that a web page cannot
    /// reach it through a DNS name it controls (DNS rebinding); one on another address
    /// accepts any
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_host: Vec<String>,
    /// Accept any Host header, also on loopback
    #[arg(long)]
    pub allow_any_host: bool,
    /// Seconds a shutdown (SIGINT or SIGTERM) waits for running requests before it exits; a
    /// second signal exits at once
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Seconds a client has to send a request's headers, and an idle keep-alive connection
    /// is kept waiting for the next request, before it is closed
    #[arg(long, default_value_t = 10)]
    pub header_timeout: u64,
    /// Seconds a client has to send a request's body once its headers are in (408 after)
    #[arg(long, default_value_t = 30)]
    pub body_timeout: u64,
    /// Connections open at once at most; more are closed as they come (slow or idle clients
    /// cannot take every file descriptor)
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Let special-token text in chat messages (`<|im_start|>`…) become those tokens, as
    /// llama-server's --special; by default it stays text, so that a message cannot open a
    /// turn of another role
    #[arg(long)]
    pub special: bool,
    /// Sequences decoded together (slots, each with its own K/V cache of -c tokens)
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a slot; more are refused with 503
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Also answer web pages from ORIGIN (e.g. https://chat.example.com; `*` for any page),
    /// repeatable. Pages served from loopback (http://localhost:PORT…) are always answered;
    /// requests from any other page get 403
    #[arg(long = "cors", value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// No log line per request on stderr (method, path, status, tokens, milliseconds)
    #[arg(long)]
    pub log_disable: bool,
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
    /// Begins every response id: this server's start time and process, so that ids are not
    /// reused across restarts (clients and logs key on them).
    id_prefix: String,
    /// Host header names accepted (lower case, no port); None: any.
    hosts: Option<Vec<String>>,
    /// A request body must arrive within this.
    body_timeout: std::time::Duration,
    /// Web page origins answered besides loopback ones (`--cors`).
    cors: Vec<String>,
    /// A line per request on stderr.
    log: bool,
}

/// How connections are served: headers (and idle keep-alive) and the connection count.
struct Limits {
    header_timeout: std::time::Duration,
    max_connections: usize,
    shutdown_timeout: u64,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub fn run(args: Args) -> Result<()> {
    if args.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!("--api-key is empty: give a key, or leave the flag out for a server without one");
    }
    if !is_loopback(&args.host) && args.api_key.is_none() {
        eprintln!(
            "warning: listening on {} without --api-key: anyone who can reach this address can use the model",
            args.host
        );
    }
    let hosts = (is_loopback(&args.host) && !args.allow_any_host).then(|| {
        let mut h: Vec<String> = ["localhost", "127.0.0.1", "[::1]"].into_iter().map(String::from).collect();
        h.extend(args.allow_host.iter().map(|n| host_name(n)));
        h
    });
    let path: PathBuf = require_model(&args.model)?;
    let name = file_name(&path);
    let (model_args, quiet, slots, max_queue) = (args.model.clone(), args.quiet, args.parallel, args.max_queue);
    let special = args.special;
    let load_path = path.clone();
    let handle = Handle::start(move || {
        let engine = load_engine(&model_args, &load_path, quiet).map_err(|e| format!("{e:#}"))?;
        let boxed: Box<dyn ServeEngine> = match engine {
            AnyEngine::Cpu(e) => {
                let mut s = Scheduler::new(e, slots, max_queue).map_err(|e| e.to_string())?;
                s.set_allow_special(special);
                Box::new(s)
            }
            AnyEngine::Gpu(e) => {
                let mut s = Scheduler::new(e, slots, max_queue).map_err(|e| e.to_string())?;
                s.set_allow_special(special);
                Box::new(s)
            }
        };
        Ok(boxed)
    })
    .map_err(anyhow::Error::msg)
    .with_context(|| format!("loading {}", path.display()))?;
    let app = Arc::new(App {
        handle,
        model: name,
        api_key: args.api_key.clone(),
        defaults: args.sampling.config(&super::common::sampling_hints(&path, args.quiet)),
        next_id: AtomicU64::new(1),
        id_prefix: {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            format!("{:012x}", (nanos as u64 ^ ((std::process::id() as u64) << 40)) & 0xffff_ffff_ffff)
        },
        hosts,
        body_timeout: std::time::Duration::from_secs(args.body_timeout.max(1)),
        cors: args.cors.iter().map(|o| o.trim_end_matches('/').to_string()).collect(),
        log: !args.log_disable,
    });
    let limits = Limits {
        header_timeout: std::time::Duration::from_secs(args.header_timeout.max(1)),
        max_connections: args.max_connections.max(1),
        shutdown_timeout: args.shutdown_timeout,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = rt.block_on(serve(Arc::clone(&app), &args.host, args.port, slots, limits));
    app.handle.stop();
    result
}

/// A shutdown signal: SIGINT (Ctrl-C), or SIGTERM where there is one.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn serve(app: Arc<App>, host: &str, port: u16, slots: usize, limits: Limits) -> Result<()> {
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
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions", post(|s, r| complete::complete(s, r, Kind::Chat)))
        .route("/v1/completions", post(|s, r| complete::complete(s, r, Kind::Completion)))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .fallback(guard::not_found)
        .method_not_allowed_fallback(guard::wrong_method)
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&app), guard::around))
        .with_state(app);
    // Each connection on hyper's HTTP/1 with a header read timeout (which also closes an
    // idle keep-alive connection: its timer runs while the next request's head is awaited),
    // at most max_connections at once; on a signal, each finishes its request and closes.
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut stopping = std::pin::pin!(shutdown_signal());
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Out of descriptors and the like: this connection is lost, the server is not.
                Err(_) => continue,
            },
            _ = &mut stopping => break,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut stop_rx = stop_rx.clone();
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_timeout);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop_rx.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    let shutdown_timeout = limits.shutdown_timeout;
    eprintln!(
        "duet serve: stopping; waiting up to {shutdown_timeout} s for running requests (a second signal stops at once)"
    );
    let _ = stop_tx.send(true);
    // Done when every connection has let its permit go; a second signal or the deadline
    // ends the process whatever is still running.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = permits.acquire_many(all) => Ok(()),
        _ = shutdown_signal() => {
            eprintln!("duet serve: stopped with requests still running");
            std::process::exit(130);
        }
        _ = tokio::time::sleep(std::time::Duration::from_secs(shutdown_timeout)) => {
            eprintln!("duet serve: stopped with requests still running");
            std::process::exit(130);
        }
    }
}

async fn health(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = refused_request(&app, &headers, false) {
        return r;
    }
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorized(&app, &headers, false) {
        return r;
    }
    axum::Json(json!({
        "object": "list",
        "data": [{"id": app.model, "object": "model", "created": now(), "owned_by": "duet"}],
    }))
    .into_response()
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorized(&app, &headers, false) {
        return r;
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.handle.metrics().to_prometheus()).into_response()
}
