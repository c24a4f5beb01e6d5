//! The per-pass view of the hub the Placements of a pass are decided from:
//! their PlacementDecisions, the workloads their ManifestWorkReplicaSets
//! deliver, their SIG-Multicluster decisions and the clusters each namespace
//! may use, as the watches hold them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use policy_client::delivery::{Carrier, describe};
use serde_json::Value;

use super::watch::{OcmState, replica_set_refs};
use crate::reconcile::ocm::clusters::{ClusterSet, Inventory, ManagedCluster};
use crate::reconcile::ocm::decisions::{Existing, PLACEMENT_LABEL};
use crate::reconcile::ocm::item::Workload;
use crate::reconcile::ocm::policy::Subject;
use crate::reconcile::ocm::sig::{self, Slice};
use crate::replication::document::ObjectKey;

/// The per-pass view of the hub the Placements of a pass are decided from,
/// indexed by namespace and Placement.
pub(super) struct Hub {
    pub(super) decisions: HashMap<ObjectKey, Vec<Existing>>,
    pub(super) workloads: HashMap<ObjectKey, Vec<Workload>>,
    pub(super) sig: HashMap<ObjectKey, Vec<Slice>>,
    pub(super) inventories: HashMap<String, Arc<Inventory>>,
}

impl OcmState {
    /// The hub as the watches hold it, for the Placements of `namespaces`
    /// (every namespace when `None`).
    pub(super) fn hub(&self, namespaces: Option<&BTreeSet<String>>) -> Hub {
        let admitted = |key: &ObjectKey| {
            namespaces.is_none_or(|n| key.namespace.as_ref().is_some_and(|ns| n.contains(ns)))
        };
        Hub {
            decisions: self.decisions_by_placement(&admitted),
            workloads: self.workloads_by_placement(&admitted),
            sig: self.sig_by_placement(&admitted),
            inventories: self.inventories(&admitted),
        }
    }

    /// The PlacementDecisions of each Placement, by name.
    fn decisions_by_placement(
        &self,
        admitted: &dyn Fn(&ObjectKey) -> bool,
    ) -> HashMap<ObjectKey, Vec<Existing>> {
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
        decisions
    }

    /// The workloads each Placement's ManifestWorkReplicaSets deliver.
    fn workloads_by_placement(
        &self,
        admitted: &dyn Fn(&ObjectKey) -> bool,
    ) -> HashMap<ObjectKey, Vec<Workload>> {
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
        workloads
    }

    /// The SIG-Multicluster decisions of each Placement, when watched.
    fn sig_by_placement(
        &self,
        admitted: &dyn Fn(&ObjectKey) -> bool,
    ) -> HashMap<ObjectKey, Vec<Slice>> {
        let mut sig: HashMap<ObjectKey, Vec<Slice>> = HashMap::new();
        let Some(store) = &self.sig else {
            return sig;
        };
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
        sig
    }

    /// The clusters each namespace may use: every cluster and set, with the
    /// sets bound to the namespace.
    fn inventories(
        &self,
        admitted: &dyn Fn(&ObjectKey) -> bool,
    ) -> HashMap<String, Arc<Inventory>> {
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
        bound
            .into_iter()
            .map(|(ns, bound)| {
                let inventory = Inventory {
                    clusters: clusters.clone(),
                    sets: sets.clone(),
                    bound,
                };
                (ns, Arc::new(inventory))
            })
            .collect()
    }
}

/// The workloads a ManifestWorkReplicaSet delivers, each with it as its
/// carrier.
pub(super) fn delivered(replica_set: &Value) -> Vec<Workload> {
    let field = |p: &str| replica_set.pointer(p).and_then(Value::as_str).unwrap_or("");
    let carrier = format!(
        "ManifestWorkReplicaSet {}/{}",
        field("/metadata/namespace"),
        field("/metadata/name")
    );
    Carrier::ManifestWorkReplicaSet
        .manifests(replica_set)
        .iter()
        .map(|manifest| Workload {
            subject: Subject::workload(describe(manifest), carrier.clone()),
            manifest: manifest.clone(),
        })
        .collect()
}
