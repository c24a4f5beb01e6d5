//! Karmada bindings and the policy: what the policy sees of a binding, the
//! input of its resource template's decision, the clusters that decision
//! allows, and the guardrail's narrowing of a binding's placement to them.
//!
//! One module for the webhook (which narrows every binding write it admits)
//! and placement-sync (which has bindings admitted again when the answer
//! changes, and schedules the bindings handed to it), so both read the same
//! decision the same way.
//!
//! **The guardrail** leaves karmada-scheduler every feature (spread
//! constraints, fall-back groups, tolerations, weights, the estimator,
//! failover) and bounds only which clusters it may choose: the cluster names
//! of `clusterAffinity` and of every `clusterAffinities` term (and of each
//! term's `overflowAffinities`) become the user's names intersected with the
//! allowed set, or the allowed set where the user named none. Allow-lists,
//! never exclude-lists: a member that joins later is no candidate until the
//! policy allows it. An affinity left with no allowed cluster names
//! [`NO_CLUSTER`], a name no Karmada cluster can have (an empty `clusterNames`
//! would mean "any cluster" to Karmada). Everything else the user wrote stays.

mod bound;
mod delivered;
mod templates;

use kube::api::ApiResource;
use serde_json::{Map, Value, json};

use crate::input::{BINDING_INPUT_KEY, stored_input};
use crate::ownership_keys::OwnershipKeys;
pub use bound::{
    ALLOWED_CLUSTERS_ANNOTATION, Bound, BoundError, NO_CLUSTER, PREFERENCES_ANNOTATION, bound,
    guarded, narrow, scheduled_clusters, stored_bound,
};
pub use delivered::{added_clusters, delivered_clusters, retargeted};
pub use templates::{TemplateError, TemplateRef, Templates};

/// The API group of Karmada's bindings.
pub const BINDING_GROUP: &str = "work.karmada.io";

/// The kinds of Karmada's bindings.
pub const BINDING_KINDS: [&str; 2] = ["ResourceBinding", "ClusterResourceBinding"];

/// Whether `group`/`kind` is one of Karmada's bindings.
pub fn is_binding(group: &str, kind: &str) -> bool {
    group == BINDING_GROUP && BINDING_KINDS.contains(&kind)
}

/// What the policy sees of a binding (`input._binding`): its name, namespace
/// and spec, without `placement` and `clusters`. The policy bounds where a
/// workload may run; it does not read the user's placement or Karmada's
/// choice, so the webhook admitting any write of a binding and placement-sync
/// reading it as stored get the same answer.
pub fn binding_view(raw: &Value) -> Value {
    let mut metadata = Map::new();
    for key in ["name", "namespace"] {
        if let Some(v) = raw.pointer(&format!("/metadata/{key}")) {
            metadata.insert(key.to_owned(), v.clone());
        }
    }
    let mut spec = raw.get("spec").cloned().unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut spec {
        fields.remove("placement");
        fields.remove("clusters");
    }
    json!({
        "apiVersion": raw.get("apiVersion").cloned().unwrap_or(Value::Null),
        "kind": raw.get("kind").cloned().unwrap_or(Value::Null),
        "metadata": metadata,
        "spec": spec,
    })
}

/// The policy input for a binding's resource `template` (of type
/// `resource`): the template in the developer's view, as an `UPDATE` of the
/// template as stored by no particular user (the template's own writer is
/// not known where bindings are decided), plus `binding` under
/// `input._binding` ([`binding_view`]).
pub fn template_input(
    template: &Value,
    resource: &ApiResource,
    binding: &Value,
    keys: &OwnershipKeys,
) -> Value {
    let mut input = stored_input(template, resource, &json!({}), keys);
    if let Value::Object(map) = &mut input {
        map.insert(BINDING_INPUT_KEY.to_owned(), binding_view(binding));
    }
    input
}

/// The PropagationPolicy or ClusterPropagationPolicy that made a binding, as
/// Karmada's detector names it in the binding's annotations:
/// `(Some(namespace), name)` or `(None, name)`.
pub fn propagation_policy(binding: &Value) -> Option<(Option<String>, String)> {
    let annotation = |key: &str| {
        binding
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    if let (Some(namespace), Some(name)) = (
        annotation("propagationpolicy.karmada.io/namespace"),
        annotation("propagationpolicy.karmada.io/name"),
    ) {
        return Some((Some(namespace), name));
    }
    annotation("clusterpropagationpolicy.karmada.io/name").map(|name| (None, name))
}

#[cfg(test)]
mod tests;
