//! Starting the reconciler: the ownership keys, the watches of its targets
//! (each feeding the changes that make an object due), the stores it reads
//! beside them, and who it is to the API server.

use std::sync::Arc;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Client;
use kube::api::{Api, PostParams};
use policy_client::ownership_keys::{OwnershipKeys, SharedKeys};
use policy_client::ownership_secret::KeySecret;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::bindings::{self, PropagationPolicies};
use super::changes::{Changes, follow};
use super::context::ReconcilerContext;
use super::karmada::binding::{Binding, Mode};
use super::placements::{self, OcmState, OcmWatches};
use super::target::{Kind, Target};
use super::workloads;
use crate::config::writers::{KarmadaSettings, OwnershipKeySource};
use crate::error::SyncError;
use crate::replication::watched::{Subscription, WatchedType};
use crate::scope::parse_label_selector;

/// The ownership keys of the reconciler's source; `None` when stopping first.
pub(crate) async fn ownership_keys(
    ctx: &ReconcilerContext,
    cancel: &CancellationToken,
) -> Result<Option<SharedKeys>, SyncError> {
    Ok(Some(match &ctx.ownership_keys {
        OwnershipKeySource::Secret { namespace, name } => {
            let secret = KeySecret {
                api: Api::namespaced(ctx.client.clone(), namespace),
                namespace: namespace.clone(),
                name: name.clone(),
                create: false,
            };
            // Waits until the webhook created the key; a shutdown meanwhile
            // must not wait with it.
            tokio::select! {
                keys = secret.keys() => keys,
                _ = cancel.cancelled() => return Ok(None),
            }
        }
        OwnershipKeySource::Fixed(keys) => SharedKeys::new(keys.clone()),
        OwnershipKeySource::Ephemeral => {
            tracing::warn!(
                "no --ownership-secret or --ownership-key-file: the ownership records this remediator writes verify nowhere else; give it the webhook's keys"
            );
            SharedKeys::new(
                OwnershipKeys::ephemeral().map_err(|e| SyncError::Config(e.to_string()))?,
            )
        }
    }))
}

/// What decides a target object's placement, as a fingerprint.
struct Fingerprinter {
    kind: Kind,
    selector: Option<kube::core::Selector>,
    karmada: KarmadaSettings,
    keys: SharedKeys,
}

impl Fingerprinter {
    /// `None` for an object the reconciler does not keep placed.
    fn print(&self, object: &Value) -> Option<u64> {
        match self.kind {
            Kind::Workloads { .. } => workloads::selected(self.selector.as_ref(), object)
                .then(|| workloads::developer_fingerprint(object, &self.keys.current())),
            Kind::Bindings => {
                let binding = <Binding as serde::Deserialize>::deserialize(object).ok()?;
                match binding.mode(&self.karmada)? {
                    Mode::Schedule => Some(bindings::binding_fingerprint(object)),
                    Mode::Guard => Some(bindings::guarded_fingerprint(object)),
                }
            }
            // One scheduler name for both (`--scheduler-name`).
            Kind::Placements => {
                placements::placement_fingerprint(object, &self.karmada.scheduler_name)
            }
        }
    }
}

/// Feed a target's watch into `changes`: an object is due when what decides
/// its placement changed. The first list is covered by the first pass;
/// later lists (after a disconnect) may carry objects changed meanwhile.
fn watch_changes(
    watch: Subscription,
    i: usize,
    fingerprinter: Fingerprinter,
    changes: Arc<Changes>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    follow(watch, cancel, move |key, object, news| {
        let key = (i, key.clone());
        match object.and_then(|object| fingerprinter.print(object)) {
            Some(print) => changes.observe(key, print, news),
            None => changes.forget(&key),
        }
    })
}

/// The targets, each watched, and the tasks following their changes.
pub(crate) struct Watched {
    pub(crate) targets: Vec<Target>,
    pub(crate) watchers: Vec<JoinHandle<()>>,
}

/// Watch each target of `kinds`, its changes feeding `changes`; `None` when
/// stopping first.
pub(crate) async fn watch_targets(
    ctx: &ReconcilerContext,
    kinds: impl Iterator<Item = (Kind, Subscription)>,
    keys: &SharedKeys,
    changes: &Arc<Changes>,
    cancel: &CancellationToken,
) -> Result<Option<Watched>, SyncError> {
    let mut watched = Watched {
        targets: Vec::new(),
        watchers: Vec::new(),
    };
    for (kind, mut watch) in kinds {
        let found = tokio::select! {
            found = watch.found() => found,
            _ = cancel.cancelled() => None,
        };
        let Some(found) = found else {
            return Ok(None);
        };
        let target = target(ctx, kind, found)?;
        if kind == (Kind::Workloads { act: false }) {
            // Templates of bindings only, read from the store: their edits
            // reach the scheduler as changes of the bindings' spec, and a
            // pass for each would evaluate nothing.
            drop(watch.changes);
        } else {
            let fingerprinter = Fingerprinter {
                kind,
                selector: target.selector.clone(),
                karmada: ctx.karmada.clone(),
                keys: keys.clone(),
            };
            watched.watchers.push(watch_changes(
                watch,
                watched.targets.len(),
                fingerprinter,
                changes.clone(),
                cancel.clone(),
            ));
        }
        watched.targets.push(target);
    }
    Ok(Some(watched))
}

/// A target of `kind` over the watched type `watched`.
fn target(
    ctx: &ReconcilerContext,
    kind: Kind,
    watched: Arc<WatchedType>,
) -> Result<Target, SyncError> {
    let selector = match (&ctx.scope.object_selector, kind) {
        (Some(own), Kind::Workloads { .. }) if watched.labels.as_ref() != Some(own) => {
            Some(parse_label_selector(own).map_err(SyncError::Config)?)
        }
        _ => None,
    };
    Ok(Target {
        kind,
        api: Api::all_with(ctx.client.clone(), &watched.resource),
        watched,
        selector,
    })
}

/// Wait until every target's watch has listed; `false` when stopping first.
pub(crate) async fn listed(targets: &[Target], cancel: &CancellationToken) -> bool {
    for target in targets {
        tokio::select! {
            _ = target.watched.objects.wait_until_listed() => {}
            _ = cancel.cancelled() => return false,
        }
    }
    true
}

/// The stores the bindings' reconciler reads: Karmada's Clusters, when
/// replicated, and the PropagationPolicies, for the guardrail; `None` when
/// stopping first.
pub(crate) async fn binding_stores(
    karmada_clusters: Option<Subscription>,
    propagation_policies: Option<[Subscription; 2]>,
    cancel: &CancellationToken,
) -> Option<(Option<Arc<WatchedType>>, Option<PropagationPolicies>)> {
    let karmada_clusters = match karmada_clusters {
        Some(watch) => Some(store_only(watch, cancel).await?),
        None => None,
    };
    let propagation_policies = match propagation_policies {
        Some([namespaced, cluster]) => Some(PropagationPolicies {
            namespaced: store_only(namespaced, cancel).await?,
            cluster: store_only(cluster, cancel).await?,
        }),
        None => None,
    };
    Some((karmada_clusters, propagation_policies))
}

/// A watched type whose store alone is read (its changes reach a replicator,
/// or nobody); `None` when stopping first.
pub(crate) async fn store_only(
    mut watch: Subscription,
    cancel: &CancellationToken,
) -> Option<Arc<WatchedType>> {
    let found = tokio::select! {
        found = watch.found() => found,
        _ = cancel.cancelled() => None,
    };
    drop(watch.changes);
    found
}

/// The identity of this process as the API server sees it (a
/// SelfSubjectReview), or nothing when it cannot be asked.
pub(crate) async fn own_user_info(client: &Client) -> Value {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await;
    match review.map(|r| r.status.and_then(|s| s.user_info)) {
        Ok(Some(user)) => serde_json::to_value(user).unwrap_or_default(),
        Ok(None) => Value::Object(Default::default()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot learn the remediator's own identity; policies see an empty userInfo during remediation");
            Value::Object(Default::default())
        }
    }
}

/// The OCM decider's watches, started over the Placements' target; `None`
/// when stopping first.
pub(crate) async fn ocm(
    others: OcmWatches,
    targets: &[Target],
    changes: &Arc<Changes>,
    ctx: &ReconcilerContext,
    cancel: &CancellationToken,
) -> Option<(OcmState, Vec<JoinHandle<()>>)> {
    let placements = targets
        .iter()
        .position(|t| t.kind == Kind::Placements)
        .expect("the Placements are a target when the decider is on");
    placements::start(
        others,
        placements,
        changes.clone(),
        ctx.trigger.clone(),
        cancel,
    )
    .await
}
