//! Plumbing shared by the components that mirror a watch cache into the engine
//! (each replicated type, the policy loader).
//!
//! A component writes its whole content in one go (a *full sync*: at start, after
//! a relist, after an engine restart) and single keys in between. A full sync
//! holds the component's gate exclusively; single-key writes hold it shared and
//! are skipped until the first full sync succeeded (which covers them, because
//! it reads the cache after every earlier single-key write finished). Neither
//! ever writes an older state over a newer one: both read the reflector store
//! at the time they write.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::Client;
use kube::api::ApiResource;
use kube::core::GroupVersion;
use kube::discovery::Scope;
use tokio::sync::{Notify, RwLock, RwLockReadGuard, RwLockWriteGuard};
use tokio_util::sync::CancellationToken;

use crate::config::engine::ReplicaScope;
use crate::engine_sync::SyncState;
use crate::error::SyncError;
use crate::gvr::Gvr;
use policy_client::retry::Backoff;

/// Serializes full syncs against single-key writes of one component.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    lock: RwLock<()>,
    /// Engine epoch of the last successful full sync (0: none yet).
    loaded_epoch: AtomicU64,
}

impl Gate {
    /// For a single-key write: `None` until a full sync succeeded for the current
    /// engine epoch. Skipping is safe then: that full sync is still to run (or is
    /// running, and this waits for it) and reads the cache after this call.
    pub(crate) async fn single(&self, current_epoch: u64) -> Option<RwLockReadGuard<'_, ()>> {
        let guard = self.lock.read().await;
        let loaded = self.loaded_epoch.load(Ordering::Acquire);
        (loaded > 0 && loaded >= current_epoch).then_some(guard)
    }

    pub(crate) async fn full(&self) -> RwLockWriteGuard<'_, ()> {
        self.lock.write().await
    }

    /// Call with the full guard held, after a successful full sync for `epoch`.
    pub(crate) fn set_loaded(&self, epoch: u64) {
        self.loaded_epoch.fetch_max(epoch, Ordering::AcqRel);
    }
}

/// Drive a component's full syncs: wait for its cache (`ready`) and the first
/// engine epoch, then run `full_sync` with retries, report the epoch loaded, and
/// do it again on every `relist` notification and every new epoch.
pub(crate) async fn full_sync_loop<R, F, Fut>(
    name: String,
    state: Arc<SyncState>,
    ready: R,
    relist: Arc<Notify>,
    mut full_sync: F,
    cancel: CancellationToken,
) where
    R: Future<Output = ()>,
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<(), SyncError>>,
{
    tokio::select! {
        _ = ready => {}
        _ = cancel.cancelled() => return,
    }
    let mut epochs = state.subscribe_epoch();
    tokio::select! {
        r = epochs.wait_for(|e| *e >= 1) => if r.is_err() { return },
        _ = cancel.cancelled() => return,
    }
    loop {
        let mut delays = Backoff {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(15),
        }
        .delays();
        let epoch = loop {
            let epoch = *epochs.borrow_and_update();
            let started = std::time::Instant::now();
            match full_sync(epoch).await {
                Ok(()) => {
                    tracing::debug!(component = %name, epoch, took_ms = started.elapsed().as_millis() as u64, "full sync done");
                    break epoch;
                }
                Err(e) => {
                    let delay = delays.next().unwrap_or(Duration::from_secs(15));
                    tracing::warn!(component = %name, epoch, error = %e, ?delay, "full sync failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = cancel.cancelled() => return,
                    }
                }
            }
        };
        state.mark_loaded(&name, epoch);
        tokio::select! {
            _ = relist.notified() => {}
            r = epochs.changed() => if r.is_err() { return },
            _ = cancel.cancelled() => return,
        }
    }
}

/// Find a resource type on the API server; retried by the caller while it is
/// missing (a CRD may be installed later). A scope that contradicts the flag is a
/// configuration error.
pub(crate) async fn discover(
    client: &Client,
    gvr: &Gvr,
    expected: Option<ReplicaScope>,
) -> Result<(ApiResource, bool), SyncError> {
    let gv = GroupVersion::gv(&gvr.group, &gvr.version);
    let group = kube::discovery::pinned_group(client, &gv)
        .await
        .map_err(|e| SyncError::Discovery {
            gvr: gvr.to_string(),
            reason: e.to_string(),
        })?;
    let (resource, caps) = group
        .versioned_resources(&gvr.version)
        .into_iter()
        .find(|(ar, _)| ar.plural == gvr.resource)
        .ok_or_else(|| SyncError::Discovery {
            gvr: gvr.to_string(),
            reason: format!(
                "group version {} has no resource {:?}",
                gvr.api_version(),
                gvr.resource
            ),
        })?;
    let namespaced = matches!(caps.scope, Scope::Namespaced);
    match expected {
        Some(ReplicaScope::Namespaced) if !namespaced => Err(SyncError::ScopeMismatch {
            gvr: gvr.to_string(),
            actual: "cluster-scoped",
            flag: "--replicate (use --replicate-cluster)",
        }),
        Some(ReplicaScope::Cluster) if namespaced => Err(SyncError::ScopeMismatch {
            gvr: gvr.to_string(),
            actual: "namespaced",
            flag: "--replicate-cluster (use --replicate)",
        }),
        _ => Ok((resource, namespaced)),
    }
}

/// [`discover`] until it succeeds; `Ok(None)` on cancel, `Err` for a scope mismatch.
pub(crate) async fn discover_until_found(
    client: &Client,
    gvr: &Gvr,
    expected: Option<ReplicaScope>,
    cancel: &CancellationToken,
) -> Result<Option<(ApiResource, bool)>, SyncError> {
    let mut delays = Backoff {
        min_delay: Duration::from_millis(500),
        max_delay: Duration::from_secs(30),
    }
    .delays();
    loop {
        match discover(client, gvr, expected).await {
            Ok(found) => return Ok(Some(found)),
            Err(e @ SyncError::ScopeMismatch { .. }) => return Err(e),
            Err(e) => {
                let delay = delays.next().unwrap_or(Duration::from_secs(30));
                tracing::warn!(resource = %gvr, error = %e, ?delay, "resource type not available yet; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = cancel.cancelled() => return Ok(None),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;

    #[tokio::test]
    async fn single_writes_wait_for_the_first_full_sync() {
        let gate = Gate::default();
        assert!(gate.single(0).await.is_none());
        assert!(gate.single(1).await.is_none());
        {
            let _full = gate.full().await;
            gate.set_loaded(1);
        }
        assert!(gate.single(1).await.is_some());
        // The engine restarted: single writes wait for the reload.
        assert!(gate.single(2).await.is_none());
        {
            let _full = gate.full().await;
            gate.set_loaded(2);
        }
        assert!(gate.single(2).await.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn full_syncs_retry_and_rerun_on_relist_and_new_epochs() {
        let state = SyncState::new(Arc::new(Metrics::new()));
        state.register("t");
        let relist = Arc::new(Notify::new());
        let cancel = CancellationToken::new();
        let calls: Arc<Mutex<Vec<u64>>> = Arc::default();
        let fail_first = Arc::new(AtomicBool::new(true));
        let (c, f) = (calls.clone(), fail_first.clone());
        let task = tokio::spawn(full_sync_loop(
            "t".to_owned(),
            state.clone(),
            async {},
            relist.clone(),
            move |epoch| {
                let (c, f) = (c.clone(), f.clone());
                async move {
                    c.lock().unwrap().push(epoch);
                    if f.swap(false, Ordering::SeqCst) {
                        Err(SyncError::Config("engine away".into()))
                    } else {
                        Ok(())
                    }
                }
            },
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            calls.lock().unwrap().is_empty(),
            "waits for the first epoch"
        );
        state.begin_epoch_for_test();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(*calls.lock().unwrap(), [1, 1], "retried after a failure");
        assert!(state.pending().is_empty());

        relist.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(calls.lock().unwrap().len(), 3);

        state.begin_epoch_for_test();
        assert_eq!(state.pending(), ["t"]);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(*calls.lock().unwrap().last().unwrap(), 2);
        assert!(state.pending().is_empty());
        cancel.cancel();
        task.await.unwrap();
    }
}
