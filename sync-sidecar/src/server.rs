//! Plain-HTTP endpoints: `/metrics`, `/healthz`, `/readyz` and, for the
//! webhook beside the engine, `/engine/revisions` (see
//! `policy_client::revision_board`), served with the same connection limits
//! as the webhook's listeners (probes and the webhook's engine-ready checks
//! come here; no client may hold the port: probes are answered whatever
//! other peers hold, and callers from this host, the pod's own, always get
//! in).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use placement_endpoint::{ConnectionLimits, Listener, Peers, Stopping};
use policy_client::revision_board::{HOLD, Poll, PollError, RevisionBoard};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::engine_sync::SyncState;
use crate::metrics::Metrics;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    sync: Arc<SyncState>,
    revisions: Arc<RevisionBoard>,
}

/// The router, for serving or for tests.
pub(crate) fn router(
    metrics: Arc<Metrics>,
    sync: Arc<SyncState>,
    revisions: Arc<RevisionBoard>,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        // kube-mgmt's path (`--health-endpoint`): there it answers 200 unless
        // its bundle-driven sync is not ready, so probes written for it are
        // liveness probes; it means what /healthz means.
        .route("/health", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .route("/engine/revisions", get(revisions_handler))
        .with_state(AppState {
            metrics,
            sync,
            revisions,
        })
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

/// The engine's revision, long-polled by the webhook in this pod (only from
/// loopback: a reader that never acknowledges delays every write by a lease).
async fn revisions_handler(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    Query(poll): Query<Poll>,
) -> Response {
    if !peer.ip().is_loopback() {
        return (
            StatusCode::FORBIDDEN,
            "the engine's revisions are for the webhook in this pod (loopback) only\n",
        )
            .into_response();
    }
    match app.revisions.poll(poll, HOLD).await {
        Ok(revision) => axum::Json(revision).into_response(),
        Err(refused @ PollError::TooManyReaders) => {
            (StatusCode::TOO_MANY_REQUESTS, format!("{refused}\n")).into_response()
        }
        Err(refused @ PollError::BadReader) => {
            (StatusCode::BAD_REQUEST, format!("{refused}\n")).into_response()
        }
    }
}

/// Open connections: scrapes, probes, the webhook's engine-ready checks.
const MAX_CONNECTIONS: usize = 64;

/// Serve until `cancel`.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    sync: Arc<SyncState>,
    revisions: Arc<RevisionBoard>,
    peers: Peers,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let listener = Listener {
        name: "metrics",
        socket: listener.into_std()?,
        tls: None,
        app: router(Arc::clone(&metrics), sync, revisions),
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
        probes: &["/healthz", "/health", "/readyz"],
        // The webhook in the pod reads `/engine/revisions` from loopback: no
        // other pod can keep it out.
        trust_this_host: true,
        peers,
    };
    let stopping = Stopping {
        draining: cancel.clone(),
        stop: cancel,
    };
    placement_endpoint::serve(listener, metrics.listeners().clone(), stopping).await
}
