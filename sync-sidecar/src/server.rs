//! Plain-HTTP endpoints: `/metrics`, `/healthz`, `/readyz`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::state::SyncState;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    sync: Arc<SyncState>,
}

/// The router, for serving or for tests.
pub fn router(metrics: Arc<Metrics>, sync: Arc<SyncState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        // kube-mgmt's path (`--health-endpoint`): there it answers 200 unless
        // its bundle-driven sync is not ready, so probes written for it are
        // liveness probes; it means what /healthz means.
        .route("/health", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(AppState { metrics, sync })
}

async fn metrics_handler(State(app): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
        .into_response()
}

/// 200 when the engine holds every policy and all replicated data; 503 with the
/// sync state as JSON otherwise.
async fn ready_handler(State(app): State<AppState>) -> Response {
    let status = app.sync.status();
    let code = if status.synced && status.engine_up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(status)).into_response()
}

/// Serve until `cancel`.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    sync: Arc<SyncState>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, sync))
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}
