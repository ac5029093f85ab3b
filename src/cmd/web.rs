//! `duet web`: the chat page (runtime/web/page/), the browser build of the runtime
//! (runtime/web, built into `--pkg` by runtime/web/build.sh) and the model files, served on
//! loopback. The page runs the model on the visitor's GPU through WebGPU; nothing leaves the
//! machine, and the page fetches nothing beyond this server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use clap::Parser;

use super::common::{file_name, host_name};

#[derive(Parser, Debug)]
#[command(about = "Serve a chat page that runs models in the browser on WebGPU")]
pub struct Args {
    /// GGUF model files the page offers (repeat -m for several)
    #[arg(short = 'm', long = "model", value_name = "MODEL.gguf", required = true)]
    pub models: Vec<PathBuf>,
    /// Address to listen on: a loopback address (127.0.0.1, ::1 or localhost)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Folder of the browser build (duet_web.js and duet_web_bg.wasm), made by
    /// runtime/web/build.sh
    #[arg(long, value_name = "DIR", default_value = "target/web/pkg")]
    pub pkg: PathBuf,
}

const INDEX: &str = include_str!("../../runtime/web/page/index.html");
const MAIN_JS: &str = include_str!("../../runtime/web/page/main.js");
const PKG_FILES: [(&str, &str); 2] = [("duet_web.js", "text/javascript"), ("duet_web_bg.wasm", "application/wasm")];

struct Site {
    models: Vec<(String, PathBuf, u64)>,
    pkg: PathBuf,
}

pub fn run(args: Args) -> Result<()> {
    // The names the Host check answers to (loopback_hosts_only), so that a page loaded from
    // the address printed at start is never refused.
    if !["127.0.0.1", "::1", "localhost"].contains(&args.host.as_str()) {
        anyhow::bail!(
            "duet web listens on loopback only (--host 127.0.0.1, ::1 or localhost), not {}: the page and the models are for this machine's browser",
            args.host
        );
    }
    for (file, _) in PKG_FILES {
        let p = args.pkg.join(file);
        if !p.is_file() {
            anyhow::bail!(
                "{} is missing: build the browser runtime first (bash runtime/web/build.sh), or point --pkg at its folder",
                p.display()
            );
        }
    }
    let mut models = Vec::new();
    for m in &args.models {
        let meta = std::fs::metadata(m).with_context(|| format!("cannot read the model {}", m.display()))?;
        if !meta.is_file() {
            anyhow::bail!("{} is not a file", m.display());
        }
        models.push((file_name(m), m.clone(), meta.len()));
    }
    let site = Arc::new(Site { models, pkg: args.pkg.clone() });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the server's runtime")?;
    rt.block_on(serve(site, &args.host, args.port))
}

async fn serve(site: Arc<Site>, host: &str, port: u16) -> Result<()> {
    let listener =
        tokio::net::TcpListener::bind((host, port)).await.with_context(|| format!("cannot listen on {host}:{port}"))?;
    let addr = listener.local_addr()?;
    println!(
        "duet web: listening on http://{addr} ({} model{}); open it in a browser with WebGPU; Ctrl-C stops",
        site.models.len(),
        if site.models.len() == 1 { "" } else { "s" }
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let router = Router::new()
        .route("/", get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX) }))
        .route("/main.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], MAIN_JS) }))
        .route("/pkg/{file}", get(pkg_file))
        .route("/models", get(list_models))
        .route("/models/{i}", get(model_file))
        .layer(axum::middleware::from_fn(loopback_hosts_only))
        .with_state(site);
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("the server failed")
}

/// Refuses a request whose Host is not this machine's (a page elsewhere reaching the server
/// through DNS rebinding).
async fn loopback_hosts_only(req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).map(host_name).unwrap_or_default();
    if !["localhost", "127.0.0.1", "[::1]"].contains(&host.as_str()) {
        return (StatusCode::FORBIDDEN, format!("duet web does not answer to the host '{host}'")).into_response();
    }
    next.run(req).await
}

async fn list_models(State(site): State<Arc<Site>>) -> Response {
    let list: Vec<serde_json::Value> =
        site.models.iter().map(|(name, _, bytes)| serde_json::json!({ "name": name, "bytes": bytes })).collect();
    ([(header::CONTENT_TYPE, "application/json")], serde_json::Value::Array(list).to_string()).into_response()
}

async fn model_file(State(site): State<Arc<Site>>, UrlPath(i): UrlPath<usize>) -> Response {
    match site.models.get(i) {
        Some((_, path, _)) => file(path, "application/octet-stream").await,
        None => (StatusCode::NOT_FOUND, format!("no model {i}")).into_response(),
    }
}

async fn pkg_file(State(site): State<Arc<Site>>, UrlPath(name): UrlPath<String>) -> Response {
    match PKG_FILES.iter().find(|(f, _)| *f == name) {
        Some((f, ty)) => file(&site.pkg.join(f), ty).await,
        None => (StatusCode::NOT_FOUND, format!("no file {name}")).into_response(),
    }
}

/// The file at `path`, streamed in 1 MiB reads (a model is never read whole into memory),
/// with its length announced so that the page can show its progress.
async fn file(path: &Path, ty: &'static str) -> Response {
    use tokio::io::AsyncReadExt;
    let opened = match tokio::fs::File::open(path).await {
        Ok(f) => f.metadata().await.map(|m| (f, m.len())),
        Err(e) => Err(e),
    };
    let (f, len) = match opened {
        Ok(x) => x,
        Err(e) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot read {}: {e}", path.display())).into_response();
        }
    };
    // After an error the stream ends (the body is then cut short: the page reports it).
    let chunks = futures_util::stream::unfold(Some(f), |f| async move {
        let mut f = f?;
        let mut buf = vec![0u8; 1 << 20];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(axum::body::Bytes::from(buf)), Some(f)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    (
        [
            (header::CONTENT_TYPE, ty.to_owned()),
            (header::CACHE_CONTROL, "no-store".into()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        axum::body::Body::from_stream(chunks),
    )
        .into_response()
}
