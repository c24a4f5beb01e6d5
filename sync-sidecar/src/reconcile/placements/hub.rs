//! The per-pass view of the hub the Placements of a pass are decided from:
//! their PlacementDecisions, the workloads their ManifestWorkReplicaSets
//! deliver, their SIG-Multicluster decisions and the clusters each namespace
//! may use, as the watches hold them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kube::api::{ApiResource, GroupVersionKind};
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
pub(super) fn delivered(replica_set: &Value) -> Vec<Workload> {
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
pub(super) fn manifest_type(manifest: &Value) -> ApiResource {
    let api_version = manifest
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = manifest.get("kind").and_then(Value::as_str).unwrap_or("");
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
