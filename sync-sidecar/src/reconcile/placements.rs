//! Open Cluster Management Placements as a target of the reconciler: a
//! Placement that opts out of OCM's scheduler and names ours is decided by
//! the policy over the clusters it selects, with the answers for the
//! workloads its ManifestWorkReplicaSets deliver and for the Placement itself
//! (each the webhook's answer for that object, plus `input._placement`), and
//! gets exactly the PlacementDecisions and status OCM's scheduler writes
//! ([`crate::reconcile::ocm`]).
//!
//! Besides the Placements' own changes (spec, labels, annotations), a
//! Placement is due when its ManifestWorkReplicaSets change or someone else
//! changes its PlacementDecisions; a change of the ManagedClusters, their
//! sets or bindings is a change of the world, like the replicated data the
//! policies read (a pass over everything, weighed by the guard).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::events::EventType;
use policy_client::{PLACEMENT_INPUT_KEY, RequestMeta, policy_input};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::changes::{Changes, ItemKey, fingerprint};
use super::events::reference;
use super::step::Step;
use super::target::{Item, Kind};
use super::{FIELD_MANAGER, Reconciler, now_rfc3339};
use crate::cause::{Cause, Trigger};
use crate::error::SyncError;
use crate::gvr::Gvr;
use crate::reconcile::ocm::clusters::{
    Candidates, ClusterSet, Inventory, ManagedCluster, candidates, cluster_fingerprint,
};
use crate::reconcile::ocm::decisions::{
    Existing, Outcome, PLACEMENT_LABEL, PlacementWrite, choose, decided, plan,
};
use crate::reconcile::ocm::placement::Placement;
use crate::reconcile::ocm::policy::{Allowed, Subject, combine, read};
use crate::reconcile::ocm::sig::{self, Slice, SliceWrite};
use crate::replication::document::ObjectKey;
use crate::replication::watched::{Need, Subscription, TypeWatches, WatchChange, WatchedType};

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
    decisions: Arc<WatchedType>,
    clusters: Arc<WatchedType>,
    sets: Arc<WatchedType>,
    bindings: Arc<WatchedType>,
    replica_sets: Arc<WatchedType>,
    sig: Option<Arc<WatchedType>>,
    /// The fingerprints PlacementDecisions will show once the decider's
    /// writes are stored: the watch brings them as no change.
    written: Arc<Mutex<HashMap<ObjectKey, Vec<u64>>>>,
    /// Placements to decide again when a toleration runs out, and when.
    rechecks: Mutex<HashMap<ItemKey, Timestamp>>,
    cancel: CancellationToken,
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
fn decision_fingerprint(labels: &Value, decisions: &Value) -> u64 {
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
fn replica_set_refs(key: &ObjectKey, object: &Value) -> (Vec<ObjectKey>, u64) {
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
    let mut found = Vec::new();
    for sub in [
        &mut decisions,
        &mut clusters,
        &mut sets,
        &mut bindings,
        &mut replica_sets,
    ] {
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
    let sig = match sig {
        Some(mut sub) => {
            let watched = tokio::select! {
                w = sub.found() => w?,
                _ = cancel.cancelled() => return None,
            };
            // Only the store is read.
            drop(sub.changes);
            Some(watched)
        }
        None => None,
    };
    let written: Arc<Mutex<HashMap<ObjectKey, Vec<u64>>>> = Arc::default();
    let mut tasks = Vec::new();
    // Someone else's change of a decision: its Placement is due.
    {
        let (changes, written) = (changes.clone(), written.clone());
        // The Placement of each decision, for its deletion.
        let owners: Mutex<HashMap<ObjectKey, ObjectKey>> = Mutex::default();
        tasks.push(follow(
            decisions,
            cancel.clone(),
            move |key, object, announce| {
                let mut owners = owners.lock().unwrap_or_else(|e| e.into_inner());
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
                let ours = {
                    let mut written = written.lock().unwrap_or_else(|e| e.into_inner());
                    match written.get_mut(key) {
                        Some(prints) => match prints.iter().position(|p| *p == print) {
                            Some(at) => {
                                prints.remove(at);
                                if prints.is_empty() {
                                    written.remove(key);
                                }
                                true
                            }
                            None => false,
                        },
                        None => false,
                    }
                };
                let Some(placement) = owner(key, object) else {
                    return;
                };
                owners.insert(key.clone(), placement.clone());
                if announce && !ours {
                    changes.due((placements, placement));
                }
            },
        ));
    }
    // A change of what a ManifestWorkReplicaSet delivers: its Placements
    // (before and after) are due.
    {
        let changes = changes.clone();
        let seen: Mutex<HashMap<ObjectKey, (Vec<ObjectKey>, u64)>> = Mutex::default();
        tasks.push(follow(
            replica_sets,
            cancel.clone(),
            move |key, object, announce| {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
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
        ));
    }
    // A change of the clusters, sets or bindings: a pass over everything.
    for (sub, print) in [
        (clusters, cluster_fingerprint as fn(&Value) -> Value),
        (sets, spec_fingerprint),
        (bindings, spec_fingerprint),
    ] {
        let trigger = trigger.clone();
        let seen: Mutex<HashMap<ObjectKey, u64>> = Mutex::default();
        tasks.push(follow(sub, cancel.clone(), move |key, object, announce| {
            let now = object.map(|o| fingerprint(&print(o)));
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            let before = match now {
                Some(now) => seen.insert(key.clone(), now),
                None => seen.remove(key),
            };
            if announce && before != now {
                trigger.fire(Cause::Status);
            }
        }));
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

/// What selection reads of a set or a binding: its spec and labels, and
/// whether it is there.
fn spec_fingerprint(object: &Value) -> Value {
    json!([object.get("spec"), object.pointer("/metadata/labels")])
}

/// Follow a watch, handing each object (or `None`, deleted) to `seen`, with
/// whether it is news (not part of the first list, which the first pass
/// covers).
fn follow(
    mut watch: Subscription,
    cancel: CancellationToken,
    seen: impl Fn(&ObjectKey, Option<&Value>, bool) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut listed_once = false;
        loop {
            let change = tokio::select! {
                c = watch.changes.recv() => c,
                _ = cancel.cancelled() => break,
            };
            match change {
                Some(WatchChange::Applied {
                    key, json, listed, ..
                }) => {
                    let Ok(object) = serde_json::from_slice::<Value>(&json) else {
                        continue;
                    };
                    seen(&key, Some(&object), !listed || listed_once);
                }
                Some(WatchChange::Deleted { key, .. }) => seen(&key, None, true),
                Some(WatchChange::ListDone { .. }) => listed_once = true,
                None => break,
            }
        }
    })
}

/// One workload a Placement's ManifestWorkReplicaSets deliver.
#[derive(Debug, Clone)]
pub(crate) struct Workload {
    pub(crate) subject: Subject,
    pub(crate) manifest: Value,
}

/// A Placement of a pass, with what deciding it reads.
pub(crate) struct PlacementItem {
    pub(crate) key: ObjectKey,
    pub(crate) raw: Value,
    pub(crate) placement: Placement,
    existing: Vec<Existing>,
    workloads: Vec<Workload>,
    inventory: Arc<Inventory>,
    sig: Vec<Slice>,
}

impl PlacementItem {
    /// Whether it has decided clusters.
    pub(crate) fn is_placed(&self) -> bool {
        !decided(&self.existing).is_empty()
    }
}

/// One Placement's evaluation, before anything is written.
pub(crate) struct PlacementEvaluation {
    pub(crate) i: usize,
    pub(crate) item: Arc<PlacementItem>,
    verdict: Verdict,
}

enum Verdict {
    /// A query failed: retried.
    Failed,
    /// The engine has no decision yet: nothing to write.
    Nothing,
    Planned(Box<Planned>),
}

struct Planned {
    write: PlacementWrite,
    sig: SliceWrite,
    /// The policy reports errors, or the Placement is misconfigured: its
    /// decisions stay as they are.
    failed: bool,
    /// When a toleration runs out.
    recheck: Option<Timestamp>,
}

impl PlacementEvaluation {
    /// Whether this would remove a cluster the Placement has.
    pub(crate) fn replaces_a_placement(&self) -> bool {
        self.item.is_placed() && !self.clusters_taken_out().is_empty()
    }

    /// The clusters the Placement has that this change (with its later
    /// step, when this is the first of two) takes out.
    pub(crate) fn clusters_taken_out(&self) -> BTreeSet<String> {
        match &self.verdict {
            Verdict::Planned(p) => p.write.removes.clone(),
            _ => BTreeSet::new(),
        }
    }

    /// What this moves, for the fingerprint of a held move: the clusters
    /// taken out, the same in both steps of a change that adds first.
    pub(crate) fn moved(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(&self.clusters_taken_out())
    }
}

/// The per-pass view of the hub the Placements of a pass are decided from,
/// indexed by namespace and Placement.
struct Hub {
    decisions: HashMap<ObjectKey, Vec<Existing>>,
    workloads: HashMap<ObjectKey, Vec<Workload>>,
    sig: HashMap<ObjectKey, Vec<Slice>>,
    inventories: HashMap<String, Arc<Inventory>>,
}

impl OcmState {
    /// The hub as the watches hold it, for the Placements of `namespaces`
    /// (every namespace when `None`).
    fn hub(&self, namespaces: Option<&BTreeSet<String>>) -> Hub {
        let admitted = |key: &ObjectKey| {
            namespaces.is_none_or(|n| key.namespace.as_ref().is_some_and(|ns| n.contains(ns)))
        };
        let mut decisions: HashMap<ObjectKey, Vec<Existing>> = HashMap::new();
        for (key, json) in self.decisions.objects.snapshot(admitted) {
            let Ok(existing) = Existing::parse(&json) else {
                continue;
            };
            if let Some(placement) = existing.labels.get(PLACEMENT_LABEL) {
                decisions
                    .entry(ObjectKey::new(key.namespace.as_deref(), placement))
                    .or_default()
                    .push(existing);
            }
        }
        for list in decisions.values_mut() {
            list.sort_by(|a, b| a.name.cmp(&b.name));
        }
        let mut workloads: HashMap<ObjectKey, Vec<Workload>> = HashMap::new();
        for (key, json) in self.replica_sets.objects.snapshot(admitted) {
            let Ok(object) = serde_json::from_slice::<Value>(&json) else {
                continue;
            };
            let (refs, _) = replica_set_refs(&key, &object);
            let delivered = delivered(&object);
            for placement in refs {
                workloads
                    .entry(placement)
                    .or_default()
                    .extend(delivered.iter().cloned());
            }
        }
        let mut sig: HashMap<ObjectKey, Vec<Slice>> = HashMap::new();
        if let Some(store) = &self.sig {
            for (key, json) in store.objects.snapshot(admitted) {
                let Ok(slice) = Slice::parse(&json) else {
                    continue;
                };
                if let Some(placement) = slice.labels.get(sig::DECISION_KEY_LABEL) {
                    sig.entry(ObjectKey::new(key.namespace.as_deref(), placement))
                        .or_default()
                        .push(slice);
                }
            }
        }
        let clusters: Arc<BTreeMap<String, ManagedCluster>> = Arc::new(
            self.clusters
                .objects
                .snapshot(|_| true)
                .into_iter()
                .filter_map(|(_, json)| ManagedCluster::parse(&json).ok())
                .map(|c| (c.name.clone(), c))
                .collect(),
        );
        let sets: Arc<BTreeMap<String, ClusterSet>> = Arc::new(
            self.sets
                .objects
                .snapshot(|_| true)
                .into_iter()
                .filter_map(|(_, json)| ClusterSet::parse(&json).ok())
                .collect(),
        );
        let mut bound: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (key, _) in self.bindings.objects.snapshot(admitted) {
            if let Some(ns) = key.namespace {
                bound.entry(ns).or_default().insert(key.name);
            }
        }
        let inventories = bound
            .into_iter()
            .map(|(ns, bound)| {
                let inventory = Inventory {
                    clusters: clusters.clone(),
                    sets: sets.clone(),
                    bound,
                };
                (ns, Arc::new(inventory))
            })
            .collect();
        Hub {
            decisions,
            workloads,
            sig,
            inventories,
        }
    }
}

/// The workloads a ManifestWorkReplicaSet delivers.
fn delivered(replica_set: &Value) -> Vec<Workload> {
    let manifests = replica_set
        .pointer("/spec/manifestWorkTemplate/workload/manifests")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    manifests
        .into_iter()
        .map(|manifest| Workload {
            subject: Subject {
                name: describe_manifest(&manifest),
            },
            manifest,
        })
        .collect()
}

/// `Deployment shop/web`.
fn describe_manifest(manifest: &Value) -> String {
    let text = |p: &str| manifest.pointer(p).and_then(Value::as_str).unwrap_or("");
    let name = match text("/metadata/namespace") {
        "" => text("/metadata/name").to_owned(),
        ns => format!("{ns}/{}", text("/metadata/name")),
    };
    format!("{} {name}", text("/kind"))
}

/// The resource type of a manifest, as its apiVersion and kind say (the
/// plural guessed as Kubernetes names them: the manifest's type may exist
/// only on the managed clusters).
fn manifest_type(manifest: &Value) -> ApiResource {
    let api_version = manifest
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = manifest.get("kind").and_then(Value::as_str).unwrap_or("");
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

impl Reconciler {
    /// The Placements of `only` (or every one of ours), with what deciding
    /// them reads.
    pub(super) fn placements(&self, only: Option<&BTreeSet<ItemKey>>) -> Vec<Item> {
        let Some(ocm) = &self.ocm else {
            return Vec::new();
        };
        let namespaces: Option<BTreeSet<String>> = only.map(|keys| {
            keys.iter()
                .filter(|(i, _)| {
                    self.targets
                        .get(*i)
                        .is_some_and(|t| t.kind == Kind::Placements)
                })
                .filter_map(|(_, key)| key.namespace.clone())
                .collect()
        });
        if namespaces.as_ref().is_some_and(BTreeSet::is_empty) {
            return Vec::new();
        }
        let hub = ocm.hub(namespaces.as_ref());
        let empty = Arc::new(Inventory::default());
        self.cached_items(
            only,
            |t| t.kind == Kind::Placements,
            |_| true,
            |i, key, json| {
                let placement = Placement::parse(json).ok()?;
                if placement.skip(&self.ctx.karmada.scheduler_name).is_some() {
                    return None;
                }
                let raw: Value = serde_json::from_slice(json).ok()?;
                let inventory = hub
                    .inventories
                    .get(&placement.metadata.namespace)
                    .cloned()
                    .unwrap_or_else(|| empty.clone());
                Some(Item::Placement(
                    i,
                    Arc::new(PlacementItem {
                        existing: hub.decisions.get(&key).cloned().unwrap_or_default(),
                        workloads: hub.workloads.get(&key).cloned().unwrap_or_default(),
                        sig: hub.sig.get(&key).cloned().unwrap_or_default(),
                        inventory,
                        key,
                        raw,
                        placement,
                    }),
                ))
            },
        )
    }

    /// Ask the decision for each subject of a Placement and plan its writes.
    pub(super) async fn evaluate_placement(
        &self,
        i: usize,
        item: Arc<PlacementItem>,
    ) -> PlacementEvaluation {
        let verdict = self.placement_verdict(i, &item).await;
        PlacementEvaluation { i, item, verdict }
    }

    async fn placement_verdict(&self, i: usize, item: &PlacementItem) -> Verdict {
        let placement = &item.placement;
        let now = Timestamp::now();
        let current = decided(&item.existing);
        let found = candidates(placement, &item.inventory, &current, now);
        let recheck = found.as_ref().ok().and_then(|(_, at)| *at);
        let found = found.map(|(c, _)| c);
        // The policy is asked only when there are clusters to decide.
        let allowed = match &found {
            Ok(Candidates::Clusters(_)) => match self.allowed(i, item, &current).await {
                Some(allowed) => allowed,
                None => return Verdict::Failed,
            },
            _ => Allowed::Clusters(None),
        };
        if allowed == Allowed::Undefined {
            return Verdict::Nothing;
        }
        let outcome = choose(placement, found, &allowed, &current);
        let failed = matches!(outcome, Outcome::Denied(_) | Outcome::Misconfigured(_));
        let write = plan(
            placement,
            &outcome,
            &item.existing,
            &item.inventory.clusters,
            &now_rfc3339(),
        );
        let sig = match (&self.ocm, &write.decided) {
            (Some(ocm), Some(decided)) if ocm.sig.is_some() => sig::plan(
                placement,
                decided,
                &self.ctx.karmada.scheduler_name,
                &item.sig,
            ),
            _ => SliceWrite::default(),
        };
        Verdict::Planned(Box::new(Planned {
            write,
            sig,
            failed,
            recheck,
        }))
    }

    /// The workloads the ManifestWorkReplicaSets of `placement` deliver, read
    /// from the API server, not the watch: OCM delivers to a Placement's first
    /// decisions at once, so they must not precede a ManifestWorkReplicaSet
    /// created before or with the Placement whose watch event is still on the
    /// way. `None` when the read failed.
    async fn workloads_read(&self, placement: &ObjectKey) -> Option<Vec<Workload>> {
        let ocm = self.ocm.as_ref()?;
        let namespace = placement.namespace.as_deref()?;
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.ctx.client.clone(),
            namespace,
            &ocm.replica_sets.resource,
        );
        let list = match api.list(&Default::default()).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(placement = %placement, error = %e, "reading the ManifestWorkReplicaSets failed");
                return None;
            }
        };
        let mut workloads = Vec::new();
        for replica_set in list.items {
            let (Some(name), Ok(object)) = (
                replica_set.metadata.name.as_deref(),
                serde_json::to_value(&replica_set),
            ) else {
                continue;
            };
            let key = ObjectKey::new(Some(namespace), name);
            if replica_set_refs(&key, &object).0.contains(placement) {
                workloads.extend(delivered(&object));
            }
        }
        Some(workloads)
    }

    /// The policy's answers for the Placement's workloads and the Placement
    /// itself, read together; `None` when a query failed. Before its first
    /// decision (`current` empty) the workloads are read from the API server.
    async fn allowed(
        &self,
        i: usize,
        item: &PlacementItem,
        current: &BTreeSet<String>,
    ) -> Option<Allowed> {
        let read_now;
        let workloads = if current.is_empty() {
            read_now = self.workloads_read(&item.key).await?;
            &read_now
        } else {
            &item.workloads
        };
        let view = Placement::policy_view(&item.raw);
        let with_placement = |mut input: Value| {
            if let Value::Object(map) = &mut input {
                map.insert(PLACEMENT_INPUT_KEY.to_owned(), view.clone());
            }
            input
        };
        let keys = self.keys.current();
        let mut inputs: Vec<(Subject, &Value, Value)> = workloads
            .iter()
            .map(|w| {
                let resource = manifest_type(&w.manifest);
                let kind = json!({"group": resource.group, "version": resource.version, "kind": resource.kind});
                let gvr = json!({"group": resource.group, "version": resource.version, "resource": resource.plural});
                // As the webhook of a managed cluster sees it: created there.
                let input = policy_input(
                    &w.manifest,
                    &RequestMeta {
                        uid: "",
                        operation: "CREATE",
                        kind: &kind,
                        resource: &gvr,
                        namespace: w.manifest.pointer("/metadata/namespace").and_then(Value::as_str),
                        name: w.manifest.pointer("/metadata/name").and_then(Value::as_str),
                        user_info: &self.user_info,
                        dry_run: false,
                        old_object: None,
                        keys: &keys,
                    },
                );
                (w.subject.clone(), &w.manifest, with_placement(input))
            })
            .collect();
        let own = self.update_input(&item.raw, self.targets[i].resource());
        inputs.push((
            Subject {
                name: format!("Placement {}", item.placement.describe()),
            },
            &item.raw,
            with_placement(own),
        ));
        let mut answers = Vec::with_capacity(inputs.len());
        for (subject, object, input) in inputs {
            let deadline = Instant::now() + self.ctx.query_timeout;
            self.ctx.metrics.remediation_queries.inc();
            match self
                .ctx
                .engine
                .query(&self.ctx.decision, &input, deadline)
                .await
            {
                Ok(outcome) => answers.push((subject, read(object, &outcome, &keys))),
                Err(e) => {
                    tracing::warn!(placement = %item.placement.describe(), subject = %subject.name, error = %e, "placement query failed");
                    return None;
                }
            }
        }
        Some(combine(&answers))
    }

    /// Act on one Placement's evaluation: write its decisions and status.
    pub(super) async fn act_placement(
        &self,
        evaluation: PlacementEvaluation,
        cancel: &CancellationToken,
    ) -> Step {
        let PlacementEvaluation { i, item, verdict } = evaluation;
        let Planned {
            write,
            sig,
            failed,
            recheck,
        } = match verdict {
            Verdict::Failed => return Step::Failed,
            Verdict::Nothing => return Step::Undefined,
            Verdict::Planned(planned) => *planned,
        };
        let key = (i, item.key.clone());
        if let Some(at) = recheck {
            self.recheck(key.clone(), at);
        }
        if write.is_empty() && sig.is_empty() {
            return if failed {
                Step::Unplaceable
            } else {
                Step::Placed
            };
        }
        if self.is_in_flight(&key, item.placement.metadata.resource_version.as_deref()) {
            return Step::InFlight;
        }
        self.limiter.acquire().await;
        if cancel.is_cancelled() || !self.may_act() {
            return Step::Aborted;
        }
        let name = item.placement.describe();
        match self.write_placement(i, &item, &write, &sig).await {
            Ok(()) => {
                self.ctx
                    .metrics
                    .placement_decision(if failed { "failed" } else { "decided" });
                tracing::info!(placement = %name, clusters = ?write.clusters, interim = write.interim, "decided placement");
                if let Some((normal, reason, note)) = &write.event {
                    let type_ = if *normal {
                        EventType::Normal
                    } else {
                        EventType::Warning
                    };
                    self.events
                        .queue(reference(&item.raw), type_, reason, "Decide", note.clone());
                }
                if failed {
                    Step::Unplaceable
                } else {
                    Step::Stale {
                        patched: true,
                        failed: false,
                    }
                }
            }
            Err(e) => {
                self.ctx.metrics.placement_decision("error");
                tracing::warn!(placement = %name, error = %e, "writing the Placement's decisions failed; will retry");
                Step::Stale {
                    patched: false,
                    failed: true,
                }
            }
        }
    }

    /// Decide `key` again at `at` (a toleration runs out then), once.
    fn recheck(&self, key: ItemKey, at: Timestamp) {
        let Some(ocm) = &self.ocm else { return };
        {
            let mut rechecks = ocm.rechecks.lock().unwrap_or_else(|e| e.into_inner());
            if rechecks.get(&key).is_some_and(|t| *t <= at) {
                return;
            }
            rechecks.insert(key.clone(), at);
        }
        let wait = at
            .duration_since(Timestamp::now())
            .try_into()
            .unwrap_or(std::time::Duration::ZERO)
            + std::time::Duration::from_secs(1);
        let changes = self.changes.clone();
        let cancel = ocm.cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(wait) => changes.due(key),
                _ = cancel.cancelled() => {}
            }
        });
    }

    /// The writes: PlacementDecisions that add clusters first (created, then
    /// their status), then those that remove, labels, deletions; then the
    /// Placement's status (from the resourceVersion it was planned from) and
    /// the SIG-Multicluster decisions.
    async fn write_placement(
        &self,
        i: usize,
        item: &PlacementItem,
        write: &PlacementWrite,
        sig: &SliceWrite,
    ) -> Result<(), SyncError> {
        let ocm = self
            .ocm
            .as_ref()
            .expect("placements are decided with OCM's watches");
        let namespace = item.placement.metadata.namespace.as_str();
        let client = self.targets[i].api.clone().into_client();
        let decisions: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &ocm.decisions.resource);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let post = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let expect = |name: &str, prints: Vec<u64>| {
            // An interim step is followed by the watch of its result.
            if !write.interim {
                ocm.written
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(ObjectKey::new(Some(namespace), name))
                    .or_default()
                    .extend(prints);
            }
        };
        let labels_of = |name: &str| -> Value {
            write
                .create
                .iter()
                .find(|c| c["metadata"]["name"] == name)
                .map(|c| c["metadata"]["labels"].clone())
                .or_else(|| {
                    item.existing
                        .iter()
                        .find(|e| e.name == name)
                        .map(|e| json!(e.labels))
                })
                .unwrap_or(Value::Null)
        };
        for object in &write.create {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            expect(
                name,
                vec![decision_fingerprint(
                    &object["metadata"]["labels"],
                    &Value::Null,
                )],
            );
            let object: DynamicObject = serde_json::from_value(object.clone())?;
            match decisions.create(&post, &object).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        for (name, patch) in &write.status {
            expect(
                name,
                vec![decision_fingerprint(
                    &labels_of(name),
                    &patch["status"]["decisions"],
                )],
            );
            decisions
                .patch_status(name, &params, &Patch::Merge(patch))
                .await?;
        }
        for (name, patch) in &write.labels {
            decisions.patch(name, &params, &Patch::Merge(patch)).await?;
        }
        for name in &write.delete {
            match decisions.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(status) = &write.placement_status {
            let placements: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, self.targets[i].resource());
            let mut patch = status.clone();
            let planned_from = item.placement.metadata.resource_version.clone();
            patch["metadata"] = json!({"resourceVersion": planned_from});
            placements
                .patch_status(
                    &item.placement.metadata.name,
                    &params,
                    &Patch::Merge(&patch),
                )
                .await?;
            self.mark_in_flight((i, item.key.clone()), planned_from);
        }
        if !sig.is_empty()
            && let Some(store) = &ocm.sig
        {
            let slices: Api<DynamicObject> =
                Api::namespaced_with(client, namespace, &store.resource);
            let apply = PatchParams::apply(FIELD_MANAGER).force();
            for (name, object) in &sig.apply {
                slices.patch(name, &apply, &Patch::Apply(object)).await?;
            }
            for name in &sig.delete {
                match slices.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }
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
    fn manifests_are_described_and_typed_as_kubernetes_names_them() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                                "metadata": {"name": "web", "namespace": "shop"}});
        assert_eq!(describe_manifest(&deployment), "Deployment shop/web");
        let resource = manifest_type(&deployment);
        assert_eq!(
            (resource.group.as_str(), resource.plural.as_str()),
            ("apps", "deployments")
        );
        let namespace =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}});
        assert_eq!(describe_manifest(&namespace), "Namespace shop");
        assert_eq!(manifest_type(&namespace).plural, "namespaces");
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
