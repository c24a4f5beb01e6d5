//! The ceiling of the admission benchmark: a TLS webhook on the same stack as
//! `placement-webhook` (axum 0.8, axum-server over rustls with the ring provider,
//! the same certificate loading from `placement-certs`, a multi-threaded tokio
//! runtime) that parses the whole AdmissionReview and answers `allowed: true`
//! with the same `uid`. No policy, no patch: whatever placement-webhook spends
//! beyond this is the cost of placing.
//!
//! With `--patch-file`, every answer also carries that fixed JSON patch: through
//! the API server, this separates what applying a mutation costs the API server
//! from what computing it costs the webhook.
//!
//! ```text
//! noop-webhook --listen 127.0.0.1:0 --tls-cert tls.crt --tls-key tls.key [--patch-file patch.json]
//! ```
//! prints `noop-webhook: admission on https://ADDR, stats on http://ADDR/count`
//! once it listens; `/count` (plain HTTP) answers how many reviews it answered,
//! so the benchmark can tell when the API server calls it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use axum_server::tls_rustls::RustlsConfig;
use base64::Engine as _;
use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(about = "No-op TLS admission webhook: the ceiling of the benchmark")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    #[arg(long)]
    tls_cert: PathBuf,
    #[arg(long)]
    tls_key: PathBuf,
    /// A JSON patch (RFC 6902 array) to answer every review with.
    #[arg(long)]
    patch_file: Option<PathBuf>,
}

/// The review, parsed in full (the object stays a JSON value, as in
/// placement-webhook).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    api_version: String,
    kind: String,
    request: Request,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Parsed to do the same work as a real webhook, not read.
struct Request {
    uid: String,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    user_info: Value,
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    old_object: Option<Value>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewResponse {
    api_version: &'static str,
    kind: &'static str,
    response: Allowed,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Allowed {
    uid: String,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    /// Base64 of the patch file.
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<Arc<str>>,
}

static REVIEWS: AtomicU64 = AtomicU64::new(0);

async fn count() -> String {
    format!("{}\n", REVIEWS.load(Ordering::Relaxed))
}

async fn mutate(State(patch): State<Option<Arc<str>>>, body: Bytes) -> Response {
    REVIEWS.fetch_add(1, Ordering::Relaxed);
    match serde_json::from_slice::<Review>(&body) {
        Ok(review)
            if review.api_version == "admission.k8s.io/v1" && review.kind == "AdmissionReview" =>
        {
            Json(ReviewResponse {
                api_version: "admission.k8s.io/v1",
                kind: "AdmissionReview",
                response: Allowed {
                    uid: review.request.uid,
                    allowed: true,
                    patch_type: patch.is_some().then_some("JSONPatch"),
                    patch,
                },
            })
            .into_response()
        }
        Ok(_) => (
            StatusCode::BAD_REQUEST,
            "not an admission.k8s.io/v1 AdmissionReview\n",
        )
            .into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            format!("malformed AdmissionReview: {e}\n"),
        )
            .into_response(),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let patch: Option<Arc<str>> = match &args.patch_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)?;
            let ops: Vec<Value> = serde_json::from_str(&text)?;
            Some(
                base64::engine::general_purpose::STANDARD
                    .encode(serde_json::to_vec(&ops)?)
                    .into(),
            )
        }
        None => None,
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let config = placement_certs::load_server_config(&args.tls_cert, &args.tls_key)?;
        let tls = RustlsConfig::from_config(Arc::new(config));
        let listener = std::net::TcpListener::bind(args.listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/mutate", post(mutate))
            .layer(DefaultBodyLimit::max(6 * 1024 * 1024))
            .with_state(patch);
        let stats = std::net::TcpListener::bind((args.listen.ip(), 0))?;
        stats.set_nonblocking(true)?;
        let stats_addr = stats.local_addr()?;
        let stats_app = Router::new().route("/count", get(count));
        println!("noop-webhook: admission on https://{addr}, stats on http://{stats_addr}/count");
        let admission = axum_server::from_tcp_rustls(listener, tls)?.serve(app.into_make_service());
        let stats = axum_server::from_tcp(stats)?.serve(stats_app.into_make_service());
        let (a, b) = tokio::join!(admission, stats);
        a?;
        b?;
        Ok(())
    })
}
