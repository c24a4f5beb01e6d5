//! HTTP surface: the TLS admission server and the plain-HTTP metrics server.
//!
//! Connections are limited and timed in `placement_endpoint`; here each
//! review's body is budgeted (memory: for what arrives, as it arrives) and
//! timed before anything is built from it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;
use placement_endpoint::{
    ClientCertificate, ConnectionLimits, Listener, Peers, Stopping, Throttle, TlsSettings,
};
use serde_json::json;

use crate::admission::{Admission, Mode};
use crate::budget::{Charge, JsonShape, MemoryBudget, Refusal};
use crate::readiness::{Readiness, ReadyState};
use crate::review::Caller;
use crate::review::ReviewError;

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

/// How reviews are read.
#[derive(Debug, Clone)]
pub(crate) struct RequestLimits {
    /// Largest body accepted (`--max-request-bytes`).
    pub max_body: usize,
    /// Time to receive a whole body (`--body-timeout`).
    pub body_timeout: Duration,
    /// Memory all reviews in progress may hold (`--memory-budget`).
    pub memory_budget: usize,
    /// Memory one review may need, parsing and conversion included
    /// (`--max-request-memory`).
    pub max_request_memory: usize,
    /// Only clients with a verified certificate may post reviews
    /// (`--client-ca-file`).
    pub require_client_certificate: bool,
}

/// Everything `serve` needs besides the admission handler.
#[derive(Debug, Clone)]
pub(crate) struct ServeSettings {
    pub requests: RequestLimits,
    pub admission: ConnectionLimits,
    pub metrics: ConnectionLimits,
    /// How callers are grouped into peers (`--ipv6-peer-prefix`).
    pub peers: Peers,
    pub readiness: Arc<Readiness>,
    /// From the request to stop to the end of accepting: the endpoint leaves
    /// the Service meanwhile, and every connection closes after its next
    /// response (`--shutdown-delay`).
    pub shutdown_delay: Duration,
}

/// Open connections of the metrics listener (scrapes and probes).
pub(crate) const METRICS_MAX_CONNECTIONS: usize = 64;

#[derive(Clone)]
struct AppState {
    admission: Admission,
    readiness: Arc<Readiness>,
    limits: Arc<RequestLimits>,
    budget: Arc<MemoryBudget>,
    /// Warnings about refused requests, at most one per interval.
    refusals: Arc<Throttle>,
    peers: Peers,
}

/// The admission router: `/mutate`, `/validate`, `/healthz`, `/readyz`.
fn admission_router(state: AppState) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// The metrics router: `/metrics`, plus `/healthz` for probes.
fn metrics_router(admission: Admission) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(admission)
}

async fn mutate(State(state): State<AppState>, request: Request) -> Response {
    answer(state, request, Mode::Mutate).await
}

async fn validate(State(state): State<AppState>, request: Request) -> Response {
    answer(state, request, Mode::Validate).await
}

/// Why a review was not evaluated.
enum Stop {
    /// Refused before evaluation: counted under `reason`, logged at most once
    /// per interval, answered with `status` and `message`.
    Refused {
        reason: &'static str,
        status: StatusCode,
        message: String,
    },
    /// Not JSON: counted as a malformed review, not as a refusal.
    Malformed(ReviewError),
}

impl Stop {
    fn refused(reason: &'static str, status: StatusCode, message: String) -> Self {
        Stop::Refused {
            reason,
            status,
            message,
        }
    }

    fn too_large(max: usize) -> Self {
        Stop::refused(
            "too_large",
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "AdmissionReview is larger than this webhook's limit of {max} bytes (--max-request-bytes)"
            ),
        )
    }

    fn respond(self, state: &AppState, peer: Option<SocketAddr>) -> Response {
        match self {
            Stop::Refused {
                reason,
                status,
                message,
            } => refuse(state, peer, reason, status, message),
            Stop::Malformed(e) => {
                state.admission.metrics().observe(
                    "UNKNOWN",
                    crate::metrics::Outcome::Malformed,
                    Duration::ZERO,
                );
                (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
            }
        }
    }
}

impl From<Refusal> for Stop {
    /// Over the memory budget: the review may succeed in a moment.
    fn from(refusal: Refusal) -> Self {
        Stop::refused(
            refusal.reason(),
            StatusCode::SERVICE_UNAVAILABLE,
            refusal.to_string(),
        )
    }
}

/// A refusal before evaluation: counted, logged at most once per interval,
/// answered with `status` and `message`.
fn refuse(
    state: &AppState,
    peer: Option<SocketAddr>,
    reason: &'static str,
    status: StatusCode,
    message: String,
) -> Response {
    state.admission.metrics().request_rejected(reason);
    if let Some(held_back) = state.refusals.admit() {
        let peer = peer.map(|p| p.to_string()).unwrap_or_default();
        tracing::warn!(
            reason,
            peer,
            held_back,
            "refused an AdmissionReview: {message}"
        );
    }
    let mut response = (status, format!("{message}\n")).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

async fn answer(state: AppState, request: Request, mode: Mode) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| *peer);
    match accept(&state, request, peer).await {
        Ok(accepted) => evaluate(&state, accepted, mode).await,
        Err(stop) => stop.respond(&state, peer),
    }
}

/// A review read whole and charged for what evaluating it will build.
struct Accepted {
    body: Bytes,
    charge: Charge,
    caller: Caller,
}

/// The checks before evaluation, in the order they run: each reads the
/// request only as far as it must.
async fn accept(
    state: &AppState,
    request: Request,
    peer: Option<SocketAddr>,
) -> Result<Accepted, Stop> {
    let limits = &state.limits;
    let verified =
        request.extensions().get::<ClientCertificate>() == Some(&ClientCertificate(true));
    require_certificate(limits, verified)?;
    let declared = content_length(request.headers());
    if declared.is_some_and(|n| n > limits.max_body) {
        return Err(Stop::too_large(limits.max_body));
    }
    // Charged as the body arrives: what is only declared holds nothing. A
    // caller with a verified certificate (the API server) keeps to no peer's
    // share of the budget.
    let mut charge = state.budget.charge_for(
        (!verified)
            .then(|| peer.map(|p| state.peers.key(p.ip())))
            .flatten(),
    );
    let body = read_in_time(limits, request, declared, &mut charge).await?;
    // What parsing and converting will build, counted before building it.
    let shape =
        JsonShape::of(&body).map_err(|e| Stop::Malformed(ReviewError::NotJson(e.to_string())))?;
    let cost = within_memory(limits, &shape, body.len())?;
    charge.resize(cost)?;
    let caller = Caller {
        peer: peer.map(|p| state.peers.key(p.ip())),
        verified,
    };
    Ok(Accepted {
        body,
        charge,
        caller,
    })
}

fn require_certificate(limits: &RequestLimits, verified: bool) -> Result<(), Stop> {
    if limits.require_client_certificate && !verified {
        return Err(Stop::refused(
            "unauthenticated",
            StatusCode::FORBIDDEN,
            "a client certificate signed by the webhook's client CA is required (--client-ca-file)"
                .to_owned(),
        ));
    }
    Ok(())
}

/// The whole body within `--body-timeout` and `--max-request-bytes`.
async fn read_in_time(
    limits: &RequestLimits,
    request: Request,
    declared: Option<usize>,
    charge: &mut Charge,
) -> Result<Bytes, Stop> {
    let read = read_body(request.into_parts().1, limits.max_body, declared, charge);
    match tokio::time::timeout(limits.body_timeout, read).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(BodyError::TooLarge)) => Err(Stop::too_large(limits.max_body)),
        Ok(Err(BodyError::Budget(refusal))) => Err(refusal.into()),
        Ok(Err(BodyError::Read(e))) => Err(Stop::refused(
            "body_error",
            StatusCode::BAD_REQUEST,
            format!("cannot read AdmissionReview body: {e}"),
        )),
        Err(_) => Err(Stop::refused(
            "body_timeout",
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the AdmissionReview body did not arrive within {} (--body-timeout)",
                humantime::format_duration(limits.body_timeout)
            ),
        )),
    }
}

/// The memory evaluating a body of `len` bytes shaped `shape` will take,
/// unless above `--max-request-memory`.
fn within_memory(limits: &RequestLimits, shape: &JsonShape, len: usize) -> Result<usize, Stop> {
    let cost = shape.cost(len);
    if cost > limits.max_request_memory {
        return Err(Stop::refused(
            "too_complex",
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the AdmissionReview would take about {cost} bytes to evaluate ({} JSON values, {} bytes of strings), above this webhook's limit of {} bytes per review (--max-request-memory)",
                shape.nodes, shape.string_bytes, limits.max_request_memory
            ),
        ));
    }
    Ok(cost)
}

/// The policy's answer; the body is let go before the response is built, the
/// charge after.
async fn evaluate(state: &AppState, accepted: Accepted, mode: Mode) -> Response {
    let Accepted {
        body,
        charge,
        caller,
    } = accepted;
    let answer = state.admission.review_body(&body, mode, caller).await;
    drop(body);
    let response = match answer {
        Ok(review) => Json(review).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    drop(charge);
    response
}

fn content_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

enum BodyError {
    TooLarge,
    Budget(Refusal),
    Read(axum::Error),
}

/// The first buffer of a body, unless the body declared less.
const FIRST_BUFFER: usize = 16 * 1024;

/// The whole body, into one buffer that grows as data arrives (doubling, up
/// to the declared length: no copy on completion when the length was
/// declared), charged before it grows: nothing is held for bytes that have
/// not arrived.
async fn read_body(
    mut body: Body,
    max: usize,
    declared: Option<usize>,
    charge: &mut Charge,
) -> Result<Bytes, BodyError> {
    let mut buffer = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Read)?;
        if let Ok(data) = frame.into_data() {
            let needed = buffer.len() + data.len();
            if needed > max {
                return Err(BodyError::TooLarge);
            }
            if needed > buffer.capacity() {
                let capacity = (buffer.capacity() * 2)
                    .max(FIRST_BUFFER)
                    .min(declared.unwrap_or(max))
                    .min(max)
                    .max(needed);
                charge.resize(capacity).map_err(BodyError::Budget)?;
                let mut grown = BytesMut::with_capacity(capacity);
                grown.extend_from_slice(&buffer);
                buffer = grown;
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok(buffer.freeze())
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> Response {
    let presence = state.admission.presence();
    let ready = state.readiness.check(presence).await;
    let body = json!({
        "ready": ready == ReadyState::Ready,
        "state": format!("{ready:?}"),
        "engine": state.admission.engine().name(),
        "policies": presence.describe(),
    });
    let status = if ready == ReadyState::Ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn metrics(State(admission): State<Admission>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        admission.metrics().encode(),
    )
        .into_response()
}

/// Listening sockets, bound before serving so callers learn the ports at once.
#[derive(Debug)]
pub(crate) struct Listeners {
    admission: std::net::TcpListener,
    metrics: std::net::TcpListener,
}

impl Listeners {
    pub(crate) fn bind(admission: SocketAddr, metrics: SocketAddr) -> Result<Self, ServerError> {
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

    pub(crate) fn admission_addr(&self) -> SocketAddr {
        self.admission
            .local_addr()
            .expect("bound socket has an address")
    }

    pub(crate) fn metrics_addr(&self) -> SocketAddr {
        self.metrics
            .local_addr()
            .expect("bound socket has an address")
    }
}

/// Serve until `stop_requested` resolves; then, for the shutdown delay, go on
/// serving but close every connection after its next response (so that
/// clients reconnect, to another pod once the endpoint has left the Service:
/// a kept-alive HTTP/1 connection closed under a client that is reusing it
/// fails that client's request with EOF, and the API server retries no
/// admission call); then stop accepting and drain in-flight requests for up
/// to 10 s.
pub(crate) async fn serve(
    admission: Admission,
    tls: TlsSettings,
    listeners: Listeners,
    settings: ServeSettings,
    stop_requested: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let admission_addr = listeners.admission_addr();
    let metrics_addr = listeners.metrics_addr();
    let stopping = Stopping::default();
    {
        let stopping = stopping.clone();
        let delay = settings.shutdown_delay;
        tokio::spawn(async move {
            stop_requested.await;
            tracing::info!(
                ?delay,
                "asked to stop: closing every connection after its next response, then stopping after the delay"
            );
            stopping.draining.cancel();
            tokio::time::sleep(delay).await;
            tracing::info!("shutting down");
            stopping.stop.cancel();
        });
    }
    let metrics = Arc::clone(admission.metrics());
    let state = AppState {
        admission: admission.clone(),
        readiness: Arc::clone(&settings.readiness),
        budget: MemoryBudget::new(settings.requests.memory_budget, Arc::clone(&metrics)),
        limits: Arc::new(settings.requests),
        refusals: Arc::new(Throttle::new(Duration::from_secs(10))),
        peers: settings.peers,
    };
    let admission_listener = Listener {
        name: "admission",
        socket: listeners.admission,
        tls: Some(tls),
        app: admission_router(state),
        limits: settings.admission,
        drain: Duration::from_secs(10),
        // The readiness probe (HTTPS), and a liveness probe pointed here.
        probes: &["/healthz", "/readyz"],
        trust_this_host: false,
        peers: settings.peers,
    };
    let metrics_listener = Listener {
        name: "metrics",
        socket: listeners.metrics,
        tls: None,
        app: metrics_router(admission),
        limits: settings.metrics,
        drain: Duration::from_secs(1),
        // The chart's liveness probe.
        probes: &["/healthz"],
        trust_this_host: false,
        peers: settings.peers,
    };
    let (admission_result, metrics_result) = tokio::join!(
        placement_endpoint::serve(
            admission_listener,
            metrics.listeners().clone(),
            stopping.clone()
        ),
        placement_endpoint::serve(metrics_listener, metrics.listeners().clone(), stopping),
    );
    admission_result.map_err(|source| ServerError::Serve {
        addr: admission_addr,
        source,
    })?;
    metrics_result.map_err(|source| ServerError::Serve {
        addr: metrics_addr,
        source,
    })
}
