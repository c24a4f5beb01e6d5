//! The Karmada types the bindings' reconciler watches or reads, and the
//! fingerprints that make a binding due.

use std::sync::Arc;

use policy_client::karmada::propagation_policy;
use serde_json::{Value, json};

use crate::reconcile::changes::fingerprint;
use crate::reconcile::karmada::guard::guarded_view;
use crate::replication::document::ObjectKey;
use crate::replication::watched::{Need, WatchedType};

/// The binding types of Karmada, scheduled when the scheduler is on.
pub(crate) const BINDING_TYPES: [(&str, &str, &str); 2] = [
    ("work.karmada.io", "v1alpha2", "resourcebindings"),
    ("work.karmada.io", "v1alpha2", "clusterresourcebindings"),
];

/// Karmada's Cluster type; its replicated objects name the clusters a
/// placement may use.
pub(crate) const KARMADA_CLUSTERS: (&str, &str, &str) =
    ("cluster.karmada.io", "v1alpha1", "clusters");

/// Karmada's PropagationPolicy and ClusterPropagationPolicy types: the
/// placements the guardrail admits bindings with again.
pub(crate) const PROPAGATION_POLICY_TYPES: [(&str, &str, &str); 2] = [
    ("policy.karmada.io", "v1alpha1", "propagationpolicies"),
    (
        "policy.karmada.io",
        "v1alpha1",
        "clusterpropagationpolicies",
    ),
];

/// The watched PropagationPolicies and ClusterPropagationPolicies.
pub(crate) struct PropagationPolicies {
    pub(crate) namespaced: Arc<WatchedType>,
    pub(crate) cluster: Arc<WatchedType>,
}

impl PropagationPolicies {
    /// The placement the (Cluster)PropagationPolicy that made `binding` asks
    /// for, as stored; `None` when it is gone or not named.
    pub(crate) fn placement(&self, binding: &Value) -> Option<Value> {
        let (namespace, name) = propagation_policy(binding)?;
        let store = match &namespace {
            Some(_) => &self.namespaced,
            None => &self.cluster,
        };
        let json = store
            .objects
            .get(&ObjectKey::new(namespace.as_deref(), &name))?;
        serde_json::from_slice::<Value>(&json)
            .ok()?
            .pointer("/spec/placement")
            .cloned()
    }
}

/// What the scheduler needs of a binding type's watch.
pub(crate) fn need() -> Need {
    Need {
        listed: true,
        ..Need::default()
    }
}

/// A fingerprint of what the guardrail reads of a binding
/// ([`guarded_view`]: not karmada-scheduler's result).
pub(crate) fn guarded_fingerprint(raw: &Value) -> u64 {
    fingerprint(&guarded_view(raw))
}

/// A fingerprint of what scheduling reads of a binding: its spec (not its
/// status, which the binding controller rewrites as members report) and
/// whether it is being deleted.
pub(crate) fn binding_fingerprint(raw: &Value) -> u64 {
    fingerprint(&json!([
        raw.get("spec"),
        raw.pointer("/metadata/deletionTimestamp").is_some()
    ]))
}

/// The fingerprint `raw` will have once the merge patch `spec` is applied.
pub(crate) fn written_fingerprint(raw: &Value, spec: &Value) -> u64 {
    let mut written = raw.clone();
    json_patch::merge(&mut written, spec);
    binding_fingerprint(&written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_ignores_status_and_sees_spec_and_deletion() {
        let raw = json!({"metadata": {"name": "b"}, "spec": {"replicas": 2},
                         "status": {"aggregatedStatus": []}});
        let mut status = raw.clone();
        status["status"]["aggregatedStatus"] = json!([{"clusterName": "x"}]);
        assert_eq!(binding_fingerprint(&raw), binding_fingerprint(&status));
        let mut scaled = raw.clone();
        scaled["spec"]["replicas"] = json!(3);
        assert_ne!(binding_fingerprint(&raw), binding_fingerprint(&scaled));
        let mut deleting = raw.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-25T10:00:00Z");
        assert_ne!(binding_fingerprint(&raw), binding_fingerprint(&deleting));
    }

    #[test]
    fn a_placement_write_is_known_before_the_watch_brings_it() {
        let raw = json!({"metadata": {"name": "b", "resourceVersion": "7"},
                         "spec": {"replicas": 6, "clusters": [{"name": "old", "replicas": 6}]}});
        let patch = json!({"metadata": {"annotations": {"policy.karmada.io/applied-placement": "{}"}},
                           "spec": {"clusters": [{"name": "a", "replicas": 3}, {"name": "b", "replicas": 3}]}});
        // As the API server stores it: the patch merged, a new resourceVersion.
        let stored = json!({"metadata": {"name": "b", "resourceVersion": "8",
                                         "annotations": {"policy.karmada.io/applied-placement": "{}"}},
                            "spec": {"replicas": 6, "clusters": [{"name": "a", "replicas": 3}, {"name": "b", "replicas": 3}]}});
        assert_eq!(
            written_fingerprint(&raw, &patch),
            binding_fingerprint(&stored)
        );
        assert_ne!(written_fingerprint(&raw, &patch), binding_fingerprint(&raw));
    }
}
