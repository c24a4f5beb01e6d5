//! Open Cluster Management and the policy: what the policy sees of a
//! Placement (`input._placement`) and the workloads a ManifestWorkReplicaSet
//! delivers, one definition for placement-sync (which decides Placements)
//! and `kubectl placement explain` (which shows why).

use serde_json::{Map, Value, json};

/// What the policy sees of a Placement (`input._placement`): its identity,
/// labels, annotations and spec, not its status (which the decider writes
/// itself).
pub fn placement_view(raw: &Value) -> Value {
    let mut metadata = Map::new();
    for key in [
        "name",
        "namespace",
        "uid",
        "generation",
        "labels",
        "annotations",
    ] {
        if let Some(v) = raw.pointer(&format!("/metadata/{key}")) {
            metadata.insert(key.to_owned(), v.clone());
        }
    }
    json!({
        "apiVersion": raw.get("apiVersion").cloned().unwrap_or(Value::Null),
        "kind": raw.get("kind").cloned().unwrap_or(Value::Null),
        "metadata": metadata,
        "spec": raw.get("spec").cloned().unwrap_or(Value::Null),
    })
}

/// The manifests a ManifestWorkReplicaSet delivers.
pub fn delivered_manifests(replica_set: &Value) -> Vec<Value> {
    replica_set
        .pointer("/spec/manifestWorkTemplate/workload/manifests")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_leaves_out_status_and_other_metadata() {
        let raw = json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1",
            "kind": "Placement",
            "metadata": {"name": "web", "namespace": "shop", "labels": {"a": "b"},
                         "resourceVersion": "7", "managedFields": []},
            "spec": {"numberOfClusters": 2},
            "status": {"numberOfSelectedClusters": 1},
        });
        let view = placement_view(&raw);
        assert_eq!(
            view["metadata"],
            json!({"name": "web", "namespace": "shop", "labels": {"a": "b"}})
        );
        assert_eq!(view["spec"]["numberOfClusters"], 2);
        assert!(view.get("status").is_none());
    }
}
