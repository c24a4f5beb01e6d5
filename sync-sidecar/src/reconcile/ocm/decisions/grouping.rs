//! Decision groups and the PlacementDecision objects that hold them, named,
//! labelled and owned as OCM's scheduler makes them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::model::{
    ClusterDecision, GROUP_INDEX_LABEL, GROUP_NAME_LABEL, MAX_DECISIONS_PER_OBJECT, PLACEMENT_LABEL,
};
use crate::reconcile::ocm::clusters::{CompiledSelector, ManagedCluster, Misconfigured};
use crate::reconcile::ocm::placement::{API_VERSION, Placement};

/// One decision group: its name (maybe empty) and clusters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Group {
    pub(crate) name: String,
    pub(crate) decisions: Vec<ClusterDecision>,
}

/// The group length of `clustersPerDecisionGroup` (a number, or a
/// percentage of the selected clusters; all of them by default).
fn group_length(per_group: Option<&IntOrString>, total: usize) -> Result<usize, Misconfigured> {
    let length = match per_group {
        None => total,
        Some(IntOrString::Int(n)) => usize::try_from(*n).unwrap_or(0),
        Some(IntOrString::String(text)) => {
            let percent = text
                .strip_suffix('%')
                .and_then(|p| p.parse::<f64>().ok())
                .ok_or_else(|| {
                    Misconfigured(format!(
                        "spec.decisionStrategy.groupStrategy.clustersPerDecisionGroup {text:?} invalid type: string is not a percentage"
                    ))
                })?;
            (percent / 100.0 * total as f64).ceil() as usize
        }
    };
    Ok(if length == 0 || length > total {
        total
    } else {
        length
    })
}

/// Divide the chosen clusters into decision groups, as OCM does: first the
/// clusters of each `decisionGroups` entry (by its selector), then the rest;
/// each divided further into groups of at most `clustersPerDecisionGroup`.
/// At least one (maybe empty) group.
pub(crate) fn groups(
    placement: &Placement,
    chosen: &[ClusterDecision],
    clusters: &BTreeMap<String, ManagedCluster>,
) -> Result<Vec<Group>, Misconfigured> {
    let strategy = &placement.spec.decision_strategy.group_strategy;
    let length = group_length(strategy.clusters_per_decision_group.as_ref(), chosen.len())?;
    let mut remaining: BTreeMap<&str, &ClusterDecision> = chosen
        .iter()
        .map(|d| (d.cluster_name.as_str(), d))
        .collect();
    let mut groups = Vec::new();
    let divide = |name: &str, matched: Vec<ClusterDecision>, groups: &mut Vec<Group>| {
        for slice in matched.chunks(length.max(1)) {
            groups.push(Group {
                name: name.to_owned(),
                decisions: slice.to_vec(),
            });
        }
    };
    for (i, group) in strategy.decision_groups.iter().enumerate() {
        let selector = CompiledSelector::new(
            &group.group_cluster_selector,
            &format!(
                "spec.decisionStrategy.groupStrategy.decisionGroups[{i}].groupClusterSelector"
            ),
        )?;
        let matched: Vec<ClusterDecision> = remaining
            .iter()
            .filter(|(name, _)| clusters.get(**name).is_some_and(|c| selector.matches(c)))
            .map(|(_, d)| (*d).clone())
            .collect();
        for d in &matched {
            remaining.remove(d.cluster_name.as_str());
        }
        divide(&group.group_name, matched, &mut groups);
    }
    let rest: Vec<ClusterDecision> = remaining.into_values().cloned().collect();
    divide("", rest, &mut groups);
    if groups.is_empty() {
        groups.push(Group {
            name: String::new(),
            decisions: Vec::new(),
        });
    }
    Ok(groups)
}

/// One PlacementDecision to have.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Desired {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) decisions: Vec<ClusterDecision>,
}

/// The PlacementDecisions of `groups` and the `decisionGroups` status.
pub(crate) fn objects(placement: &Placement, groups: &[Group]) -> (Vec<Desired>, Vec<Value>) {
    let mut index = 1;
    let mut objects = Vec::new();
    let mut status = Vec::new();
    for (group_index, group) in groups.iter().enumerate() {
        let mut slices: Vec<&[ClusterDecision]> =
            group.decisions.chunks(MAX_DECISIONS_PER_OBJECT).collect();
        if slices.is_empty() {
            slices.push(&[]);
        }
        let mut names = Vec::new();
        for slice in slices {
            let name = format!("{}-decision-{index}", placement.metadata.name);
            index += 1;
            objects.push(Desired {
                name: name.clone(),
                labels: [
                    (PLACEMENT_LABEL.to_owned(), placement.metadata.name.clone()),
                    (GROUP_NAME_LABEL.to_owned(), group.name.clone()),
                    (GROUP_INDEX_LABEL.to_owned(), group_index.to_string()),
                ]
                .into(),
                decisions: slice.to_vec(),
            });
            names.push(name);
        }
        status.push(json!({
            "decisionGroupIndex": group_index,
            "decisionGroupName": group.name,
            "decisions": names,
            "clusterCount": group.decisions.len(),
        }));
    }
    (objects, status)
}

/// The PlacementDecision object `desired` (without status) for `placement`.
pub(crate) fn new_object(placement: &Placement, desired: &Desired) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "PlacementDecision",
        "metadata": {
            "name": desired.name,
            "namespace": placement.metadata.namespace,
            "labels": desired.labels,
            "ownerReferences": [owner_reference(placement)],
        },
    })
}

/// A controller reference to the Placement (OCM's `NewControllerRef`).
pub(crate) fn owner_reference(placement: &Placement) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "Placement",
        "name": placement.metadata.name,
        "uid": placement.metadata.uid,
        "controller": true,
        "blockOwnerDeletion": true,
    })
}
