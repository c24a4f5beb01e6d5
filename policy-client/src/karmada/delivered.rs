//! What a binding delivers: the members Karmada's binding controller makes
//! Works for (`spec.clusters`, then the names of `spec.requiredBy[].clusters`
//! not among them, as `mergeTargetClusters` merges them), and what a write of
//! it adds to that.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::TemplateRef;

/// The members `binding` delivers to, with the replicas each gets.
pub fn delivered_clusters(binding: &Value) -> BTreeMap<String, i64> {
    let mut delivered = BTreeMap::new();
    let scheduled = binding.pointer("/spec/clusters").and_then(Value::as_array);
    let required = binding
        .pointer("/spec/requiredBy")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|snapshot| snapshot.get("clusters").and_then(Value::as_array));
    for cluster in scheduled.into_iter().chain(required).flatten() {
        let Some(name) = cluster.get("name").and_then(Value::as_str) else {
            continue;
        };
        let replicas = cluster.get("replicas").and_then(Value::as_i64).unwrap_or(0);
        delivered.entry(name.to_owned()).or_insert(replicas);
    }
    delivered
}

/// The members a write of `binding` delivers more to than `stored` did:
/// those new to it, those given more replicas, and every one when the write
/// points the binding at another template. Every member for a new binding.
pub fn added_clusters(binding: &Value, stored: Option<&Value>) -> BTreeSet<String> {
    let now = delivered_clusters(binding);
    let Some(stored) = stored.filter(|s| !retargeted(binding, s)) else {
        return now.into_keys().collect();
    };
    let before = delivered_clusters(stored);
    now.into_iter()
        .filter(|(name, replicas)| before.get(name).is_none_or(|was| replicas > was))
        .map(|(name, _)| name)
        .collect()
}

/// Whether a write points `binding` at another resource template than
/// `stored` names: another type, namespace, name or UID (a new version of
/// the same template is no other template).
pub fn retargeted(binding: &Value, stored: &Value) -> bool {
    let identity =
        |b: &Value| TemplateRef::of(b).map(|t| (t.api_version, t.kind, t.namespace, t.name, t.uid));
    identity(binding) != identity(stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn binding(clusters: Value, required: Value, uid: &str) -> Value {
        json!({"spec": {
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop",
                         "name": "web", "uid": uid, "resourceVersion": "1"},
            "clusters": clusters,
            "requiredBy": required,
        }})
    }

    #[test]
    fn delivered_clusters_merge_required_by_as_the_binding_controller_does() {
        let b = binding(
            json!([{"name": "eu-1", "replicas": 2}]),
            json!([{"clusters": [{"name": "eu-1", "replicas": 9}, {"name": "us-1", "replicas": 1}]}]),
            "u",
        );
        let delivered = delivered_clusters(&b);
        assert_eq!(delivered.get("eu-1"), Some(&2), "spec.clusters come first");
        assert_eq!(delivered.get("us-1"), Some(&1), "requiredBy adds a member");
    }

    #[test]
    fn a_write_adds_new_members_and_more_replicas_only() {
        let stored = binding(
            json!([{"name": "eu-1", "replicas": 2}, {"name": "us-1", "replicas": 2}]),
            json!(null),
            "u",
        );
        let fewer = binding(json!([{"name": "eu-1", "replicas": 2}]), json!(null), "u");
        assert!(added_clusters(&fewer, Some(&stored)).is_empty());
        let more = binding(
            json!([{"name": "eu-1", "replicas": 2}, {"name": "us-1", "replicas": 3}]),
            json!(null),
            "u",
        );
        assert_eq!(
            added_clusters(&more, Some(&stored)),
            ["us-1".to_owned()].into()
        );
        let required = binding(
            json!([{"name": "eu-1", "replicas": 2}]),
            json!([{"clusters": [{"name": "eu-2", "replicas": 1}]}]),
            "u",
        );
        assert_eq!(
            added_clusters(&required, Some(&stored)),
            ["eu-2".to_owned()].into()
        );
        assert_eq!(
            added_clusters(&stored, None).len(),
            2,
            "a new binding adds all"
        );
    }

    #[test]
    fn another_template_is_delivered_anew_to_every_member() {
        let stored = binding(json!([{"name": "us-1", "replicas": 2}]), json!(null), "u");
        let other = binding(json!([{"name": "us-1", "replicas": 2}]), json!(null), "v");
        assert!(retargeted(&other, &stored));
        assert_eq!(
            added_clusters(&other, Some(&stored)),
            ["us-1".to_owned()].into()
        );
        let mut newer = stored.clone();
        newer["spec"]["resource"]["resourceVersion"] = json!("2");
        assert!(
            !retargeted(&newer, &stored),
            "a new version is the same template"
        );
        assert!(added_clusters(&newer, Some(&stored)).is_empty());
    }
}
