//! Hostile clients of the webhook over real TLS, shared by the regression test
//! (`tests/e2e/hostile/`) and the measurement (`placement-bench` scenario 6):
//! idle connections, slow headers and bodies, floods of stalled large bodies
//! and stalled HTTP/2 streams, bodies that expand when parsed, bodies that are
//! declared and never sent, peers holding the plain-HTTP ports, and the memory
//! of the process under attack; and the well-behaved clients beside them (a
//! review, a kubelet-style probe).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::{BodyExt as _, Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A body of this many bytes is a valid AdmissionReview JSON prefix that never
/// ends in time: a large `filler` annotation.
const REVIEW_PREFIX: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"hostile","kind":{"group":"apps","version":"v1","kind":"ReplicaSet"},"resource":{"group":"apps","version":"v1","resource":"replicasets"},"namespace":"default","operation":"CREATE","object":{"metadata":{"name":"x","annotations":{"filler":""#;

/// The webhook's TLS endpoint as an attacker sees it.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// The local address connections come from (another loopback address
    /// stands for another peer); any by default.
    source: Option<IpAddr>,
    connector: TlsConnector,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("addr", &self.addr).finish()
    }
}

/// How a connection ended, seen from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Time from the start of the attack to the server closing the connection
    /// (`None`: still open when the client gave up).
    pub closed_after: Option<Duration>,
    /// The status line the server sent, if any.
    pub status: Option<u16>,
}

impl Target {
    /// `ca_pem` is the webhook's serving CA; `alpn` the protocols to offer
    /// (`h2`, `http/1.1`).
    pub fn new(addr: SocketAddr, ca_pem: &str, alpn: &[&[u8]]) -> Target {
        Self::build(addr, ca_pem, alpn, None)
    }

    /// As [`Target::new`], presenting the client certificate `cert_pem`
    /// (with its key `key_pem`), as an API server configured to present one does.
    pub fn with_client_certificate(
        addr: SocketAddr,
        ca_pem: &str,
        alpn: &[&[u8]],
        cert_pem: &str,
        key_pem: &str,
    ) -> Target {
        Self::build(addr, ca_pem, alpn, Some((cert_pem, key_pem)))
    }

    fn build(
        addr: SocketAddr,
        ca_pem: &str,
        alpn: &[&[u8]],
        client: Option<(&str, &str)>,
    ) -> Target {
        crate::install_crypto();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.expect("CA PEM")).expect("CA certificate");
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = match client {
            None => builder.with_no_client_auth(),
            Some((cert_pem, key_pem)) => {
                let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("client certificate PEM");
                let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
                    .expect("client key PEM");
                builder
                    .with_client_auth_cert(chain, key)
                    .expect("client certificate and key")
            }
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Target {
            addr,
            source: None,
            connector: TlsConnector::from(Arc::new(config)),
        }
    }

    /// The same endpoint, reached from `source` (such as `127.0.0.2`: another
    /// peer as the server sees it).
    pub fn from_address(&self, source: IpAddr) -> Target {
        Target {
            source: Some(source),
            ..self.clone()
        }
    }

    async fn tcp(&self) -> std::io::Result<TcpStream> {
        tcp_from(self.addr, self.source).await
    }

    /// A TLS connection, handshake done.
    pub async fn connect(&self) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = tokio::time::timeout(Duration::from_secs(5), self.tcp())
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        // Small requests go out at once (no Nagle/delayed-ACK stalls).
        tcp.set_nodelay(true)?;
        let name = ServerName::IpAddress(self.addr.ip().into());
        tokio::time::timeout(Duration::from_secs(5), self.connector.connect(name, tcp))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
    }

    /// `count` connections that complete the TLS handshake and then send
    /// nothing; each task reports when the server closed it (waiting at most
    /// `give_up`).
    pub fn idle_connections(&self, count: usize, give_up: Duration) -> Vec<JoinHandle<Outcome>> {
        (0..count)
            .map(|_| {
                let target = self.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    match target.connect().await {
                        Ok(stream) => wait_closed(stream, started, give_up).await,
                        Err(_) => Outcome {
                            closed_after: Some(started.elapsed()),
                            status: None,
                        },
                    }
                })
            })
            .collect()
    }

    /// A TCP connection that never starts the TLS handshake.
    pub async fn no_handshake(&self, give_up: Duration) -> Outcome {
        let started = Instant::now();
        let mut tcp = self.tcp().await.expect("TCP connect");
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(give_up, tcp.read(&mut buf))
            .await
            .is_ok();
        Outcome {
            closed_after: closed.then(|| started.elapsed()),
            status: None,
        }
    }

    /// Slow headers: a request line, then one header byte per `interval`.
    pub async fn slow_headers(&self, interval: Duration, give_up: Duration) -> Outcome {
        let started = Instant::now();
        let stream = self.connect().await.expect("TLS connect");
        let (reader, mut writer) = tokio::io::split(stream);
        let trickle = tokio::spawn(async move {
            let _ = writer
                .write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
                .await;
            for byte in b"X-Slow: ".iter().cycle() {
                if writer.write_all(&[*byte]).await.is_err() || writer.flush().await.is_err() {
                    return;
                }
                tokio::time::sleep(interval).await;
            }
        });
        let outcome = read_until_closed(reader, started, give_up).await;
        trickle.abort();
        outcome
    }

    /// Slowloris body: headers declaring `declared` bytes, then one byte per
    /// `interval`.
    pub async fn slow_body(
        &self,
        declared: usize,
        interval: Duration,
        give_up: Duration,
    ) -> Outcome {
        let started = Instant::now();
        let stream = self.connect().await.expect("TLS connect");
        let (reader, mut writer) = tokio::io::split(stream);
        let trickle = tokio::spawn(async move {
            let head = format!(
                "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
            );
            let _ = writer.write_all(head.as_bytes()).await;
            for byte in REVIEW_PREFIX.bytes() {
                if writer.write_all(&[byte]).await.is_err() || writer.flush().await.is_err() {
                    return;
                }
                tokio::time::sleep(interval).await;
            }
        });
        let outcome = read_until_closed(reader, started, give_up).await;
        trickle.abort();
        outcome
    }

    /// `count` HTTP/1.1 requests, each declaring `declared` bytes and sending
    /// `sent` of them (none at all when `sent` is 0), then stalling. The connections stay open (as far as the
    /// server allows) until the returned attack is dropped.
    pub fn stalled_bodies(&self, count: usize, declared: usize, sent: usize) -> Attack {
        let body = filler(sent);
        let tasks = (0..count)
            .map(|_| {
                let target = self.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let Ok(stream) = target.connect().await else {
                        return Outcome {
                            closed_after: Some(started.elapsed()),
                            status: None,
                        };
                    };
                    let (reader, mut writer) = tokio::io::split(stream);
                    let head = format!(
                        "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
                    );
                    let send = async move {
                        let _ = writer.write_all(head.as_bytes()).await;
                        let _ = writer.write_all(&body).await;
                        let _ = writer.flush().await;
                        // Keep the write half open: the body never ends.
                        std::future::pending::<()>().await;
                    };
                    tokio::select! {
                        () = send => unreachable!("pending"),
                        outcome = read_until_closed(reader, started, Duration::from_secs(3600)) => outcome,
                    }
                })
            })
            .collect();
        Attack { tasks }
    }

    /// One HTTP/2 connection with `streams` requests, each declaring `declared`
    /// bytes and sending `sent`, then stalling.
    pub async fn stalled_streams(&self, streams: usize, declared: usize, sent: usize) -> Attack {
        let stream = self.connect().await.expect("TLS connect");
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("HTTP/2 handshake");
        let mut tasks = vec![tokio::spawn(async move {
            let started = Instant::now();
            let _ = connection.await;
            Outcome {
                closed_after: Some(started.elapsed()),
                status: None,
            }
        })];
        let body = filler(sent);
        for _ in 0..streams {
            let mut sender = sender.clone();
            let body = body.clone();
            tasks.push(tokio::spawn(async move {
                let started = Instant::now();
                let frames = futures::stream::iter([Ok::<_, Infallible>(Frame::data(body))])
                    .chain(futures::stream::pending());
                let request = hyper::Request::post("/mutate")
                    .header("content-type", "application/json")
                    .header("content-length", declared)
                    .body(StreamBody::new(frames))
                    .expect("request");
                if sender.ready().await.is_err() {
                    return Outcome {
                        closed_after: Some(started.elapsed()),
                        status: None,
                    };
                }
                match sender.send_request(request).await {
                    Ok(response) => Outcome {
                        closed_after: Some(started.elapsed()),
                        status: Some(response.status().as_u16()),
                    },
                    Err(_) => Outcome {
                        closed_after: Some(started.elapsed()),
                        status: None,
                    },
                }
            }));
        }
        Attack { tasks }
    }

    /// `count` complete bodies of `bytes` bytes that are arrays of empty arrays,
    /// which expand about 30 times when parsed; each reports the status.
    pub fn expanding_bodies(&self, count: usize, bytes: usize) -> Attack {
        let mut json = String::with_capacity(bytes);
        json.push('[');
        while json.len() + 6 <= bytes {
            json.push_str("[],");
        }
        json.push_str("[]]");
        let body = Bytes::from(json);
        let tasks = (0..count)
            .map(|_| {
                let target = self.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let status = target.post_http1(&body).await;
                    Outcome {
                        closed_after: Some(started.elapsed()),
                        status,
                    }
                })
            })
            .collect();
        Attack { tasks }
    }

    /// POST `body` to `/mutate` over a fresh HTTP/1.1 connection; the status.
    pub async fn post_http1(&self, body: &[u8]) -> Option<u16> {
        let stream = self.connect().await.ok()?;
        let (reader, mut writer) = tokio::io::split(stream);
        let head = format!(
            "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let write = async {
            let _ = writer.write_all(head.as_bytes()).await;
            let _ = writer.write_all(body).await;
            let _ = writer.flush().await;
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = write => None,
            outcome = read_until_closed(reader, Instant::now(), Duration::from_secs(60)) => outcome.status,
        }
    }

    /// A normal review over a fresh HTTP/2 connection: (status, allowed,
    /// latency). `None` when the server cannot be reached.
    pub async fn normal_review(&self, review: &serde_json::Value) -> Option<(u16, bool, Duration)> {
        let started = Instant::now();
        let stream = self.connect().await.ok()?;
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .ok()?;
        let driver = tokio::spawn(connection);
        let body = Bytes::from(serde_json::to_vec(review).expect("review JSON"));
        let request = hyper::Request::post("/mutate")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(body))
            .expect("request");
        let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request))
            .await
            .ok()?
            .ok()?;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.ok()?.to_bytes();
        let elapsed = started.elapsed();
        driver.abort();
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        Some((status, answer["response"]["allowed"] == true, elapsed))
    }

    /// A normal review over a fresh HTTP/2 connection that stays open, idle,
    /// until the returned attack is dropped: the status.
    pub async fn review_and_hold(&self, review: &serde_json::Value) -> Option<(u16, Attack)> {
        let stream = self.connect().await.ok()?;
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .ok()?;
        let driver = tokio::spawn(async move {
            let started = Instant::now();
            let _ = connection.await;
            Outcome {
                closed_after: Some(started.elapsed()),
                status: None,
            }
        });
        let body = Bytes::from(serde_json::to_vec(review).expect("review JSON"));
        let request = hyper::Request::post("/mutate")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(body))
            .expect("request");
        let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request))
            .await
            .ok()?
            .ok()?;
        let status = response.status().as_u16();
        let _ = response.into_body().collect().await;
        // The connection lives while its driver runs and a sender is kept
        // (HTTP/2 closes a connection whose senders are all gone).
        let keeper = tokio::spawn(async move {
            let _sender = sender;
            std::future::pending::<Outcome>().await
        });
        Some((
            status,
            Attack {
                tasks: vec![driver, keeper],
            },
        ))
    }

    /// Up to `count` reviews on one HTTP/1.1 connection, one per `interval`,
    /// until the server closes it: each answer's status and whether it said
    /// `Connection: close`. Ends early when the connection cannot be opened or
    /// a request fails.
    pub async fn reviews_on_one_connection(
        &self,
        review: &serde_json::Value,
        count: usize,
        interval: Duration,
    ) -> Vec<(u16, bool)> {
        let mut answers = Vec::new();
        let Ok(stream) = self.connect().await else {
            return answers;
        };
        let Ok((mut sender, connection)) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
        else {
            return answers;
        };
        let driver = tokio::spawn(connection);
        let body = Bytes::from(serde_json::to_vec(review).expect("review JSON"));
        for _ in 0..count {
            if sender.ready().await.is_err() {
                break;
            }
            let request = hyper::Request::post("/mutate")
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(body.clone()))
                .expect("request");
            let Ok(Ok(response)) =
                tokio::time::timeout(Duration::from_secs(20), sender.send_request(request)).await
            else {
                break;
            };
            let status = response.status().as_u16();
            let close = response
                .headers()
                .get(hyper::header::CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
            let _ = response.into_body().collect().await;
            answers.push((status, close));
            if close {
                break;
            }
            tokio::time::sleep(interval).await;
        }
        driver.abort();
        answers
    }

    /// A GET of `path` over a fresh HTTP/2 connection; the status.
    pub async fn get(&self, path: &str) -> Option<u16> {
        let stream = self.connect().await.ok()?;
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .ok()?;
        let driver = tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .body(Empty::<Bytes>::new())
            .expect("request");
        let response = sender.send_request(request).await.ok()?;
        driver.abort();
        Some(response.status().as_u16())
    }
}

/// Tasks of one running attack; dropping it ends the attack.
#[derive(Debug)]
pub struct Attack {
    tasks: Vec<JoinHandle<Outcome>>,
}

impl Attack {
    /// The outcomes of the tasks that have ended by now.
    pub fn finished(&self) -> usize {
        self.tasks.iter().filter(|t| t.is_finished()).count()
    }

    /// Wait for every task (at most `give_up`), then end the attack.
    pub async fn outcomes(mut self, give_up: Duration) -> Vec<Option<Outcome>> {
        let deadline = tokio::time::Instant::now() + give_up;
        let mut out = Vec::new();
        for task in std::mem::take(&mut self.tasks) {
            let abort = task.abort_handle();
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(outcome)) => out.push(Some(outcome)),
                _ => {
                    abort.abort();
                    out.push(None);
                }
            }
        }
        out
    }
}

impl Drop for Attack {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn filler(bytes: usize) -> Bytes {
    if bytes == 0 {
        return Bytes::new();
    }
    let mut body = Vec::with_capacity(bytes);
    body.extend_from_slice(REVIEW_PREFIX.as_bytes());
    body.resize(bytes.max(REVIEW_PREFIX.len()), b'x');
    Bytes::from(body)
}

async fn wait_closed(stream: TlsStream<TcpStream>, started: Instant, give_up: Duration) -> Outcome {
    let (reader, _writer) = tokio::io::split(stream);
    read_until_closed(reader, started, give_up).await
}

/// Read until the server closes (or `give_up`), noting the status line.
async fn read_until_closed(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    started: Instant,
    give_up: Duration,
) -> Outcome {
    let mut head = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let closed = tokio::time::timeout(give_up, async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if head.len() < 64 {
                        head.extend_from_slice(&buf[..n.min(64)]);
                    }
                }
            }
        }
    })
    .await
    .is_ok();
    let status = std::str::from_utf8(&head)
        .ok()
        .and_then(|h| h.strip_prefix("HTTP/1.1 "))
        .and_then(|h| h.get(..3))
        .and_then(|code| code.parse().ok());
    Outcome {
        closed_after: closed.then(|| started.elapsed()),
        status,
    }
}

/// A TCP connection to `addr` from `source` (any local address when `None`).
async fn tcp_from(addr: SocketAddr, source: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(addr).await;
    };
    let socket = match source {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(addr).await
}

/// `count` plain-HTTP connections to `addr` (a metrics or probe port) from
/// `source`, each sending nothing after it is accepted: an idle keep-alive
/// client. Each task reports when the server closed it (waiting at most
/// `give_up`).
pub fn plain_idle_connections(
    addr: SocketAddr,
    source: IpAddr,
    count: usize,
    give_up: Duration,
) -> Vec<JoinHandle<Outcome>> {
    (0..count)
        .map(|_| {
            tokio::spawn(async move {
                let started = Instant::now();
                let connected =
                    tokio::time::timeout(Duration::from_secs(5), tcp_from(addr, Some(source)))
                        .await;
                match connected {
                    Ok(Ok(tcp)) => read_until_closed(tcp, started, give_up).await,
                    _ => Outcome {
                        closed_after: Some(started.elapsed()),
                        status: None,
                    },
                }
            })
        })
        .collect()
}

/// `count` connections to `addr` from `source` held open as
/// [`plain_idle_connections`] holds them, each opened again whenever the
/// server closes it, until the attack is dropped.
pub fn held_plain_connections(addr: SocketAddr, source: IpAddr, count: usize) -> Attack {
    let tasks = (0..count)
        .map(|_| {
            tokio::spawn(async move {
                let started = Instant::now();
                loop {
                    if let Ok(Ok(tcp)) =
                        tokio::time::timeout(Duration::from_secs(5), tcp_from(addr, Some(source)))
                            .await
                    {
                        read_until_closed(tcp, started, Duration::from_secs(3600)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    Attack { tasks }
}

/// A kubelet-style HTTP probe: `GET path` over a new plain-HTTP connection
/// from `source`, `Connection: close` (the kubelet's probes keep no
/// connection alive), answered within 5 s: the status, `None` when the
/// connection was refused, reset or not answered.
pub async fn probe(addr: SocketAddr, source: IpAddr, path: &str) -> Option<u16> {
    let exchange = async {
        let mut tcp = tcp_from(addr, Some(source)).await.ok()?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.34\r\nConnection: close\r\n\r\n"
        );
        tcp.write_all(request.as_bytes()).await.ok()?;
        read_until_closed(tcp, Instant::now(), Duration::from_secs(5))
            .await
            .status
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// `tries` kubelet-style probes of `path`, one after another: how many were
/// answered 200.
pub async fn probes_answered(addr: SocketAddr, source: IpAddr, path: &str, tries: usize) -> usize {
    let mut answered = 0;
    for _ in 0..tries {
        if probe(addr, source, path).await == Some(200) {
            answered += 1;
        }
    }
    answered
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Samples a process's resident memory in the background; the peak so far.
#[derive(Debug)]
pub struct RssSampler {
    peak: Arc<std::sync::atomic::AtomicU64>,
    task: JoinHandle<()>,
}

impl RssSampler {
    pub fn start(pid: u32) -> RssSampler {
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = Arc::clone(&peak);
        let task = tokio::spawn(async move {
            loop {
                let rss = proc_status_kib(pid, "VmRSS");
                seen.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        RssSampler { peak, task }
    }

    /// The highest `VmRSS` seen, in KiB.
    pub fn peak_kib(&self) -> u64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Open descriptors of a process.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

/// Lower a process's open-files limit (soft and hard) to `limit`.
pub fn limit_open_files(pid: u32, limit: u64) {
    let rlimit = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: prlimit reads `rlimit` and writes nothing (old limit pointer is null).
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &rlimit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// A small CREATE review of the shipped policy's EU/PCI example.
pub fn placement_review(uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
            "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "developer"},
            "object": {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": uid, "namespace": "default", "annotations": {
                    "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true",
                    "policy.federation.alpha.kubernetes.io/pci-compliance-level": "2"
                }},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": uid}},
                    "template": {"metadata": {"labels": {"app": uid}},
                        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
            },
            "dryRun": true
        }
    })
}

/// Raise this process's soft open-files limit to its hard limit: an attacker
/// holding a thousand connections needs more than the usual 1,024. Returns
/// the limit now in force.
pub fn raise_own_open_files_limit() -> u64 {
    let mut rlimit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; setrlimit only reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rlimit) != 0 {
            return 0;
        }
        let raised = libc::rlimit {
            rlim_cur: rlimit.rlim_max,
            rlim_max: rlimit.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
            return raised.rlim_cur;
        }
    }
    rlimit.rlim_cur
}
