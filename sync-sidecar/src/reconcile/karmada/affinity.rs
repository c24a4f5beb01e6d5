//! Which Karmada clusters a user's placement selects, as karmada-scheduler
//! reads it: a `ClusterAffinity` (`util.ClusterMatches`: exclusions, label
//! selector, field selector on provider, region and zones, cluster names) and
//! `clusterTolerations` against a cluster's `NoSchedule`/`NoExecute` taints
//! (its TaintToleration filter plugin).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use serde_json::Value;

/// Whether `cluster` (a Karmada `Cluster` object) matches `affinity` (a
/// `ClusterAffinity`). A selector Karmada could not parse matches nothing.
pub(crate) fn matches(cluster: &Value, affinity: &Value) -> bool {
    let name = cluster
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let strings = |key: &str| -> Vec<&str> {
        affinity
            .get(key)
            .and_then(Value::as_array)
            .map(|items| items.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    };
    if strings("exclude").contains(&name) {
        return false;
    }
    if let Some(selector) = affinity.get("labelSelector").filter(|s| !s.is_null()) {
        let Some(selector) = label_selector(selector) else {
            return false;
        };
        if !selector.matches(&labels(cluster)) {
            return false;
        }
    }
    if let Some(fields) = affinity.get("fieldSelector").filter(|s| !s.is_null()) {
        let expressions = fields
            .get("matchExpressions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if !expressions.iter().all(|e| field_matches(cluster, e)) {
            return false;
        }
    }
    let names = strings("clusterNames");
    names.is_empty() || names.contains(&name)
}

fn label_selector(selector: &Value) -> Option<Selector> {
    let selector: LabelSelector = serde_json::from_value(selector.clone()).ok()?;
    Selector::try_from(selector).ok()
}

fn labels(cluster: &Value) -> BTreeMap<String, String> {
    cluster
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// One `fieldSelector` requirement (a `NodeSelectorRequirement`): `zone`
/// against the cluster's zones, `provider` and `region` against its spec.
fn field_matches(cluster: &Value, requirement: &Value) -> bool {
    let key = requirement
        .get("key")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let operator = requirement
        .get("operator")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let values: Vec<&str> = requirement
        .get("values")
        .and_then(Value::as_array)
        .map(|v| v.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if key == "zone" {
        let zones: Vec<&str> = cluster
            .pointer("/spec/zones")
            .and_then(Value::as_array)
            .map(|z| z.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        return match operator {
            "In" => zones.iter().any(|z| values.contains(z)),
            "NotIn" => !zones.iter().any(|z| values.contains(z)),
            "Exists" => !zones.is_empty(),
            "DoesNotExist" => zones.is_empty(),
            _ => false,
        };
    }
    // Karmada's cluster fields are provider and region; any other key
    // selects on a field no cluster has.
    let field = match key {
        "provider" | "region" => cluster
            .pointer(&format!("/spec/{key}"))
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty()),
        _ => None,
    };
    match operator {
        "In" => field.is_some_and(|f| values.contains(&f)),
        "NotIn" => field.is_none_or(|f| !values.contains(&f)),
        "Exists" => field.is_some(),
        "DoesNotExist" => field.is_none(),
        "Gt" | "Lt" => {
            let (Some(field), [bound]) = (field.and_then(|f| f.parse::<i64>().ok()), &values[..])
            else {
                return false;
            };
            let Ok(bound) = bound.parse::<i64>() else {
                return false;
            };
            if operator == "Gt" {
                field > bound
            } else {
                field < bound
            }
        }
        _ => false,
    }
}

/// The first `NoSchedule` or `NoExecute` taint of `cluster` that
/// `tolerations` (the placement's `clusterTolerations`) do not tolerate, as
/// Karmada prints it (`key=value:Effect`).
pub(crate) fn untolerated_taint(cluster: &Value, tolerations: &[Value]) -> Option<String> {
    let taints = cluster.pointer("/spec/taints").and_then(Value::as_array)?;
    taints
        .iter()
        .filter(|taint| {
            matches!(
                taint.get("effect").and_then(Value::as_str),
                Some("NoSchedule" | "NoExecute")
            )
        })
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
        .map(|taint| {
            let field = |k: &str| taint.get(k).and_then(Value::as_str).unwrap_or_default();
            match field("value") {
                "" => format!("{}:{}", field("key"), field("effect")),
                value => format!("{}={value}:{}", field("key"), field("effect")),
            }
        })
}

/// `Toleration.ToleratesTaint` of Kubernetes.
fn tolerates(toleration: &Value, taint: &Value) -> bool {
    let field = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let effect = field(toleration, "effect");
    if !effect.is_empty() && effect != field(taint, "effect") {
        return false;
    }
    let key = field(toleration, "key");
    if !key.is_empty() && key != field(taint, "key") {
        return false;
    }
    match field(toleration, "operator").as_str() {
        "Exists" => true,
        "" | "Equal" => !key.is_empty() && field(toleration, "value") == field(taint, "value"),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
