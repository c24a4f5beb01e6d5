//! When a webhook pod takes traffic (`/readyz`).
//!
//! Readiness decides which pods the Service sends reviews to; with
//! `failurePolicy: Fail`, a Service without ready pods denies every write. So:
//! - a pod is ready once it knows whether policies exist, and then either none
//!   does (it admits, with a warning, whatever its engine does) or its engine
//!   holds the policies (`--engine-ready-url`, the sync sidecar's `/readyz`),
//!   or `--engine-startup-grace` has passed (an engine that never comes up
//!   then gets the webhook's own fail-closed answer, naming the engine, rather
//!   than the API server's "no endpoints");
//! - once ready it stays ready: an engine that restarts or hangs later gets
//!   the fail-closed answer from every pod, while a new pod of a rolling
//!   update takes no traffic before its engine is in sync.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::presence::PolicyPresence;

/// Why the pod is (not) ready, for `/readyz`'s body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadyState {
    /// The policy ConfigMaps are not listed yet.
    PoliciesUnknown,
    /// Policies exist and the engine is not in sync yet.
    EngineNotReady,
    Ready,
}

#[derive(Debug)]
pub(crate) struct Readiness {
    started: Instant,
    grace: Duration,
    engine_ready_url: Option<String>,
    http: reqwest::Client,
    /// Ready once, ready for good.
    latched: AtomicBool,
}

impl Readiness {
    pub(crate) fn new(
        engine_ready_url: Option<String>,
        grace: Duration,
    ) -> Result<Readiness, reqwest::Error> {
        Ok(Readiness {
            started: Instant::now(),
            grace,
            engine_ready_url,
            // Plain HTTP on the pod's loopback: no TLS roots needed.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .tls_certs_only([])
                .build()?,
            latched: AtomicBool::new(false),
        })
    }

    pub(crate) async fn check(&self, presence: &PolicyPresence) -> ReadyState {
        if self.latched.load(Ordering::Acquire) {
            return ReadyState::Ready;
        }
        if !presence.is_synced() {
            return ReadyState::PoliciesUnknown;
        }
        let ready = !presence.policies_exist()
            || self.started.elapsed() >= self.grace
            || self.engine_ready().await;
        if !ready {
            return ReadyState::EngineNotReady;
        }
        self.latched.store(true, Ordering::Release);
        ReadyState::Ready
    }

    async fn engine_ready(&self) -> bool {
        let Some(url) = &self.engine_ready_url else {
            return true;
        };
        match self.http.get(url).send().await {
            Ok(response) => response.status().is_success(),
            Err(e) => {
                tracing::debug!(error = %e, "engine readiness");
                false
            }
        }
    }
}
