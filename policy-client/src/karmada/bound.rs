//! The clusters a decision allows a binding's template, and the guardrail's
//! narrowing of a binding's placement to them (see the [parent
//! module](super)).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::decision::Decision;

/// The placement the policy decides for a template: Federation v1's
/// replica-set preferences, whose `clusters` name the clusters it allows.
pub const PREFERENCES_ANNOTATION: &str = "federation.kubernetes.io/replica-set-preferences";

/// The guardrail's record on a binding of the clusters the policy allowed
/// when it last narrowed it: the names, comma-separated and sorted (empty:
/// none), or `*` when the policy bounds nothing for its template. A decision
/// that cannot be used (errors, an engine down) narrows by this record, so it
/// never widens what is stored.
pub const ALLOWED_CLUSTERS_ANNOTATION: &str = "placement-policy.io/allowed-clusters";

/// The cluster name an affinity with no allowed cluster names: it contains a
/// `/`, which no Karmada cluster name can (they are DNS labels), so the
/// affinity matches no cluster, now or later.
pub const NO_CLUSTER: &str = "placement-policy.io/no-cluster-allowed";

/// The clusters a policy allows a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// The policy places no such template (no preferences), or allows any
    /// cluster (`"*"`): nothing to narrow.
    Any,
    /// These clusters only (none: no cluster at all).
    Clusters(BTreeSet<String>),
}

impl Bound {
    /// The record of this bound ([`ALLOWED_CLUSTERS_ANNOTATION`]).
    pub fn record(&self) -> String {
        match self {
            Bound::Any => "*".to_owned(),
            Bound::Clusters(names) => names
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// The bound a record says; `None` for a value the guardrail never writes.
    pub fn from_record(record: &str) -> Option<Bound> {
        if record == "*" {
            return Some(Bound::Any);
        }
        let names: BTreeSet<String> = record
            .split(',')
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        names
            .iter()
            .all(|n| valid_cluster_name(n))
            .then_some(Bound::Clusters(names))
    }
}

impl std::fmt::Display for Bound {
    /// As a message says it: `any cluster`, `no cluster`, or the names.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bound::Any => f.write_str("any cluster"),
            Bound::Clusters(names) if names.is_empty() => f.write_str("no cluster"),
            Bound::Clusters(names) => {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                f.write_str(&names.join(", "))
            }
        }
    }
}

/// A Karmada cluster name: a DNS label (what Karmada's API accepts).
fn valid_cluster_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The decision's placement cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    #[error("the policy's {PREFERENCES_ANNOTATION} cannot be read: {0}")]
    Unreadable(String),
    #[error("the policy's {PREFERENCES_ANNOTATION} names {0:?}, which is no cluster name")]
    InvalidName(String),
}

/// The clusters an error-free `decision` allows: the clusters its
/// replica-set preferences name (the policy's value, not the developer's).
pub fn bound(decision: &Decision) -> Result<Bound, BoundError> {
    let Some(preferences) = decision.annotations.get(PREFERENCES_ANNOTATION) else {
        return Ok(Bound::Any);
    };
    let parsed: Value =
        serde_json::from_str(preferences).map_err(|e| BoundError::Unreadable(e.to_string()))?;
    let Some(clusters) = parsed.get("clusters").and_then(Value::as_object) else {
        return Err(BoundError::Unreadable(
            "it has no object \"clusters\"".to_owned(),
        ));
    };
    if clusters.contains_key("*") {
        return Ok(Bound::Any);
    }
    let mut names = BTreeSet::new();
    for name in clusters.keys() {
        if !valid_cluster_name(name) {
            return Err(BoundError::InvalidName(name.clone()));
        }
        names.insert(name.clone());
    }
    Ok(Bound::Clusters(names))
}

/// The bound of a stored binding, for a decision that cannot be used (errors,
/// undefined, an engine down): its record; without one (a binding the
/// guardrail never admitted), the clusters it runs on now. So a write never
/// widens what is stored, and a placement is never lost to an error.
pub fn stored_bound(stored: &Value) -> Bound {
    stored
        .pointer(&format!(
            "/metadata/annotations/{}",
            ALLOWED_CLUSTERS_ANNOTATION.replace('/', "~1")
        ))
        .and_then(Value::as_str)
        .and_then(Bound::from_record)
        .unwrap_or_else(|| Bound::Clusters(scheduled_clusters(stored)))
}

/// The names of a binding's `spec.clusters`.
pub fn scheduled_clusters(binding: &Value) -> BTreeSet<String> {
    binding
        .pointer("/spec/clusters")
        .and_then(Value::as_array)
        .map(|clusters| {
            clusters
                .iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `placement` (a binding's or a PropagationPolicy's `spec.placement`)
/// narrowed to `bound` (see the module documentation). Narrowing is
/// idempotent, and narrowing twice is narrowing by the intersection.
pub fn narrow(placement: &Value, bound: &Bound) -> Value {
    let Bound::Clusters(allowed) = bound else {
        return placement.clone();
    };
    let mut narrowed = match placement {
        Value::Object(_) => placement.clone(),
        _ => json!({}),
    };
    let has_terms = narrowed
        .get("clusterAffinities")
        .and_then(Value::as_array)
        .is_some_and(|terms| !terms.is_empty());
    if has_terms {
        if let Some(terms) = narrowed
            .get_mut("clusterAffinities")
            .and_then(Value::as_array_mut)
        {
            for term in terms {
                narrow_affinity(term, allowed);
                if let Some(overflows) = term
                    .get_mut("overflowAffinities")
                    .and_then(Value::as_array_mut)
                {
                    for overflow in overflows {
                        narrow_affinity(overflow, allowed);
                    }
                }
            }
        }
    } else {
        let affinity = narrowed
            .as_object_mut()
            .expect("an object")
            .entry("clusterAffinity")
            .or_insert_with(|| json!({}));
        if !affinity.is_object() {
            *affinity = json!({});
        }
        narrow_affinity(affinity, allowed);
    }
    narrowed
}

/// One `ClusterAffinity`'s `clusterNames`: the user's names that are allowed
/// (in the user's order), or every allowed name when the user named none;
/// [`NO_CLUSTER`] when nothing is left.
fn narrow_affinity(affinity: &mut Value, allowed: &BTreeSet<String>) {
    let Value::Object(fields) = affinity else {
        return;
    };
    let requested: Vec<String> = fields
        .get("clusterNames")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let mut names: Vec<String> = if requested.is_empty() {
        allowed.iter().cloned().collect()
    } else {
        requested
            .into_iter()
            .filter(|name| allowed.contains(name))
            .collect()
    };
    if names.is_empty() {
        names.push(NO_CLUSTER.to_owned());
    }
    fields.insert("clusterNames".to_owned(), json!(names));
}

/// `binding` with its placement narrowed from `requested` to `bound`, and the
/// record of `bound`.
pub fn guarded(binding: &Value, requested: &Value, bound: &Bound) -> Value {
    let mut guarded = binding.clone();
    if let Some(spec) = guarded.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("placement".to_owned(), narrow(requested, bound));
    }
    if let Some(metadata) = guarded.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
        if !annotations.is_object() {
            *annotations = json!({});
        }
        annotations[ALLOWED_CLUSTERS_ANNOTATION] = json!(bound.record());
    }
    guarded
}
