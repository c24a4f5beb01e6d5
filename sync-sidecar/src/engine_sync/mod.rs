//! Whether the engine holds everything: the sync state, and the engine monitor
//! that notices engine restarts.
//!
//! OPA keeps policies and data in memory only. The monitor recognises the engine
//! it loaded by its instance id (OPA's `labels.id`, new at every start; nothing
//! is written into the engine, so its data stays exactly what users put there,
//! as kube-mgmt users expect) or, when the engine offers none, by a *sentinel*
//! document with a fresh random token that it writes and checks. When the id
//! changes or the token is gone (or different), the engine restarted or lost
//! its state: the monitor starts a new *epoch*. Every component (each replicated type, the policy loader) reloads
//! everything it holds from its watch cache when the epoch changes and reports
//! the epoch it finished loading. The engine is *synced* when every component
//! has loaded the current epoch and the sentinel, written before those loads,
//! is still there afterwards, so a restart in the middle of a reload is never
//! mistaken for a finished one.

pub(crate) mod component;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use policy_client::engine::{PolicyEngine, QueryOutcome};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// A snapshot of the sync state, as `/readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct SyncStatus {
    /// Engine instance counter: 0 until the first sentinel write succeeded.
    pub epoch: u64,
    pub synced: bool,
    pub engine_up: bool,
    /// Components that have not finished loading the current epoch.
    pub pending: Vec<String>,
}

/// Shared sync state. See the module documentation.
pub(crate) struct SyncState {
    epoch: watch::Sender<u64>,
    synced: watch::Sender<bool>,
    engine_up: AtomicBool,
    components: Mutex<BTreeMap<String, u64>>,
    progress: Notify,
    progress_tx: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

impl fmt::Debug for SyncState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncState")
            .field("status", &self.status())
            .finish()
    }
}

impl SyncState {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(SyncState {
            epoch: watch::channel(0).0,
            synced: watch::channel(false).0,
            engine_up: AtomicBool::new(false),
            components: Mutex::new(BTreeMap::new()),
            progress: Notify::new(),
            progress_tx: watch::channel(0).0,
            metrics,
        })
    }

    /// Declare a component that must load every epoch before the engine is synced.
    /// Call before the monitor starts.
    pub(crate) fn register(&self, name: &str) {
        self.components.lock().insert(name.to_owned(), 0);
    }

    pub(crate) fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    pub(crate) fn subscribe_epoch(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    pub(crate) fn subscribe_synced(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }

    pub(crate) fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Synced, and the engine answered the last check.
    pub(crate) fn is_ready(&self) -> bool {
        self.is_synced() && self.engine_up.load(Ordering::Relaxed)
    }

    /// A component finished loading everything it holds into the engine for `epoch`.
    pub(crate) fn mark_loaded(&self, name: &str, epoch: u64) {
        if let Some(loaded) = self.components.lock().get_mut(name) {
            *loaded = (*loaded).max(epoch);
        }
        self.progress.notify_one();
        self.progress_tx.send_modify(|n| *n += 1);
    }

    /// Wait until every component but `except` has loaded `epoch` (or a later one),
    /// or the epoch moved on. The policy loader uses it to load policies after the
    /// data: until then a fresh engine answers *undefined*, which the webhook treats
    /// as "not synced", instead of deciding on partial data.
    pub(crate) async fn wait_loaded_except(&self, except: &str, epoch: u64) {
        let mut progress = self.progress_tx.subscribe();
        loop {
            let done = self.epoch() != epoch
                || self
                    .components
                    .lock()
                    .iter()
                    .all(|(name, loaded)| name == except || *loaded >= epoch);
            if done {
                return;
            }
            if progress.changed().await.is_err() {
                return;
            }
        }
    }

    /// Components not yet loaded for the current epoch.
    pub(crate) fn pending(&self) -> Vec<String> {
        let epoch = self.epoch();
        self.components
            .lock()
            .iter()
            .filter(|(_, loaded)| **loaded < epoch || epoch == 0)
            .map(|(name, _)| name.clone())
            .collect()
    }

    pub(crate) fn status(&self) -> SyncStatus {
        SyncStatus {
            epoch: self.epoch(),
            synced: self.is_synced(),
            engine_up: self.engine_up.load(Ordering::Relaxed),
            pending: self.pending(),
        }
    }

    fn begin_epoch(&self) -> u64 {
        self.set_synced(false);
        self.epoch.send_modify(|e| *e += 1);
        self.progress_tx.send_modify(|n| *n += 1);
        self.epoch()
    }

    #[cfg(test)]
    pub(crate) fn begin_epoch_for_test(&self) -> u64 {
        self.begin_epoch()
    }

    fn set_synced(&self, synced: bool) {
        self.synced.send_if_modified(|s| {
            let changed = *s != synced;
            *s = synced;
            changed
        });
        self.metrics.synced.set(i64::from(synced));
    }

    fn set_engine_up(&self, up: bool) {
        let was = self.engine_up.swap(up, Ordering::Relaxed);
        if was != up {
            if up {
                tracing::info!("policy engine is answering");
            } else {
                tracing::warn!("policy engine is not answering");
            }
        }
        self.metrics.engine_up.set(i64::from(up));
    }
}

/// What one sentinel check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SentinelCheck {
    /// Our token is there: same engine instance, state intact.
    Intact,
    /// Absent or foreign: the engine restarted or lost its state.
    Lost,
    /// The engine did not answer.
    Unreachable(String),
}

/// Compare the engine's sentinel document with `token`.
pub(crate) async fn check_sentinel(
    engine: &dyn PolicyEngine,
    path: &str,
    token: &str,
    timeout: Duration,
) -> SentinelCheck {
    match engine
        .query(path, &json!({}), Instant::now() + timeout)
        .await
    {
        Ok(QueryOutcome::Defined(value))
            if value.get("token").and_then(Value::as_str) == Some(token) =>
        {
            SentinelCheck::Intact
        }
        Ok(_) => SentinelCheck::Lost,
        Err(e) => SentinelCheck::Unreachable(e.to_string()),
    }
}

fn new_token() -> String {
    use std::sync::atomic::AtomicU64;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// How the monitor recognises the engine instance it loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Marker {
    Instance(String),
    Sentinel(String),
}

impl Marker {
    fn kind(&self) -> &'static str {
        match self {
            Marker::Instance(_) => "instance id",
            Marker::Sentinel(_) => "sentinel",
        }
    }
}

/// Identify the engine: its instance id, else a freshly written sentinel.
async fn mark(engine: &dyn PolicyEngine, sentinel_path: &str) -> Result<Marker, String> {
    match engine.instance_id().await {
        Ok(Some(id)) => return Ok(Marker::Instance(id)),
        Ok(None) => {}
        Err(e) => return Err(e.to_string()),
    }
    let token = new_token();
    let doc = json!({"token": token, "writer": "placement-sync"});
    engine
        .put_data(sentinel_path, &doc)
        .await
        .map(|()| Marker::Sentinel(token))
        .map_err(|e| e.to_string())
}

/// Whether the engine is still the instance `marker` recognised.
async fn check(
    engine: &dyn PolicyEngine,
    marker: &Marker,
    sentinel_path: &str,
    timeout: Duration,
) -> SentinelCheck {
    match marker {
        Marker::Sentinel(token) => check_sentinel(engine, sentinel_path, token, timeout).await,
        Marker::Instance(id) => match engine.instance_id().await {
            Ok(Some(now)) if &now == id => SentinelCheck::Intact,
            Ok(_) => SentinelCheck::Lost,
            Err(e) => SentinelCheck::Unreachable(e.to_string()),
        },
    }
}

/// Run the engine monitor until `cancel`. See the module documentation.
pub(crate) async fn monitor_engine(
    engine: Arc<dyn PolicyEngine>,
    state: Arc<SyncState>,
    sentinel_path: String,
    interval: Duration,
    cancel: CancellationToken,
) {
    let mut marker: Option<Marker> = None;
    let mut epoch_started = Instant::now();
    let check_timeout = interval.max(Duration::from_secs(1));
    loop {
        if marker.is_none() {
            match mark(engine.as_ref(), &sentinel_path).await {
                Ok(found) => {
                    state.set_engine_up(true);
                    let epoch = state.begin_epoch();
                    epoch_started = Instant::now();
                    tracing::info!(
                        epoch,
                        recognised_by = found.kind(),
                        "loading all policies and data into the engine"
                    );
                    marker = Some(found);
                }
                Err(error) => {
                    state.set_engine_up(false);
                    state.set_synced(false);
                    tracing::debug!(%error, "cannot identify the engine");
                    tokio::select! {
                        _ = tokio::time::sleep(interval) => continue,
                        _ = cancel.cancelled() => return,
                    }
                }
            }
        }
        // Check sooner when a component reports progress and we are not synced yet.
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = state.progress.notified(), if !state.is_synced() => {}
            _ = cancel.cancelled() => return,
        }
        let Some(current) = marker.clone() else {
            continue;
        };
        match check(engine.as_ref(), &current, &sentinel_path, check_timeout).await {
            SentinelCheck::Intact => {
                state.set_engine_up(true);
                if !state.is_synced() && state.pending().is_empty() {
                    let took = epoch_started.elapsed();
                    state.metrics.resync_seconds.set(took.as_secs_f64());
                    state.set_synced(true);
                    tracing::info!(
                        epoch = state.epoch(),
                        took_ms = took.as_millis() as u64,
                        "engine in sync"
                    );
                }
            }
            SentinelCheck::Lost => {
                state.set_engine_up(true);
                state.metrics.engine_restarts.inc();
                tracing::warn!(
                    epoch = state.epoch(),
                    "policy engine restarted or lost its state; reloading everything"
                );
                state.set_synced(false);
                marker = None;
            }
            SentinelCheck::Unreachable(error) => {
                tracing::debug!(%error, "engine check failed");
                state.set_engine_up(false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy_client::embedded::Embedded;

    const SENTINEL: &str = "system/placement-sync/sentinel";

    async fn wait_for(rx: &mut watch::Receiver<bool>, want: bool) {
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|v| *v == want))
            .await
            .expect("state reached")
            .unwrap();
    }

    #[tokio::test]
    async fn synced_only_after_every_component_loaded_the_current_epoch() {
        let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
        let state = SyncState::new(Arc::new(Metrics::new()));
        state.register("replicasets");
        state.register("policies");
        let cancel = CancellationToken::new();
        let monitor = tokio::spawn(monitor_engine(
            engine.clone(),
            state.clone(),
            SENTINEL.to_owned(),
            Duration::from_millis(20),
            cancel.clone(),
        ));
        let mut epochs = state.subscribe_epoch();
        epochs.wait_for(|e| *e == 1).await.unwrap();
        assert!(!state.is_synced());
        assert_eq!(state.pending(), ["policies", "replicasets"]);

        state.mark_loaded("replicasets", 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!state.is_synced(), "one component still loading");
        assert_eq!(state.pending(), ["policies"]);

        state.mark_loaded("policies", 1);
        let mut synced = state.subscribe_synced();
        wait_for(&mut synced, true).await;
        assert!(state.is_ready());

        // The engine loses its state: a new epoch, not synced until reloaded.
        engine.delete_data(SENTINEL).await.unwrap();
        wait_for(&mut synced, false).await;
        epochs.wait_for(|e| *e == 2).await.unwrap();
        assert_eq!(state.pending(), ["policies", "replicasets"]);
        // Stale marks for the old epoch do not count.
        state.mark_loaded("policies", 1);
        state.mark_loaded("replicasets", 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!state.is_synced());
        state.mark_loaded("policies", 2);
        wait_for(&mut synced, true).await;

        cancel.cancel();
        monitor.await.unwrap();
    }

    #[tokio::test]
    async fn foreign_or_missing_sentinel_is_a_restart() {
        let engine = Embedded::new();
        let check = |token: &'static str| {
            let engine = &engine;
            async move { check_sentinel(engine, SENTINEL, token, Duration::from_secs(1)).await }
        };
        assert_eq!(check("a").await, SentinelCheck::Lost);
        engine
            .put_data(SENTINEL, &json!({"token": "a"}))
            .await
            .unwrap();
        assert_eq!(check("a").await, SentinelCheck::Intact);
        assert_eq!(check("b").await, SentinelCheck::Lost);
    }

    #[test]
    fn tokens_are_unique() {
        assert_ne!(new_token(), new_token());
    }
}
