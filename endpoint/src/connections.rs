//! Serving one listening socket so that no client can hold it: connection
//! slots shared fairly between peers (`slots.rs`), a few more kept beyond
//! them (for the TLS handshakes of connections that found every slot taken,
//! a verified one then taking a slot as trusted, and for probes), a clock on
//! the TLS handshake, on request headers, on connections
//! with no request in progress and on a connection's age, a cap on HTTP/2
//! streams, and accept errors (the open-files limit reached) survived, logged
//! and counted.
//!
//! Request bodies are timed and budgeted by the handlers, which know their
//! limits.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse as _;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::metrics::ListenerMetrics;
use crate::slots::{Activity, Peers, Slot, Slots};
use crate::throttle::Throttle;

/// Largest HTTP/1 head (request line and headers) and HTTP/2 header list; an
/// AdmissionReview request's are a few hundred bytes.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Descriptors kept free of connections: the OPA and API clients, certificate
/// files, the metrics listener's connections.
const RESERVED_FDS: u64 = 128;

/// Time a connection closed for idleness gets to finish what it is writing.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// After an accept fails for lack of descriptors (or memory), wait this long
/// before the next: the kernel keeps the connection queued, so retrying at
/// once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How often a repeated warning of a listener reaches the log.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Connections kept beyond the slots (their TLS handshake, then one probe),
/// and how many of them one peer holds at most: enough for a burst of the
/// API server's connections to show their certificates.
const BEYOND_SLOTS: usize = 64;
const BEYOND_SLOTS_PER_PEER: usize = 32;

/// A connection's opening: from its accept to its first request, at most
/// this long, during which it is never taken for another. Real clients send
/// their first request at once; the kubelet gives up on a probe after a
/// second (`timeoutSeconds`), so a connection silent for longer is no
/// probe's.
const OPENING: Duration = Duration::from_secs(1);

/// A connection beyond the slots with no request for this long is closed.
const PROBE_IDLE: Duration = Duration::from_secs(2);

/// The limits of one listener.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Open connections; more are closed as soon as they are accepted
    /// (unless an idle connection of a peer holding more is closed instead).
    pub max_connections: usize,
    /// Open connections of one peer address.
    pub max_per_peer: usize,
    /// Concurrent HTTP/2 streams (requests) per connection.
    pub max_streams: u32,
    /// From accept to the end of the TLS handshake.
    pub handshake_timeout: Duration,
    /// From the first byte of an HTTP/1 request head (or the end of the
    /// previous response) to its end.
    pub header_timeout: Duration,
    /// A connection with no request in progress for this long is closed.
    pub idle_timeout: Duration,
    /// A connection this old is closed after its next response (so that no
    /// client keeps a connection, and its slot, for ever by sending a request
    /// now and then, and so that long-lived clients spread over replicas).
    pub max_age: Duration,
}

impl ConnectionLimits {
    /// The share of one peer by default: a quarter of the connections.
    pub fn default_per_peer(max_connections: usize) -> usize {
        (max_connections / 4).max(1)
    }
}

/// Whether the client presented a certificate the TLS layer verified (a
/// request extension; only asked for when the TLS settings verify clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientCertificate(pub bool);

/// The server certificate and client verification in force; replaced when
/// the certificate files change.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    current: Arc<RwLock<Arc<ServerConfig>>>,
}

impl TlsSettings {
    pub fn new(config: Arc<ServerConfig>) -> Self {
        TlsSettings {
            current: Arc::new(RwLock::new(config)),
        }
    }

    pub fn replace(&self, config: Arc<ServerConfig>) {
        *self.current.write() = config;
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.current.read()))
    }
}

/// One listening socket and what it serves.
#[derive(Debug)]
pub struct Listener {
    /// The listener's name in logs and metrics (`admission`, `metrics`).
    pub name: &'static str,
    pub socket: std::net::TcpListener,
    pub tls: Option<TlsSettings>,
    pub app: Router,
    pub limits: ConnectionLimits,
    /// How long open connections get to finish after `stop`.
    pub drain: Duration,
    /// The paths probes `GET` (`/healthz`, `/readyz`): a connection that finds
    /// every slot taken may still take one of a few slots kept beyond them,
    /// to be answered one such request, so that probes are answered whatever
    /// other clients hold. Empty (and no TLS): no slots kept.
    pub probes: &'static [&'static str],
    /// Callers from this host (`127.0.0.1`, `::1`: the pod's own containers)
    /// are trusted: they count toward no peer's share and get in whenever
    /// another peer has an idle connection to give.
    pub trust_this_host: bool,
    /// How callers are grouped into peers (IPv6 per /64 by default).
    pub peers: Peers,
}

/// How the listeners stop.
#[derive(Debug, Clone, Default)]
pub struct Stopping {
    /// The process was asked to stop and its endpoint is leaving the
    /// Service: every connection closes after its next response (HTTP/1
    /// with `Connection: close`, HTTP/2 with GOAWAY), so that clients open
    /// new ones instead of reusing it. Closing an idle kept-alive HTTP/1
    /// connection unannounced races the client's next request on it, which
    /// then fails with EOF (and the API server retries no admission call).
    pub draining: CancellationToken,
    /// No new connections; open ones finish within the listener's drain time.
    pub stop: CancellationToken,
}

/// Serve `listener` until `stopping.stop`, then let open connections finish
/// for up to its drain time.
pub async fn serve(
    listener: Listener,
    metrics: ListenerMetrics,
    stopping: Stopping,
) -> io::Result<()> {
    let shutdown = stopping.stop.clone();
    let Listener {
        name,
        socket,
        tls,
        app,
        limits,
        drain,
        probes,
        trust_this_host,
        peers,
    } = listener;
    let socket = TcpListener::from_std(socket)?;
    let gate = Gate {
        name,
        slots: Slots::new(limits.max_connections, limits.max_per_peer, OPENING),
        // Beyond the slots: a TLS handshake (a verified client then takes a
        // slot), then one probe.
        keeps_beyond: tls.is_some() || !probes.is_empty(),
        beyond: Slots::beyond(BEYOND_SLOTS, BEYOND_SLOTS_PER_PEER, OPENING),
        refused: Throttle::new(WARN_EVERY),
        metrics: metrics.clone(),
        max_connections: limits.max_connections,
        max_per_peer: limits.max_per_peer,
    };
    // The connections beyond the slots, apart in the metrics (once per
    // listener: a name for the process's lifetime).
    let probes_name: &'static str = Box::leak(format!("{name}_probes").into_boxed_str());
    let builder = Arc::new(http_builder(&limits));
    let failed = Throttle::new(WARN_EVERY);
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = socket.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                accept_failed(name, &e, &metrics, &failed).await;
                continue;
            }
        };
        let key = peers.key(peer.ip());
        let this_host = trust_this_host && is_this_host(peer.ip());
        let Some((slot, beyond_the_slots)) = gate.admit(peer, key, this_host) else {
            drop(tcp);
            continue;
        };
        let connection = Connection {
            name,
            probes_name,
            peer,
            key,
            tls: tls.as_ref().map(TlsSettings::acceptor),
            app: app.clone(),
            builder: Arc::clone(&builder),
            limits: limits.clone(),
            metrics: metrics.clone(),
            stopping: stopping.clone(),
            slots: Arc::clone(&gate.slots),
            slot,
            probes: beyond_the_slots.then_some(probes),
        };
        tokio::spawn(connection.run(tcp));
    }
    // New connections are refused from here on.
    drop(socket);
    gate.drained(drain).await;
    Ok(())
}

/// Which accepted connections get a slot: one of the listener's, else (when
/// it keeps any) one beyond them.
struct Gate {
    /// The listener's name.
    name: &'static str,
    slots: Arc<Slots>,
    /// Whether the listener keeps slots beyond its own (TLS or probes).
    keeps_beyond: bool,
    beyond: Arc<Slots>,
    /// Warnings about refused connections, at most one per interval.
    refused: Throttle,
    metrics: ListenerMetrics,
    max_connections: usize,
    max_per_peer: usize,
}

impl Gate {
    /// A slot for `peer` (counting for `key`), and whether it lies beyond the
    /// listener's slots; `None` when refused (counted, and warned of).
    fn admit(&self, peer: SocketAddr, key: IpAddr, this_host: bool) -> Option<(Slot, bool)> {
        let acquired = self.slots.acquire(key, this_host).map(|slot| (slot, false));
        if let Err(refusal) = &acquired {
            self.metrics.refused(self.name, refusal.reason());
        }
        // Every slot taken, or the peer's share: one kept beyond them.
        let acquired = match acquired {
            Err(refusal) if self.keeps_beyond => self
                .beyond
                .acquire(key, false)
                .map(|slot| (slot, true))
                .map_err(|_| refusal),
            other => other,
        };
        let refusal = match acquired {
            Ok(acquired) => return Some(acquired),
            Err(refusal) => refusal,
        };
        if let Some(held_back) = self.refused.admit() {
            tracing::warn!(
                listener = self.name,
                %peer,
                reason = refusal.reason(),
                max_connections = self.max_connections,
                max_per_peer = self.max_per_peer,
                held_back,
                "connection refused: every slot of this listener is taken and no peer holds two more than this one, or this peer holds its share (the webhook's --max-connections, --max-connections-per-peer), and every slot kept beyond them is taken"
            );
        }
        None
    }

    /// Once every connection has ended, or after `drain`: every connection
    /// holds a slot until it ends.
    async fn drained(&self, drain: Duration) {
        let _ = tokio::time::timeout(drain, async {
            while self.slots.held() + self.beyond.held() > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
}

/// Log (rate-limited), count, and back off when descriptors are exhausted.
async fn accept_failed(
    name: &'static str,
    e: &io::Error,
    metrics: &ListenerMetrics,
    throttle: &Throttle,
) {
    let reason = accept_error_reason(e);
    metrics.accept_error(name, reason);
    if let Some(held_back) = throttle.admit() {
        match reason {
            "fd_exhausted" => tracing::error!(
                listener = name,
                error = %e,
                held_back,
                "cannot accept connections: the open-files limit is reached; new connections wait until open ones close (lower --max-connections or raise the limit)"
            ),
            _ => tracing::warn!(listener = name, error = %e, held_back, "accept failed"),
        }
    }
    if reason != "other" {
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    }
}

fn accept_error_reason(e: &io::Error) -> &'static str {
    use rustix::io::Errno;
    match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::MFILE | Errno::NFILE) => "fd_exhausted",
        Some(Errno::NOBUFS | Errno::NOMEM) => "out_of_memory",
        _ => "other",
    }
}

fn http_builder(limits: &ConnectionLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    builder
}

struct Connection {
    /// The listener's name.
    name: &'static str,
    /// Its name for connections beyond the slots.
    probes_name: &'static str,
    peer: SocketAddr,
    /// The peer it counts for.
    key: IpAddr,
    tls: Option<TlsAcceptor>,
    app: Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    limits: ConnectionLimits,
    metrics: ListenerMetrics,
    stopping: Stopping,
    /// The listener's slots, which a verified connection beyond them joins.
    slots: Arc<Slots>,
    /// Held for as long as the connection is open.
    slot: Slot,
    /// Beyond the slots: the paths it may ask for, once.
    probes: Option<&'static [&'static str]>,
}

impl Connection {
    /// Its name in logs and metrics.
    fn label(&self) -> &'static str {
        if self.probes.is_some() {
            self.probes_name
        } else {
            self.name
        }
    }

    async fn run(mut self, tcp: TcpStream) {
        let mut open = self.metrics.opened(self.label());
        let _ = tcp.set_nodelay(true);
        let Some(acceptor) = self.tls.clone() else {
            self.serve(tcp, ClientCertificate(false)).await;
            drop(open);
            return;
        };
        let handshake = tokio::time::timeout(self.limits.handshake_timeout, acceptor.accept(tcp));
        let stream = tokio::select! {
            () = self.stopping.stop.cancelled() => return,
            () = self.slot.activity.evicted.cancelled() => {
                self.metrics.closed(self.label(), "evicted");
                return;
            }
            handshake = handshake => match handshake {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    self.metrics.refused(self.label(), "tls_handshake_error");
                    tracing::debug!(listener = self.label(), peer = %self.peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    self.metrics.refused(self.label(), "tls_handshake_timeout");
                    tracing::debug!(listener = self.label(), peer = %self.peer, "TLS handshake timed out");
                    return;
                }
            },
        };
        let verified = stream
            .get_ref()
            .1
            .peer_certificates()
            .is_some_and(|chain| !chain.is_empty());
        if verified {
            if self.probes.is_none() {
                self.slot.trust();
            } else if let Ok(slot) = self.slots.acquire(self.key, true) {
                // Beyond the slots, recognised by its certificate (the API
                // server, whatever its peer holds): a slot as trusted.
                self.slot = slot;
                self.probes = None;
                open = self.metrics.opened(self.label());
            }
        }
        if self.probes.is_some_and(<[_]>::is_empty) {
            // Beyond the slots of a listener without probes: nothing to
            // answer.
            return;
        }
        self.serve(stream, ClientCertificate(verified)).await;
        drop(open);
    }

    async fn serve<I>(self, io: I, certificate: ClientCertificate)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::clone(&self.slot.activity);
        let idle = activity.in_flight.subscribe();
        let peer = self.peer;
        let app = self.app.clone();
        // Every response says `Connection: close` once this is cancelled:
        // when the listener drains, or the connection reached its age; on a
        // probe slot at once (one request).
        let closing = self.stopping.draining.child_token();
        let probes = self.probes;
        if probes.is_some() {
            closing.cancel();
        }
        // Cancelled once a response said `Connection: close`: that response
        // is the connection's last (a fast one may come and go between two
        // polls of the select below, so the service itself tells).
        let retired = CancellationToken::new();
        let responder = Responder {
            peer,
            certificate,
            activity: Arc::clone(&activity),
            app,
            closing: closing.clone(),
            retired: retired.clone(),
            probes,
        };
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            responder.clone().respond(request)
        });
        let connection = self.builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let closing_reason = || {
            if self.stopping.draining.is_cancelled() {
                "draining"
            } else {
                "max_age"
            }
        };
        let idle_timeout = match probes {
            Some(_) => self.limits.idle_timeout.min(PROBE_IDLE),
            None => self.limits.idle_timeout,
        };
        let reason = tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(listener = self.label(), peer = %self.peer, error = %e, "connection ended with an error");
                }
                if retired.is_cancelled() {
                    self.metrics.closed(self.label(), closing_reason());
                }
                return;
            }
            () = idle_for(idle, idle_timeout) => "idle",
            () = self.slot.activity.evicted.cancelled() => "evicted",
            () = retired.cancelled() => closing_reason(),
            () = retire_after(&closing, self.limits.max_age) => unreachable!("retire_after never ends"),
            () = self.stopping.stop.cancelled() => "shutdown",
        };
        self.metrics.closed(self.label(), reason);
        tracing::debug!(listener = self.label(), peer = %self.peer, reason, "closing connection");
        // A request in progress is answered first: HTTP/1 with
        // `Connection: close`, HTTP/2 after a GOAWAY.
        connection.as_mut().graceful_shutdown();
        if matches!(reason, "idle" | "evicted") {
            let _ = tokio::time::timeout(IDLE_CLOSE_GRACE, connection).await;
        } else {
            // The listener's drain time bounds a shutdown.
            let _ = connection.await;
        }
    }
}

/// What answers each request of one connection.
#[derive(Clone)]
struct Responder {
    peer: SocketAddr,
    certificate: ClientCertificate,
    activity: Arc<Activity>,
    app: Router,
    /// Cancelled: every response says `Connection: close`.
    closing: CancellationToken,
    /// Cancelled here once a response said `Connection: close`.
    retired: CancellationToken,
    /// Beyond the slots: the paths it may ask for.
    probes: Option<&'static [&'static str]>,
}

impl Responder {
    /// Counted busy from the call (not from the first poll), as the idle
    /// timer reads it.
    fn respond(
        self,
        mut request: Request<Incoming>,
    ) -> impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send
    {
        request.extensions_mut().insert(ConnectInfo(self.peer));
        request.extensions_mut().insert(self.certificate);
        let busy = Busy::start(&self.activity);
        async move {
            let mut response = match self.probes {
                Some(paths) if !is_probe(&request, paths) => Ok(beyond_the_slots()),
                _ => self.app.oneshot(request).await,
            };
            if self.closing.is_cancelled() {
                // Said in the response, so that an HTTP/1 client never
                // reuses the connection we close next (HTTP/2 drops the
                // header and gets a GOAWAY instead).
                if let Ok(response) = &mut response {
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                    self.retired.cancel();
                }
            }
            drop(busy);
            response
        }
    }
}

/// Whether a caller is on this host (the pod's own containers).
fn is_this_host(ip: IpAddr) -> bool {
    ip == IpAddr::V4(Ipv4Addr::LOCALHOST) || ip == IpAddr::V6(Ipv6Addr::LOCALHOST)
}

/// A probe: `GET` of one of `paths`.
fn is_probe(request: &Request<Incoming>, paths: &[&str]) -> bool {
    request.method() == Method::GET && paths.contains(&request.uri().path())
}

/// The answer to anything but a probe beyond the slots.
fn beyond_the_slots() -> axum::response::Response {
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        "every connection slot of this listener is taken; only probes are answered beyond them: retry\n",
    )
        .into_response();
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// A request in progress on a connection.
struct Busy(Arc<Activity>);

impl Busy {
    fn start(activity: &Arc<Activity>) -> Busy {
        activity.request_started();
        activity.in_flight.send_modify(|n| *n += 1);
        Busy(Arc::clone(activity))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.send_modify(|n| *n -= 1);
    }
}

/// Cancels `closing` once the connection is `age` old; never resolves.
async fn retire_after(closing: &CancellationToken, age: Duration) {
    tokio::time::sleep(age).await;
    closing.cancel();
    std::future::pending().await
}

/// Resolves once no request has been in progress for `idle`.
async fn idle_for(mut in_flight: watch::Receiver<usize>, idle: Duration) {
    loop {
        if *in_flight.borrow_and_update() > 0 {
            if in_flight.changed().await.is_err() {
                return std::future::pending().await;
            }
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(idle) => return,
            changed = in_flight.changed() => {
                if changed.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }
}

/// The connection cap to use: `requested`, or by default the largest that
/// fits the open-files limit (raised to its hard limit first) with
/// `other_connections` and a reserve left over.
pub fn connection_cap(requested: Option<usize>, other_connections: usize) -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    const DEFAULT: usize = 1024;
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => limit = raised,
            Err(e) => tracing::debug!(error = %e, "cannot raise the open-files limit"),
        }
    }
    let open_files = limit.current.unwrap_or(u64::MAX);
    let fits = usize::try_from(open_files.saturating_sub(RESERVED_FDS))
        .unwrap_or(usize::MAX)
        .saturating_sub(other_connections);
    match requested {
        Some(n) => {
            if n > fits {
                tracing::warn!(
                    max_connections = n,
                    open_files,
                    "--max-connections is above what the open-files limit leaves for connections ({fits}); accepts will fail with EMFILE before the cap is reached"
                );
            }
            n
        }
        None => {
            let cap = DEFAULT.min(fits).max(1);
            if cap < DEFAULT {
                tracing::warn!(
                    max_connections = cap,
                    open_files,
                    "connection cap lowered to fit the open-files limit"
                );
            }
            cap
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_exhaustion_is_recognised() {
        let emfile = io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        assert_eq!(accept_error_reason(&emfile), "fd_exhausted");
        let reset = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(accept_error_reason(&reset), "other");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_only_counts_time_without_requests() {
        let slot = Slots::new(1, 1, OPENING)
            .acquire([127, 0, 0, 1].into(), false)
            .unwrap();
        let busy = Busy::start(&slot.activity);
        let idle = tokio::spawn(idle_for(
            slot.activity.in_flight.subscribe(),
            Duration::from_secs(10),
        ));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!idle.is_finished(), "a request is in progress");
        drop(busy);
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(!idle.is_finished());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(idle.is_finished());
    }
}
