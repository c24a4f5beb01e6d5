//! Replication of Kubernetes objects into the engine (one task per type).
//!
//! Each type is found by discovery and list/watched through the dynamic API into
//! a compact store of the JSON the engine receives ([`TypeObjects`], with
//! `managedFields` stripped). The first full list, every
//! relist (after `410 Gone`) and every engine restart write the whole type as one
//! document, so deletions missed while disconnected disappear too; in between,
//! adds, updates and deletes are mirrored one object at a time through a
//! [`KeyedQueue`].

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use policy_client::PolicyEngine;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::component::{Gate, discover_until_found, full_sync_loop};
use crate::config::{ReplicaScope, ReplicateSpec};
use crate::document::{ObjectKey, object_json, object_path, type_path};
use crate::error::SyncError;
use crate::metrics::Metrics;
use crate::objects::TypeObjects;
use crate::queue::{Backoff, KeyedQueue};
use crate::rego_refs::PolicyReads;
use crate::state::SyncState;

/// What every replicated type shares.
#[derive(Clone)]
pub(crate) struct ReplicatorContext {
    pub(crate) client: Client,
    pub(crate) engine: Arc<dyn PolicyEngine>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) state: Arc<SyncState>,
    pub(crate) prefix: String,
    pub(crate) ignore_namespaces: BTreeSet<String>,
    pub(crate) permits: Arc<Semaphore>,
    /// Poked after a successful write of a type the policies read
    /// (remediation trigger).
    pub(crate) changed: Arc<Notify>,
    pub(crate) reads: PolicyReads,
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
    resource: ApiResource,
    namespaced: bool,
    objects: TypeObjects,
    gate: Gate,
    ctx: ReplicatorContext,
}

impl TypeReplicator {
    fn label(&self) -> &str {
        &self.resource.plural
    }

    fn ignored(&self, key: &ObjectKey) -> bool {
        self.namespaced
            && key
                .namespace
                .as_ref()
                .is_some_and(|ns| self.ctx.ignore_namespaces.contains(ns))
    }

    /// Ask for remediation, unless no policy can see this type: status
    /// heartbeats of an unread type must not re-query every workload.
    fn poke(&self) {
        if self.ctx.reads.includes(&self.resource.plural) {
            self.ctx.changed.notify_one();
        }
    }

    async fn full_sync(&self, epoch: u64) -> Result<(), SyncError> {
        let _full = self.gate.full().await;
        let (document, count) = self.objects.document(self.namespaced, |k| !self.ignored(k));
        let path = type_path(&self.ctx.prefix, &self.resource.plural);
        match self.ctx.engine.put_data_encoded(&path, document).await {
            Ok(()) => {
                self.ctx.metrics.write_ok(self.label(), "put_document");
                self.ctx.metrics.set_replicated(self.label(), count);
                self.gate.set_loaded(epoch);
                self.poke();
                tracing::info!(resource = %self.label(), objects = count, %path, "replicated the whole type");
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
        if self.ignored(&key) {
            return Ok(());
        }
        let path = object_path(
            &self.ctx.prefix,
            &self.resource.plural,
            &key,
            self.namespaced,
        );
        let (op, result) = match self.objects.get(&key) {
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
                    .set_replicated(self.label(), self.objects.len());
                self.poke();
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

/// Replicate one type until `cancel`. Returns an error only for a configuration
/// mistake (a scope that contradicts the flag).
pub(crate) async fn run_type(
    ctx: ReplicatorContext,
    spec: ReplicateSpec,
    cancel: CancellationToken,
) -> Result<(), SyncError> {
    let name = component_name(&spec);
    let Some((resource, namespaced)) =
        discover_until_found(&ctx.client, &spec.gvr, Some(spec.scope), &cancel).await?
    else {
        return Ok(());
    };
    debug_assert_eq!(namespaced, spec.scope == ReplicaScope::Namespaced);
    let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &resource);
    let mut config = watcher::Config::default();
    if namespaced && let Some(selector) = ignore_selector(&ctx.ignore_namespaces) {
        config = config.fields(&selector);
    }
    let label = resource.plural.clone();
    let metrics = ctx.metrics.clone();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None);

    let replicator = Arc::new(TypeReplicator {
        resource,
        namespaced,
        objects: TypeObjects::default(),
        gate: Gate::default(),
        ctx: ctx.clone(),
    });
    let queue = {
        let replicator = replicator.clone();
        KeyedQueue::new(
            name.clone(),
            move |key: ObjectKey| {
                let replicator = replicator.clone();
                async move { replicator.sync_key(key).await }
            },
            ctx.permits.clone(),
            Backoff::default(),
            cancel.clone(),
        )
    };
    let relist = Arc::new(Notify::new());
    let full = {
        let replicator = replicator.clone();
        let listed = replicator.clone();
        tokio::spawn(full_sync_loop(
            name.clone(),
            ctx.state.clone(),
            async move { listed.objects.wait_until_listed().await },
            relist.clone(),
            move |epoch| {
                let replicator = replicator.clone();
                async move { replicator.full_sync(epoch).await }
            },
            cancel.clone(),
        ))
    };

    let mut stream = std::pin::pin!(stream);
    let mut listed_once = false;
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = cancel.cancelled() => break,
        };
        let objects = &replicator.objects;
        match event {
            Some(Ok(watcher::Event::Apply(object))) => {
                if let Some(key) = ObjectKey::of(&object) {
                    objects.apply(
                        key.clone(),
                        object_json(&object, &replicator.resource).into(),
                    );
                    queue.push(key);
                }
            }
            Some(Ok(watcher::Event::Delete(object))) => {
                if let Some(key) = ObjectKey::of(&object) {
                    objects.delete(&key);
                    queue.push(key);
                }
            }
            Some(Ok(watcher::Event::Init)) => objects.list_started(),
            Some(Ok(watcher::Event::InitApply(object))) => {
                if let Some(key) = ObjectKey::of(&object) {
                    objects.listed(key, object_json(&object, &replicator.resource).into());
                }
            }
            Some(Ok(watcher::Event::InitDone)) => {
                objects.list_done();
                if listed_once {
                    tracing::info!(resource = %label, "relisted; rewriting the whole type");
                    relist.notify_one();
                }
                listed_once = true;
            }
            Some(Err(e)) => {
                metrics.watch_error(&label);
                tracing::warn!(resource = %label, error = %e, "watch error; the watch recovers by itself");
            }
            None => break,
        }
    }
    let _ = full.await;
    Ok(())
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
