//! HTTP surface: the TLS admission server and the plain-HTTP metrics server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use axum_server::tls_rustls::RustlsConfig;
use serde_json::json;

use crate::admission::{Admission, Mode};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("server on {addr} failed: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

#[derive(Clone)]
struct AppState {
    admission: Admission,
    max_body: usize,
}

/// The admission router: `/mutate`, `/validate`, `/healthz`, `/readyz`.
pub fn admission_router(admission: Admission, max_body: usize) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(AppState {
            admission,
            max_body,
        })
}

/// The metrics router: `/metrics`, plus `/healthz` for probes.
pub fn metrics_router(admission: Admission) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(AppState {
            admission,
            max_body: 0,
        })
}

async fn mutate(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(state, body, Mode::Mutate).await
}

async fn validate(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(state, body, Mode::Validate).await
}

async fn answer(state: AppState, body: Result<Bytes, BytesRejection>, mode: Mode) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "AdmissionReview is larger than this webhook's limit of {} bytes (--max-request-bytes)\n",
                    state.max_body
                ),
            )
                .into_response();
        }
        Err(rejection) => {
            return (
                rejection.status(),
                format!(
                    "cannot read AdmissionReview body: {}\n",
                    rejection.body_text()
                ),
            )
                .into_response();
        }
    };
    match state.admission.review_body(&body, mode).await {
        Ok(review) => Json(review).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> Response {
    let presence = state.admission.presence();
    let body = json!({
        "ready": presence.is_synced(),
        "engine": state.admission.engine().name(),
        "policies": presence.describe(),
    });
    let status = if presence.is_synced() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.admission.metrics().encode(),
    )
        .into_response()
}

/// Listening sockets, bound before serving so callers learn the ports at once.
#[derive(Debug)]
pub struct Listeners {
    admission: std::net::TcpListener,
    metrics: std::net::TcpListener,
}

impl Listeners {
    pub fn bind(admission: SocketAddr, metrics: SocketAddr) -> Result<Self, ServerError> {
        let bind = |addr: SocketAddr| {
            let listener = std::net::TcpListener::bind(addr)
                .map_err(|source| ServerError::Bind { addr, source })?;
            listener
                .set_nonblocking(true)
                .map_err(|source| ServerError::Bind { addr, source })?;
            Ok(listener)
        };
        Ok(Listeners {
            admission: bind(admission)?,
            metrics: bind(metrics)?,
        })
    }

    pub fn admission_addr(&self) -> SocketAddr {
        self.admission
            .local_addr()
            .expect("bound socket has an address")
    }

    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics
            .local_addr()
            .expect("bound socket has an address")
    }
}

/// Serve until `shutdown` resolves, then drain in-flight requests for up to 10 s.
pub async fn serve(
    admission: Admission,
    tls: RustlsConfig,
    listeners: Listeners,
    max_body: usize,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let admission_addr = listeners.admission_addr();
    let metrics_addr = listeners.metrics_addr();
    let handle = axum_server::Handle::new();
    let metrics_handle = axum_server::Handle::new();
    {
        let (handle, metrics_handle) = (handle.clone(), metrics_handle.clone());
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!("shutting down");
            handle.graceful_shutdown(Some(Duration::from_secs(10)));
            metrics_handle.graceful_shutdown(Some(Duration::from_secs(1)));
        });
    }
    let app = admission_router(admission.clone(), max_body);
    let tls_server = axum_server::from_tcp_rustls(listeners.admission, tls)
        .map_err(|source| ServerError::Bind {
            addr: admission_addr,
            source,
        })?
        .handle(handle)
        .serve(app.into_make_service());
    let metrics_server = axum_server::from_tcp(listeners.metrics)
        .map_err(|source| ServerError::Bind {
            addr: metrics_addr,
            source,
        })?
        .handle(metrics_handle)
        .serve(metrics_router(admission).into_make_service());
    let (tls_result, metrics_result) = tokio::join!(tls_server, metrics_server);
    tls_result.map_err(|source| ServerError::Serve {
        addr: admission_addr,
        source,
    })?;
    metrics_result.map_err(|source| ServerError::Serve {
        addr: metrics_addr,
        source,
    })
}

/// A rustls config for axum-server that follows certificate file changes.
pub fn reloading_tls(
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
) -> Result<RustlsConfig, placement_certs::CertError> {
    let initial = placement_certs::load_server_config(&cert, &key)?;
    let config = RustlsConfig::from_config(Arc::new(initial));
    let target = config.clone();
    placement_certs::spawn_reloader(cert, key, Duration::from_secs(2), move |new| {
        target.reload_from_config(new);
    });
    Ok(config)
}
