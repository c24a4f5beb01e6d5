//! A fault-injecting HTTP proxy in front of a real OPA: it delays or fails
//! requests on command, to exercise the webhook's retry path. Everything it
//! does answer comes from the real OPA behind it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

#[derive(Default)]
struct Faults {
    /// Answer this many requests with 503 (and `Retry-After: 0`) before passing.
    fail_next: AtomicU32,
    /// Delay every request by this many milliseconds.
    delay_ms: AtomicU64,
    /// Requests received.
    seen: AtomicU32,
}

pub struct FaultProxy {
    faults: Arc<Faults>,
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Start on a free loopback port, forwarding to `upstream` (e.g. OPA's URL).
    /// Runs on the calling test's runtime.
    pub async fn start(upstream: String) -> FaultProxy {
        crate::install_crypto();
        let faults = Arc::new(Faults::default());
        let client = reqwest::Client::new();
        let state = (Arc::clone(&faults), client, upstream);
        let app = axum::Router::new().fallback(forward).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FaultProxy { faults, addr, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn fail_next(&self, count: u32) {
        self.faults.fail_next.store(count, Ordering::SeqCst);
    }

    pub fn delay(&self, delay: Duration) {
        self.faults
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn requests_seen(&self) -> u32 {
        self.faults.seen.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type ProxyState = (Arc<Faults>, reqwest::Client, String);

async fn forward(
    State((faults, client, upstream)): State<ProxyState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    faults.seen.fetch_add(1, Ordering::SeqCst);
    let delay = faults.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let failing = faults
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "0")],
            "injected 503\n",
        )
            .into_response();
    }
    let url = format!(
        "{upstream}{}",
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let mut request = client.request(method, url).body(body);
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    match request.send().await {
        Ok(response) => {
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await.unwrap_or_default();
            let mut out = (status, body).into_response();
            for (name, value) in &headers {
                if name == "content-type" {
                    out.headers_mut().insert(name, value.clone());
                }
            }
            out
        }
        Err(e) => (StatusCode::BAD_GATEWAY, format!("proxy: {e}\n")).into_response(),
    }
}
