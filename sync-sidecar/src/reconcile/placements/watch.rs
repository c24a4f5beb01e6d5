//! The decider's watches of OCM's types, and what they make due. Besides the
//! Placements' own changes (spec, labels, annotations), a Placement is due
//! when its ManifestWorkReplicaSets change or someone else changes its
//! PlacementDecisions; a change of the ManagedClusters, their sets or
//! bindings is a change of the world, like the replicated data the policies
//! read (a pass over everything, weighed by the guard). The stores they fill
//! are what deciding reads ([`OcmState`]).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cause::{Cause, Trigger};
use crate::gvr::Gvr;
use crate::reconcile::changes::{Changes, ItemKey, fingerprint, follow};
use crate::reconcile::ocm::clusters::cluster_fingerprint;
use crate::reconcile::ocm::decisions::PLACEMENT_LABEL;
use crate::reconcile::ocm::placement::Placement;
use crate::reconcile::ocm::sig;
use crate::replication::document::ObjectKey;
use crate::replication::watched::{Need, Subscription, TypeWatches, WatchedType};

/// OCM's types the decider watches.
const PLACEMENTS: (&str, &str, &str) = (
    "cluster.open-cluster-management.io",
    "v1beta1",
    "placements",
);
const DECISIONS: (&str, &str, &str) = (
    "cluster.open-cluster-management.io",
    "v1beta1",
    "placementdecisions",
);
const CLUSTERS: (&str, &str, &str) = (
    "cluster.open-cluster-management.io",
    "v1",
    "managedclusters",
);
const CLUSTER_SETS: (&str, &str, &str) = (
    "cluster.open-cluster-management.io",
    "v1beta2",
    "managedclustersets",
);
const CLUSTER_SET_BINDINGS: (&str, &str, &str) = (
    "cluster.open-cluster-management.io",
    "v1beta2",
    "managedclustersetbindings",
);
const REPLICA_SETS: (&str, &str, &str) = (
    "work.open-cluster-management.io",
    "v1alpha1",
    "manifestworkreplicasets",
);

fn gvr((group, version, resource): (&str, &str, &str)) -> Gvr {
    Gvr::new(group, version, resource)
}

/// The watches of the decider: the Placements (its target) and what
/// deciding them reads.
pub(crate) struct OcmSubscriptions {
    pub(crate) placements: Subscription,
    pub(crate) others: OcmWatches,
}

pub(crate) struct OcmWatches {
    decisions: Subscription,
    clusters: Subscription,
    sets: Subscription,
    bindings: Subscription,
    replica_sets: Subscription,
    /// The SIG-Multicluster PlacementDecisions, when they are published.
    sig: Option<Subscription>,
}

impl OcmSubscriptions {
    /// Subscribe to every type the decider reads; `sig`: it publishes
    /// SIG-Multicluster PlacementDecisions too.
    pub(crate) fn subscribe(watches: &TypeWatches, sig: bool) -> OcmSubscriptions {
        let listed = Need {
            listed: true,
            ..Need::default()
        };
        let sub = |t| watches.subscribe(&gvr(t), listed.clone());
        OcmSubscriptions {
            placements: sub(PLACEMENTS),
            others: OcmWatches {
                decisions: sub(DECISIONS),
                clusters: sub(CLUSTERS),
                sets: sub(CLUSTER_SETS),
                bindings: sub(CLUSTER_SET_BINDINGS),
                replica_sets: sub(REPLICA_SETS),
                sig: sig.then(|| sub(sig::TYPE)),
            },
        }
    }
}

/// What deciding reads besides the Placements, and what the decider wrote.
pub(crate) struct OcmState {
    pub(super) decisions: Arc<WatchedType>,
    pub(super) clusters: Arc<WatchedType>,
    pub(super) sets: Arc<WatchedType>,
    pub(super) bindings: Arc<WatchedType>,
    pub(super) replica_sets: Arc<WatchedType>,
    pub(super) sig: Option<Arc<WatchedType>>,
    /// The fingerprints PlacementDecisions will show once the decider's
    /// writes are stored: the watch brings them as no change.
    pub(super) written: Arc<Mutex<HashMap<ObjectKey, Vec<u64>>>>,
    /// Placements to decide again when a toleration runs out, and when.
    pub(super) rechecks: Mutex<HashMap<ItemKey, Timestamp>>,
    pub(super) cancel: CancellationToken,
}

/// What decides a Placement's placement, as a fingerprint (`None` when it is
/// not ours): its spec, labels, annotations and deletion, not its status.
pub(crate) fn placement_fingerprint(object: &Value, scheduler_name: &str) -> Option<u64> {
    let placement = <Placement as serde::Deserialize>::deserialize(object).ok()?;
    if placement.skip(scheduler_name).is_some() {
        return None;
    }
    Some(fingerprint(&json!([
        object.get("spec"),
        object.pointer("/metadata/labels"),
        object.pointer("/metadata/annotations"),
        object.pointer("/metadata/deletionTimestamp").is_some(),
    ])))
}

/// A fingerprint of a PlacementDecision as the decider writes it.
pub(super) fn decision_fingerprint(labels: &Value, decisions: &Value) -> u64 {
    fingerprint(&json!([labels, decisions]))
}

/// The owning Placement of a PlacementDecision (its namespace and label).
fn owner(key: &ObjectKey, object: &Value) -> Option<ObjectKey> {
    let name = object
        .pointer(&format!(
            "/metadata/labels/{}",
            PLACEMENT_LABEL.replace('/', "~1")
        ))?
        .as_str()?;
    Some(ObjectKey::new(key.namespace.as_deref(), name))
}

/// The Placements (`namespace`, names) a ManifestWorkReplicaSet delivers to,
/// and a fingerprint of what it delivers.
pub(super) fn replica_set_refs(key: &ObjectKey, object: &Value) -> (Vec<ObjectKey>, u64) {
    let refs = object
        .pointer("/spec/placementRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("name")?.as_str())
        .map(|name| ObjectKey::new(key.namespace.as_deref(), name))
        .collect();
    let print = fingerprint(&json!([
        object.pointer("/spec/placementRefs"),
        object.pointer("/spec/manifestWorkTemplate/workload/manifests"),
    ]));
    (refs, print)
}

/// Start the decider's watchers: `placements` is the index of the
/// Placements' target. `None` when stopping first.
pub(crate) async fn start(
    watches: OcmWatches,
    placements: usize,
    changes: Arc<Changes>,
    trigger: Arc<Trigger>,
    cancel: &CancellationToken,
) -> Option<(OcmState, Vec<tokio::task::JoinHandle<()>>)> {
    let OcmWatches {
        mut decisions,
        mut clusters,
        mut sets,
        mut bindings,
        mut replica_sets,
        sig,
    } = watches;
    let found = listed(
        [
            &mut decisions,
            &mut clusters,
            &mut sets,
            &mut bindings,
            &mut replica_sets,
        ],
        cancel,
    )
    .await?;
    let sig = sig_store(sig, cancel).await?;
    let written: Arc<Mutex<HashMap<ObjectKey, Vec<u64>>>> = Arc::default();
    let mut tasks = Vec::new();
    // Someone else's change of a decision: its Placement is due.
    tasks.push(follow_decisions(
        decisions,
        placements,
        changes.clone(),
        written.clone(),
        cancel,
    ));
    // A change of what a ManifestWorkReplicaSet delivers: its Placements
    // (before and after) are due.
    tasks.push(follow_replica_sets(
        replica_sets,
        placements,
        changes.clone(),
        cancel,
    ));
    // A change of the clusters, sets or bindings: a pass over everything.
    for (sub, print) in [
        (clusters, cluster_fingerprint as fn(&Value) -> Value),
        (sets, spec_fingerprint),
        (bindings, spec_fingerprint),
    ] {
        tasks.push(follow_inventory(sub, print, trigger.clone(), cancel));
    }
    let mut found = found.into_iter();
    let mut next = || found.next().expect("five watched types");
    let state = OcmState {
        decisions: next(),
        clusters: next(),
        sets: next(),
        bindings: next(),
        replica_sets: next(),
        sig,
        written,
        rechecks: Mutex::default(),
        cancel: cancel.clone(),
    };
    Some((state, tasks))
}

/// The stores of `subs`, each once found and listed, in order. `None` when
/// stopping first.
async fn listed(
    subs: [&mut Subscription; 5],
    cancel: &CancellationToken,
) -> Option<Vec<Arc<WatchedType>>> {
    let mut found = Vec::new();
    for sub in subs {
        let watched = tokio::select! {
            w = sub.found() => w?,
            _ = cancel.cancelled() => return None,
        };
        tokio::select! {
            _ = watched.objects.wait_until_listed() => {}
            _ = cancel.cancelled() => return None,
        }
        found.push(watched);
    }
    Some(found)
}

/// The store of the SIG-Multicluster PlacementDecisions, when they are
/// published. `None` when stopping first.
async fn sig_store(
    sig: Option<Subscription>,
    cancel: &CancellationToken,
) -> Option<Option<Arc<WatchedType>>> {
    let Some(mut sub) = sig else {
        return Some(None);
    };
    let watched = tokio::select! {
        w = sub.found() => w?,
        _ = cancel.cancelled() => return None,
    };
    // Only the store is read.
    drop(sub.changes);
    Some(Some(watched))
}

/// Follow the PlacementDecisions: a change someone else made (not one of
/// the decider's `written` prints) or a deletion makes its Placement due.
fn follow_decisions(
    decisions: Subscription,
    placements: usize,
    changes: Arc<Changes>,
    written: Arc<Mutex<HashMap<ObjectKey, Vec<u64>>>>,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    // The Placement of each decision, for its deletion.
    let owners: Mutex<HashMap<ObjectKey, ObjectKey>> = Mutex::default();
    follow(decisions, cancel.clone(), move |key, object, announce| {
        let mut owners = owners.lock();
        let Some(object) = object else {
            // Deleted (by the garbage collector with its Placement,
            // by the decider, or by someone): decided again.
            if let Some(placement) = owners.remove(key) {
                changes.due((placements, placement));
            }
            return;
        };
        let print = decision_fingerprint(
            object.pointer("/metadata/labels").unwrap_or(&Value::Null),
            object.pointer("/status/decisions").unwrap_or(&Value::Null),
        );
        let ours = take_written(&mut written.lock(), key, print);
        let Some(placement) = owner(key, object) else {
            return;
        };
        owners.insert(key.clone(), placement.clone());
        if announce && !ours {
            changes.due((placements, placement));
        }
    })
}

/// Whether `print` is one the decider wrote to `key` (and now seen: taken).
fn take_written(written: &mut HashMap<ObjectKey, Vec<u64>>, key: &ObjectKey, print: u64) -> bool {
    let Some(prints) = written.get_mut(key) else {
        return false;
    };
    let Some(at) = prints.iter().position(|p| *p == print) else {
        return false;
    };
    prints.remove(at);
    if prints.is_empty() {
        written.remove(key);
    }
    true
}

/// Follow the ManifestWorkReplicaSets: a change of what one delivers makes
/// its Placements (before and after) due.
fn follow_replica_sets(
    replica_sets: Subscription,
    placements: usize,
    changes: Arc<Changes>,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let seen: Mutex<HashMap<ObjectKey, (Vec<ObjectKey>, u64)>> = Mutex::default();
    follow(
        replica_sets,
        cancel.clone(),
        move |key, object, announce| {
            let mut seen = seen.lock();
            let before = seen.remove(key);
            let after = object.map(|o| replica_set_refs(key, o));
            if announce && before.as_ref().map(|b| b.1) != after.as_ref().map(|a| a.1) {
                for placement in before.iter().chain(after.iter()).flat_map(|(r, _)| r) {
                    changes.due((placements, placement.clone()));
                }
            }
            if let Some(after) = after {
                seen.insert(key.clone(), after);
            }
        },
    )
}

/// Follow the clusters, sets or bindings: a change of `print` fires a pass
/// over everything.
fn follow_inventory(
    sub: Subscription,
    print: fn(&Value) -> Value,
    trigger: Arc<Trigger>,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let seen: Mutex<HashMap<ObjectKey, u64>> = Mutex::default();
    follow(sub, cancel.clone(), move |key, object, announce| {
        let now = object.map(|o| fingerprint(&print(o)));
        let mut seen = seen.lock();
        let before = match now {
            Some(now) => seen.insert(key.clone(), now),
            None => seen.remove(key),
        };
        if announce && before != now {
            trigger.fire(Cause::Status);
        }
    })
}

/// What selection reads of a set or a binding: its spec and labels, and
/// whether it is there.
fn spec_fingerprint(object: &Value) -> Value {
    json!([object.get("spec"), object.pointer("/metadata/labels")])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_of_a_placement_sees_its_spec_and_opt_in_not_its_status() {
        let raw = json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
            "metadata": {"name": "web", "namespace": "shop", "annotations": {
                "cluster.open-cluster-management.io/experimental-scheduling-disable": "true",
                "placement-policy.io/scheduler-name": "placement-policy"}},
            "spec": {"numberOfClusters": 1},
        });
        let print = placement_fingerprint(&raw, "placement-policy").expect("ours");
        let mut status = raw.clone();
        status["status"] = json!({"numberOfSelectedClusters": 1});
        assert_eq!(
            placement_fingerprint(&status, "placement-policy"),
            Some(print)
        );
        let mut more = raw.clone();
        more["spec"]["numberOfClusters"] = json!(2);
        assert_ne!(
            placement_fingerprint(&more, "placement-policy"),
            Some(print)
        );
        assert_eq!(placement_fingerprint(&raw, "another"), None);
    }

    #[test]
    fn a_replica_set_names_its_placements_and_what_it_delivers() {
        let key = ObjectKey::new(Some("shop"), "web");
        let object = json!({"spec": {"placementRefs": [{"name": "eu"}, {"name": "us"}],
            "manifestWorkTemplate": {"workload": {"manifests": [{"kind": "Deployment"}]}}}});
        let (refs, print) = replica_set_refs(&key, &object);
        assert_eq!(
            refs,
            [
                ObjectKey::new(Some("shop"), "eu"),
                ObjectKey::new(Some("shop"), "us")
            ]
        );
        let mut status = object.clone();
        status["status"] = json!({"summary": {"total": 2}});
        assert_eq!(replica_set_refs(&key, &status).1, print);
    }

    #[test]
    fn a_decision_names_its_placement_by_label() {
        let key = ObjectKey::new(Some("shop"), "web-decision-1");
        let object = json!({"metadata": {"labels": {PLACEMENT_LABEL: "web"}}});
        assert_eq!(
            owner(&key, &object),
            Some(ObjectKey::new(Some("shop"), "web"))
        );
    }
}
