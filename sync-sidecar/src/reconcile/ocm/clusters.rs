//! The clusters a Placement may be decided onto, selected as OCM's scheduler
//! selects them: the ManagedClusters of the ManagedClusterSets bound to the
//! Placement's namespace (those of `spec.clusterSets` among them), not being
//! deleted, matching one of its `predicates` (labels and claims), whose
//! taints its `tolerations` tolerate (`pkg/placement/controllers/scheduling/
//! helpers.go` and the `predicate` and `tainttoleration` plugins).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use serde::Deserialize;
use serde_json::Value;

use super::placement::{ClusterSelector, Placement, Toleration};

/// OCM's label of a cluster's exclusive ManagedClusterSet.
pub(crate) const CLUSTER_SET_LABEL: &str = "cluster.open-cluster-management.io/clusterset";

/// A ManagedCluster (`cluster.open-cluster-management.io/v1`) as selection
/// reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ManagedCluster {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    /// `status.clusterClaims`, by name.
    pub(crate) claims: BTreeMap<String, String>,
    pub(crate) taints: Vec<Taint>,
    pub(crate) deleting: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Taint {
    #[serde(default)]
    pub(crate) key: String,
    #[serde(default)]
    pub(crate) value: String,
    #[serde(default)]
    pub(crate) effect: String,
    /// RFC 3339.
    #[serde(default)]
    pub(crate) time_added: Option<String>,
}

impl ManagedCluster {
    pub(crate) fn parse(json: &[u8]) -> Result<ManagedCluster, serde_json::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            name: String,
            #[serde(default)]
            labels: BTreeMap<String, String>,
            #[serde(default)]
            deletion_timestamp: Option<String>,
        }
        #[derive(Deserialize, Default)]
        struct Spec {
            #[serde(default)]
            taints: Vec<Taint>,
        }
        #[derive(Deserialize)]
        struct Claim {
            name: String,
            #[serde(default)]
            value: String,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Status {
            #[serde(default)]
            cluster_claims: Vec<Claim>,
        }
        #[derive(Deserialize)]
        struct Object {
            metadata: Meta,
            #[serde(default)]
            spec: Spec,
            #[serde(default)]
            status: Status,
        }
        let object: Object = serde_json::from_slice(json)?;
        Ok(ManagedCluster {
            name: object.metadata.name,
            labels: object.metadata.labels,
            claims: object
                .status
                .cluster_claims
                .into_iter()
                .map(|c| (c.name, c.value))
                .collect(),
            taints: object.spec.taints,
            deleting: object.metadata.deletion_timestamp.is_some(),
        })
    }
}

/// A fingerprint of what selection and the policy read of a ManagedCluster:
/// its labels, taints, claims, conditions' statuses and deletion (not its
/// heartbeats, resources or version).
pub(crate) fn cluster_fingerprint(raw: &Value) -> Value {
    let conditions: Vec<Value> = raw
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| serde_json::json!([c.get("type"), c.get("status")]))
        .collect();
    serde_json::json!([
        raw.pointer("/metadata/labels"),
        raw.pointer("/spec/taints"),
        raw.pointer("/status/clusterClaims"),
        conditions,
        raw.pointer("/metadata/deletionTimestamp").is_some(),
    ])
}

/// How a ManagedClusterSet (`v1beta2`) selects its clusters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ClusterSet {
    /// `ExclusiveClusterSetLabel`: the clusters labelled with its name.
    Exclusive(String),
    /// `LabelSelector` (the `global` set: every cluster).
    Labels(Selector),
    /// A selector that cannot be read: it selects nothing.
    Invalid,
}

impl ClusterSet {
    pub(crate) fn parse(json: &[u8]) -> Result<(String, ClusterSet), serde_json::Error> {
        #[derive(Deserialize)]
        struct Meta {
            name: String,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct SetSelector {
            #[serde(default)]
            selector_type: Option<String>,
            #[serde(default)]
            label_selector: Option<LabelSelector>,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Spec {
            #[serde(default)]
            cluster_selector: SetSelector,
        }
        #[derive(Deserialize)]
        struct Object {
            metadata: Meta,
            #[serde(default)]
            spec: Spec,
        }
        let object: Object = serde_json::from_slice(json)?;
        let name = object.metadata.name;
        let selector = object.spec.cluster_selector;
        let set = match selector.selector_type.as_deref() {
            Some("LabelSelector") => selector
                .label_selector
                .unwrap_or_default()
                .try_into()
                .map_or(ClusterSet::Invalid, ClusterSet::Labels),
            _ => ClusterSet::Exclusive(name.clone()),
        };
        Ok((name, set))
    }

    fn contains(&self, cluster: &ManagedCluster) -> bool {
        match self {
            ClusterSet::Exclusive(name) => {
                cluster.labels.get(CLUSTER_SET_LABEL).map(String::as_str) == Some(name.as_str())
            }
            ClusterSet::Labels(selector) => selector.matches(&cluster.labels),
            ClusterSet::Invalid => false,
        }
    }
}

/// What the hub has that selection reads: the ManagedClusters and the
/// ManagedClusterSets by name (shared by the Placements of every namespace),
/// and the sets bound to the Placement's namespace (its
/// ManagedClusterSetBindings' names).
#[derive(Debug, Default)]
pub(crate) struct Inventory {
    pub(crate) clusters: Arc<BTreeMap<String, ManagedCluster>>,
    pub(crate) sets: Arc<BTreeMap<String, ClusterSet>>,
    pub(crate) bound: BTreeSet<String>,
}

/// Why no cluster can be selected, as OCM's `PlacementSatisfied` condition
/// says it (reason, message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unsatisfied {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// The Placement's configuration cannot be honoured (`PlacementMisconfigured`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Misconfigured(pub(crate) String);

/// The clusters a Placement may be decided onto.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Candidates {
    /// By name, matching its predicates and tolerated.
    Clusters(BTreeMap<String, ManagedCluster>),
    Unsatisfied(Unsatisfied),
}

/// A compiled `requiredClusterSelector`: labels AND claims.
#[derive(Debug, Clone)]
pub(crate) struct CompiledSelector {
    labels: Selector,
    claims: Selector,
}

impl CompiledSelector {
    /// `what` names the selector in an error (`spec.predicates[0]`).
    pub(crate) fn new(selector: &ClusterSelector, what: &str) -> Result<Self, Misconfigured> {
        if selector
            .cel_selector
            .as_ref()
            .is_some_and(|c| !c.cel_expressions.is_empty())
        {
            return Err(Misconfigured(format!(
                "{what}.requiredClusterSelector.celSelector is not supported by placement-policy: select with labelSelector and claimSelector (or let the policy decide)"
            )));
        }
        let labels = selector
            .label_selector
            .clone()
            .unwrap_or_default()
            .try_into()
            .map_err(|e| Misconfigured(format!("{what} labelSelector: {e}")))?;
        let claims = LabelSelector {
            match_expressions: selector
                .claim_selector
                .as_ref()
                .and_then(|c| c.match_expressions.clone()),
            match_labels: None,
        }
        .try_into()
        .map_err(|e| Misconfigured(format!("{what} claimSelector: {e}")))?;
        Ok(CompiledSelector { labels, claims })
    }

    pub(crate) fn matches(&self, cluster: &ManagedCluster) -> bool {
        self.labels.matches(&cluster.labels) && self.claims.matches(&cluster.claims)
    }
}

/// The clusters `placement` may be decided onto, of `inventory`; `decided`
/// are the clusters it has (a `NoSelectIfNew` taint keeps only new ones
/// off); `now` is the current time (RFC 3339, UTC), against which a
/// toleration's `tolerationSeconds` runs out. Also the earliest time a
/// toleration runs out, when one will (the Placement is decided again then).
pub(crate) fn candidates(
    placement: &Placement,
    inventory: &Inventory,
    decided: &BTreeSet<String>,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<(Candidates, Option<k8s_openapi::jiff::Timestamp>), Misconfigured> {
    validate_tolerations(&placement.spec.tolerations)?;
    let predicates = compile_predicates(placement)?;
    let available =
        match eligible_sets(placement, inventory).and_then(|sets| available(inventory, &sets)) {
            Ok(available) => available,
            Err(unsatisfied) => return Ok((Candidates::Unsatisfied(unsatisfied), None)),
        };
    let (selected, recheck) = select(placement, &predicates, available, decided, now);
    Ok((Candidates::Clusters(selected), recheck))
}

/// The Placement's `predicates`, compiled.
fn compile_predicates(placement: &Placement) -> Result<Vec<CompiledSelector>, Misconfigured> {
    placement
        .spec
        .predicates
        .iter()
        .enumerate()
        .map(|(i, p)| {
            CompiledSelector::new(
                &p.required_cluster_selector,
                &format!("spec.predicates[{i}]"),
            )
        })
        .collect()
}

/// The ManagedClusterSets bound to the Placement's namespace that it selects.
fn eligible_sets<'a>(
    placement: &Placement,
    inventory: &'a Inventory,
) -> Result<Vec<&'a String>, Unsatisfied> {
    // Bindings to a set that does not exist are not valid (OCM ignores them).
    let bound: BTreeSet<&String> = inventory
        .bound
        .iter()
        .filter(|name| inventory.sets.contains_key(*name))
        .collect();
    if bound.is_empty() {
        return Err(Unsatisfied {
            reason: "NoManagedClusterSetBindings",
            message: "No valid ManagedClusterSetBindings found in placement namespace".to_owned(),
        });
    }
    let wanted = &placement.spec.cluster_sets;
    let eligible: Vec<&String> = bound
        .into_iter()
        .filter(|name| wanted.is_empty() || wanted.contains(name))
        .collect();
    if eligible.is_empty() {
        return Err(Unsatisfied {
            reason: "NoIntersection",
            message: format!(
                "None of ManagedClusterSets [{}] is bound to placement namespace",
                wanted.join(",")
            ),
        });
    }
    Ok(eligible)
}

/// The clusters of `sets` not being deleted.
fn available<'a>(
    inventory: &'a Inventory,
    sets: &[&String],
) -> Result<Vec<&'a ManagedCluster>, Unsatisfied> {
    let available: Vec<&ManagedCluster> = inventory
        .clusters
        .values()
        .filter(|c| !c.deleting)
        .filter(|c| sets.iter().any(|set| inventory.sets[*set].contains(c)))
        .collect();
    if available.is_empty() {
        return Err(Unsatisfied {
            reason: "AllManagedClusterSetsEmpty",
            message: format!(
                "All ManagedClusterSets [{}] have no member ManagedCluster",
                sets.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        });
    }
    Ok(available)
}

/// The `available` clusters matching a predicate (any, when there are none)
/// whose taints are tolerated; and the earliest time a toleration runs out.
fn select(
    placement: &Placement,
    predicates: &[CompiledSelector],
    available: Vec<&ManagedCluster>,
    decided: &BTreeSet<String>,
    now: k8s_openapi::jiff::Timestamp,
) -> (
    BTreeMap<String, ManagedCluster>,
    Option<k8s_openapi::jiff::Timestamp>,
) {
    let mut recheck: Option<k8s_openapi::jiff::Timestamp> = None;
    let mut selected = BTreeMap::new();
    for cluster in available {
        if !predicates.is_empty() && !predicates.iter().any(|p| p.matches(cluster)) {
            continue;
        }
        match tolerated(
            cluster,
            &placement.spec.tolerations,
            decided.contains(&cluster.name),
            now,
        ) {
            Tolerated::No => continue,
            Tolerated::Until(at) => {
                recheck = Some(recheck.map_or(at, |r| r.min(at)));
            }
            Tolerated::Yes => {}
        }
        selected.insert(cluster.name.clone(), cluster.clone());
    }
    (selected, recheck)
}

/// OCM's checks of a toleration (the `tainttoleration` plugin).
fn validate_tolerations(tolerations: &[Toleration]) -> Result<(), Misconfigured> {
    for (i, t) in tolerations.iter().enumerate() {
        if t.key.is_empty() && t.operator != "Exists" {
            return Err(Misconfigured(format!(
                "spec.tolerations[{i}]: If the key is empty, operator must be Exists."
            )));
        }
        if t.operator == "Exists" && !t.value.is_empty() {
            return Err(Misconfigured(format!(
                "spec.tolerations[{i}]: If the operator is Exists, the value should be empty."
            )));
        }
    }
    Ok(())
}

enum Tolerated {
    Yes,
    /// Tolerated until then (a `tolerationSeconds` running).
    Until(k8s_openapi::jiff::Timestamp),
    No,
}

/// Whether every taint of `cluster` is tolerated: `PreferNoSelect` always,
/// `NoSelectIfNew` when the cluster is decided already, the others by a
/// matching toleration whose `tolerationSeconds` (from the taint's
/// `timeAdded`) has not run out.
fn tolerated(
    cluster: &ManagedCluster,
    tolerations: &[Toleration],
    in_decision: bool,
    now: k8s_openapi::jiff::Timestamp,
) -> Tolerated {
    let mut until: Option<k8s_openapi::jiff::Timestamp> = None;
    for taint in &cluster.taints {
        if taint.effect == "PreferNoSelect" || (taint.effect == "NoSelectIfNew" && in_decision) {
            continue;
        }
        let mut ok = false;
        for t in tolerations {
            if !t.effect.is_empty() && t.effect != taint.effect {
                continue;
            }
            if !t.key.is_empty() && t.key != taint.key {
                continue;
            }
            let matched = match t.operator.as_str() {
                "Exists" => true,
                // Empty means Equal.
                _ => t.value == taint.value,
            };
            if !matched {
                continue;
            }
            match (t.toleration_seconds, taint.time_added.as_deref()) {
                (Some(seconds), Some(added)) => {
                    let Ok(added) = added.parse::<k8s_openapi::jiff::Timestamp>() else {
                        continue;
                    };
                    let Ok(expires) =
                        added.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
                    else {
                        continue;
                    };
                    if now < expires {
                        until = Some(until.map_or(expires, |u| u.min(expires)));
                        ok = true;
                        break;
                    }
                }
                _ => {
                    ok = true;
                    break;
                }
            }
        }
        if !ok {
            return Tolerated::No;
        }
    }
    match until {
        Some(at) => Tolerated::Until(at),
        None => Tolerated::Yes,
    }
}

#[cfg(test)]
pub(crate) mod tests;
