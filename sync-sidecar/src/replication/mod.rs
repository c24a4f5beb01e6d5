//! Replication of Kubernetes objects into the engine (one task per type).
//!
//! Each type's objects come from its watch ([`watched`], shared with the
//! remediator when it remediates the type too): a compact store
//! ([`objects`]) of the JSON the engine receives ([`document`]), with
//! `managedFields` stripped. The first full list, every relist (after
//! `410 Gone`) and every engine restart write the whole type as one document,
//! so deletions missed while disconnected disappear too; in between, adds,
//! updates and deletes are mirrored one object at a time through a
//! [`KeyedQueue`]. With `--replicate-only-read-types`, only the types the
//! policies read are written ([`demand`]).

mod classify;
pub(crate) mod document;
pub(crate) mod health;
pub(crate) mod objects;
pub(crate) mod revision;
pub(crate) mod watched;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use policy_client::engine::PolicyEngine;
use serde_json::Value;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cause::{Cause, Trigger};
use crate::config::engine::{ReplicaScope, ReplicateSpec};
use crate::engine_sync::SyncState;
use crate::engine_sync::component::{Gate, full_sync_loop};
use crate::error::SyncError;
use crate::metrics::Metrics;
use crate::policies::demand::Demand;
use crate::policies::rego_refs::{DataReads, PolicyReads};
use crate::queue::{KEY_BACKOFF, KeyedQueue};
use crate::replication::document::{ObjectKey, object_path, type_path};
use crate::replication::health::{ClusterHealth, ClusterKind, cluster_kind};
use crate::replication::revision::ReplicatedTypes;
use crate::replication::watched::{Need, Subscription, WatchChange, WatchedType};

/// What every replicated type shares.
#[derive(Clone)]
pub(crate) struct ReplicatorContext {
    pub(crate) engine: Arc<dyn PolicyEngine>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) state: Arc<SyncState>,
    pub(crate) prefix: String,
    pub(crate) ignore_namespaces: BTreeSet<String>,
    pub(crate) permits: Arc<Semaphore>,
    /// Fired after a successful write of a type the policies read, with why
    /// (remediation trigger).
    pub(crate) trigger: Arc<Trigger>,
    /// The health of the replicated clusters (for the partition rule).
    pub(crate) health: Arc<ClusterHealth>,
    /// Every replicated type (for the configured revision).
    pub(crate) replicated: Arc<ReplicatedTypes>,
    pub(crate) reads: PolicyReads,
    /// With `--replicate-only-read-types`: which types to write.
    pub(crate) demand: Option<Arc<Demand>>,
}

/// The sync-state component name of a replicated type.
pub(crate) fn component_name(spec: &ReplicateSpec) -> String {
    format!("replicate:{}", spec.gvr)
}

/// Field selector that keeps ignored namespaces out of the watch.
pub(crate) fn ignore_selector(ignore: &BTreeSet<String>) -> Option<String> {
    (!ignore.is_empty()).then(|| {
        ignore
            .iter()
            .map(|ns| format!("metadata.namespace!={ns}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

struct TypeReplicator {
    watched: Arc<WatchedType>,
    gate: Gate,
    ctx: ReplicatorContext,
    /// The type's cluster kind, when it is a cluster registry.
    cluster: Option<&'static ClusterKind>,
    /// Why each object changed since it was last written: fired once the
    /// engine holds the change.
    causes: Mutex<HashMap<ObjectKey, Vec<Cause>>>,
    /// A (re)list came since the last whole-type write.
    listed: std::sync::atomic::AtomicBool,
}

impl TypeReplicator {
    fn label(&self) -> &str {
        &self.watched.resource.plural
    }

    fn ignored(&self, key: &ObjectKey) -> bool {
        self.watched.namespaced
            && key
                .namespace
                .as_ref()
                .is_some_and(|ns| self.ctx.ignore_namespaces.contains(ns))
    }

    /// How many objects the engine holds of this type.
    fn replicated_count(&self) -> usize {
        if self.ctx.ignore_namespaces.is_empty() {
            self.watched.objects.len()
        } else {
            // A watch shared with the remediator holds ignored namespaces too.
            self.watched.objects.count(|k| !self.ignored(k))
        }
    }

    fn read(&self) -> bool {
        self.ctx.reads.includes(&self.watched.resource.plural)
    }

    /// A watched change of `key` from `before` to `after` (`None`: absent):
    /// the health of a cluster, and why the change would re-place workloads.
    fn note(&self, key: &ObjectKey, before: Option<&[u8]>, after: Option<&[u8]>) {
        let read = self.read();
        if self.ignored(key) || (self.cluster.is_none() && !read) {
            // Status churn of a type nothing reads is not even decoded.
            return;
        }
        let decode =
            |json: Option<&[u8]>| json.and_then(|j| serde_json::from_slice::<Value>(j).ok());
        let (before, after) = (decode(before), decode(after));
        let resource = &self.watched.resource.plural;
        if let Some(kind) = self.cluster {
            match &after {
                Some(after) => self.ctx.health.observe(
                    resource,
                    key.clone(),
                    (kind.healthy)(after),
                    Instant::now(),
                ),
                None => self.ctx.health.forget(resource, key),
            }
        }
        if read {
            let cause =
                classify::classify(self.cluster, resource, key, before.as_ref(), after.as_ref());
            self.causes
                .lock()
                .entry(key.clone())
                .or_default()
                .push(cause);
        }
    }

    /// A (re)list: unknown changes, and the health of every cluster as
    /// listed.
    fn note_listed(&self) {
        self.listed
            .store(true, std::sync::atomic::Ordering::Release);
        let Some(kind) = self.cluster else {
            return;
        };
        let resource = &self.watched.resource.plural;
        let now = Instant::now();
        let listed = self.watched.objects.snapshot(|_| true);
        let keys: BTreeSet<&ObjectKey> = listed.iter().map(|(key, _)| key).collect();
        self.ctx.health.retain(resource, |key| keys.contains(key));
        for (key, json) in listed {
            if let Ok(cluster) = serde_json::from_slice::<Value>(&json) {
                self.ctx
                    .health
                    .observe(resource, key, (kind.healthy)(&cluster), now);
            }
        }
    }

    /// Ask for remediation with the causes of what was written (`key`, or
    /// the whole type), unless no policy can see this type: status heartbeats
    /// of an unread type must not re-query every workload.
    fn fire(&self, key: Option<&ObjectKey>) {
        let causes: Vec<Cause> = match key {
            Some(key) => self.causes.lock().remove(key).unwrap_or_default(),
            None => {
                let mut all: Vec<Cause> = std::mem::take(&mut *self.causes.lock())
                    .into_values()
                    .flatten()
                    .collect();
                // A (re)list may carry changes nobody saw one by one:
                // unknown. A refilled engine gets what it had.
                all.push(
                    if self.listed.swap(false, std::sync::atomic::Ordering::AcqRel) {
                        Cause::Resync
                    } else {
                        Cause::Status
                    },
                );
                all
            }
        };
        if !self.read() {
            return;
        }
        for cause in causes {
            self.ctx.trigger.fire(cause);
        }
    }

    /// Whether the engine is to hold this type.
    fn wanted(&self) -> bool {
        self.ctx
            .demand
            .as_ref()
            .is_none_or(|demand| demand.wants(self.label()))
    }

    async fn full_sync(&self, epoch: u64) -> Result<(), SyncError> {
        let _full = self.gate.full().await;
        if !self.wanted() {
            return self.remove(epoch).await;
        }
        let started = Instant::now();
        let (document, count) = self
            .watched
            .objects
            .document(self.watched.namespaced, |k| !self.ignored(k));
        let path = type_path(&self.ctx.prefix, &self.watched.resource.plural);
        let bytes = document.len();
        match self.ctx.engine.put_data_encoded(&path, document).await {
            Ok(()) => {
                self.ctx.metrics.write_ok(self.label(), "put_document");
                self.ctx.metrics.set_replicated(self.label(), count);
                if let Some(demand) = &self.ctx.demand {
                    demand.set_written(self.label(), Some(epoch));
                }
                self.gate.set_loaded(epoch);
                self.fire(None);
                let took_ms = started.elapsed().as_millis();
                tracing::info!(resource = %self.label(), objects = count, bytes, took_ms, %path, "replicated the whole type");
                Ok(())
            }
            Err(e) => {
                self.ctx.metrics.write_error(self.label(), e.kind());
                Err(e.into())
            }
        }
    }

    /// No policy reads this type (`--replicate-only-read-types`): keep it out
    /// of the engine.
    async fn remove(&self, epoch: u64) -> Result<(), SyncError> {
        let path = type_path(&self.ctx.prefix, &self.watched.resource.plural);
        match self.ctx.engine.delete_data(&path).await {
            Ok(()) => {
                self.ctx.metrics.write_ok(self.label(), "delete_document");
                self.ctx.metrics.set_replicated(self.label(), 0);
                if let Some(demand) = &self.ctx.demand {
                    demand.set_written(self.label(), None);
                }
                self.gate.set_loaded(epoch);
                tracing::info!(resource = %self.label(), %path, "no policy reads this type; it is watched but not written");
                Ok(())
            }
            Err(e) => {
                self.ctx.metrics.write_error(self.label(), e.kind());
                Err(e.into())
            }
        }
    }

    async fn sync_key(&self, key: ObjectKey) -> Result<(), SyncError> {
        let Some(_single) = self.gate.single(self.ctx.state.epoch()).await else {
            // The full sync for this engine epoch has not succeeded yet; it will
            // carry this object.
            return Ok(());
        };
        if self.ignored(&key) || !self.wanted() {
            // Unwanted: the full sync that follows a change of demand writes
            // or removes the whole type.
            return Ok(());
        }
        let path = object_path(
            &self.ctx.prefix,
            &self.watched.resource.plural,
            &key,
            self.watched.namespaced,
        );
        let (op, result) = match self.watched.objects.get(&key) {
            Some(json) => (
                "put",
                self.ctx.engine.put_data_encoded(&path, json.into()).await,
            ),
            None => ("delete", self.ctx.engine.delete_data(&path).await),
        };
        match result {
            Ok(()) => {
                self.ctx.metrics.write_ok(self.label(), op);
                self.ctx
                    .metrics
                    .set_replicated(self.label(), self.replicated_count());
                self.fire(Some(&key));
                tracing::debug!(resource = %self.label(), %key, op, "replicated");
                Ok(())
            }
            Err(e) => {
                self.ctx.metrics.write_error(self.label(), e.kind());
                Err(e.into())
            }
        }
    }
}

/// What one replicated type needs of its watch.
pub(crate) fn need(spec: &ReplicateSpec, ignore_namespaces: &BTreeSet<String>) -> Need {
    Need {
        scope: Some(spec.scope),
        fields: match spec.scope {
            ReplicaScope::Namespaced => ignore_selector(ignore_namespaces),
            ReplicaScope::Cluster => None,
        },
        labels: None,
        listed: false,
    }
}

/// Replicate one type, fed by its watch, until `cancel`.
pub(crate) async fn run_type(
    ctx: ReplicatorContext,
    spec: ReplicateSpec,
    mut watch: Subscription,
    cancel: CancellationToken,
) -> Result<(), SyncError> {
    let name = component_name(&spec);
    let watched = tokio::select! {
        found = watch.found() => found,
        _ = cancel.cancelled() => None,
    };
    let Some(watched) = watched else {
        return Ok(());
    };
    let demand = ctx.demand.as_ref().map(|demand| {
        demand.register(&watched.resource.plural);
        demand.subscribe()
    });
    let replicator = TypeReplicator::registered(ctx, watched);
    let queue = {
        let handler = replicator.clone();
        KeyedQueue::new(
            name.clone(),
            move |key: ObjectKey| {
                let replicator = handler.clone();
                async move { replicator.sync_key(key).await }
            },
            replicator.ctx.permits.clone(),
            KEY_BACKOFF,
            cancel.clone(),
        )
    };
    let relist = Arc::new(Notify::new());
    let full = tokio::spawn(replicator.whole_type_writes(name, relist.clone(), cancel.clone()));
    replicator
        .follow(&mut watch, demand, |key| queue.push(key), &relist, &cancel)
        .await;
    let _ = full.await;
    Ok(())
}

impl TypeReplicator {
    /// The replicator of `watched`, registered as a replicated type.
    fn registered(ctx: ReplicatorContext, watched: Arc<WatchedType>) -> Arc<TypeReplicator> {
        let cluster = cluster_kind(&watched.resource.group, &watched.resource.plural);
        let replicated = ctx.replicated.clone();
        let replicator = Arc::new(TypeReplicator {
            watched,
            gate: Gate::default(),
            ctx,
            cluster,
            causes: Mutex::default(),
            listed: Default::default(),
        });
        replicated.register(replicator.watched.clone(), cluster);
        replicator
    }

    /// The whole-type writes: after the first list, and at each `relist`.
    fn whole_type_writes(
        self: &Arc<Self>,
        name: String,
        relist: Arc<Notify>,
        cancel: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        let replicator = self.clone();
        let listed = self.clone();
        full_sync_loop(
            name,
            self.ctx.state.clone(),
            async move { listed.watched.objects.wait_until_listed().await },
            relist,
            move |epoch| {
                let replicator = replicator.clone();
                async move { replicator.full_sync(epoch).await }
            },
            cancel,
        )
    }

    /// Mirror the watch's changes until `cancel` or its end: each changed
    /// object through `push`; a relist, or the policies' demand turning the
    /// type on or off, as a whole-type write (`relist`).
    async fn follow(
        &self,
        watch: &mut Subscription,
        mut demand: Option<tokio::sync::watch::Receiver<DataReads>>,
        push: impl Fn(ObjectKey),
        relist: &Notify,
        cancel: &CancellationToken,
    ) {
        let mut wanted = self.wanted();
        loop {
            let demand_changed = async {
                match &mut demand {
                    Some(demand) => demand.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let change = tokio::select! {
                c = watch.changes.recv() => c,
                true = demand_changed => {
                    if self.wanted() != wanted {
                        wanted = !wanted;
                        // Written or removed as a whole.
                        relist.notify_one();
                    }
                    continue;
                }
                _ = cancel.cancelled() => break,
            };
            let Some(change) = change else {
                break;
            };
            self.on_change(change, &push, relist);
        }
    }

    fn on_change(&self, change: WatchChange, push: impl Fn(ObjectKey), relist: &Notify) {
        match change {
            WatchChange::Applied {
                key,
                json,
                previous,
                ..
            } => {
                self.note(&key, previous.as_deref(), Some(&json));
                push(key);
            }
            WatchChange::Deleted { key, previous } => {
                self.note(&key, previous.as_deref(), None);
                push(key);
            }
            WatchChange::ListDone { first: false } => {
                self.note_listed();
                tracing::info!(resource = %self.label(), "relisted; rewriting the whole type");
                relist.notify_one();
            }
            WatchChange::ListDone { first: true } => self.note_listed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gvr::Gvr;

    #[test]
    fn ignored_namespaces_become_a_field_selector() {
        assert_eq!(ignore_selector(&BTreeSet::new()), None);
        let ignore: BTreeSet<String> = ["kube-system".to_owned(), "kube-public".to_owned()].into();
        assert_eq!(
            ignore_selector(&ignore).unwrap(),
            "metadata.namespace!=kube-public,metadata.namespace!=kube-system"
        );
    }

    #[test]
    fn component_names() {
        let spec = ReplicateSpec {
            gvr: Gvr::new("apps", "v1", "replicasets"),
            scope: ReplicaScope::Namespaced,
        };
        assert_eq!(component_name(&spec), "replicate:apps/v1/replicasets");
    }
}
