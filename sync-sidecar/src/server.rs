//! Plain-HTTP endpoints: `/metrics`, `/healthz`, `/readyz`, served with the
//! same connection limits as the webhook's listeners (probes and the
//! webhook's engine-ready checks come here; no client may hold the port).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use placement_endpoint::{ConnectionLimits, Listener, Stopping};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::engine_sync::SyncState;
use crate::metrics::Metrics;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    sync: Arc<SyncState>,
}

/// The router, for serving or for tests.
pub(crate) fn router(metrics: Arc<Metrics>, sync: Arc<SyncState>) -> Router {
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

/// Open connections: scrapes, probes, the webhook's engine-ready checks.
const MAX_CONNECTIONS: usize = 64;

/// Serve until `cancel`.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    sync: Arc<SyncState>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let listener = Listener {
        name: "metrics",
        socket: listener.into_std()?,
        tls: None,
        app: router(Arc::clone(&metrics), sync),
        limits: ConnectionLimits {
            max_connections: MAX_CONNECTIONS,
            max_per_peer: ConnectionLimits::default_per_peer(MAX_CONNECTIONS),
            max_streams: 32,
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_age: Duration::from_secs(600),
        },
        drain: Duration::from_secs(1),
    };
    let stopping = Stopping {
        draining: cancel.clone(),
        stop: cancel,
    };
    placement_endpoint::serve(listener, metrics.listeners().clone(), stopping).await
}
