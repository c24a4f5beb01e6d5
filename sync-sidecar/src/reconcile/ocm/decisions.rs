//! The PlacementDecisions of a Placement and its status, as OCM's scheduler
//! writes them (`pkg/placement/controllers/scheduling/scheduling_controller.go`):
//! the decided clusters divided into decision groups
//! (`decisionStrategy.groupStrategy`), each group into objects of at most 100
//! decisions named `<placement>-decision-<n>` (n from 1), labelled with the
//! Placement and the group, owned by the Placement; then
//! `numberOfSelectedClusters`, `decisionGroups` and the conditions
//! `PlacementSatisfied` and `PlacementMisconfigured`.
//!
//! Rules of our own, beside OCM's: a decision with errors, or a Placement
//! whose configuration cannot be honoured, changes no decision (its
//! conditions say why); a cluster is added before one is removed (a change
//! that does both first writes both, and removes once that is stored).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::clusters::{Candidates, CompiledSelector, ManagedCluster, Misconfigured, Unsatisfied};
use super::placement::{API_VERSION, Placement};
use super::policy::{Allowed, reason};

/// The label every consumer finds a Placement's decisions by.
pub(crate) const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";
pub(crate) const GROUP_INDEX_LABEL: &str =
    "cluster.open-cluster-management.io/decision-group-index";
pub(crate) const GROUP_NAME_LABEL: &str = "cluster.open-cluster-management.io/decision-group-name";
/// At most this many decisions in one PlacementDecision.
pub(crate) const MAX_DECISIONS_PER_OBJECT: usize = 100;

pub(crate) const SATISFIED: &str = "PlacementSatisfied";
pub(crate) const MISCONFIGURED: &str = "PlacementMisconfigured";

/// One decided cluster (`status.decisions[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClusterDecision {
    pub(crate) cluster_name: String,
    #[serde(default)]
    pub(crate) reason: String,
}

/// A PlacementDecision as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Existing {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) decisions: Vec<ClusterDecision>,
}

impl Existing {
    pub(crate) fn parse(json: &[u8]) -> Result<Existing, serde_json::Error> {
        #[derive(Deserialize)]
        struct Meta {
            name: String,
            #[serde(default)]
            labels: BTreeMap<String, String>,
        }
        #[derive(Deserialize, Default)]
        struct Status {
            #[serde(default)]
            decisions: Vec<ClusterDecision>,
        }
        #[derive(Deserialize)]
        struct Object {
            metadata: Meta,
            #[serde(default)]
            status: Status,
        }
        let object: Object = serde_json::from_slice(json)?;
        Ok(Existing {
            name: object.metadata.name,
            labels: object.metadata.labels,
            decisions: object.status.decisions,
        })
    }
}

/// The clusters a Placement has, over its PlacementDecisions.
pub(crate) fn decided(existing: &[Existing]) -> BTreeSet<String> {
    existing
        .iter()
        .flat_map(|e| &e.decisions)
        .filter(|d| !d.cluster_name.is_empty())
        .map(|d| d.cluster_name.clone())
        .collect()
}

/// What decides a Placement, before its decisions are planned.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// Clusters chosen (maybe none), and how many of `numberOfClusters`
    /// could not be.
    Decided {
        chosen: Vec<ClusterDecision>,
        unscheduled: usize,
        /// The candidates the Placement selected (for the message when the
        /// policy allows none of them).
        candidates: Vec<String>,
    },
    /// The Placement selects nothing (no bound set, ...): as OCM, its
    /// decisions are emptied.
    Unsatisfied(Unsatisfied),
    /// The policy reports errors: its decisions stay.
    Denied(Vec<String>),
    /// Its configuration cannot be honoured: its decisions stay.
    Misconfigured(String),
}

/// Choose the clusters of a Placement: its `candidates` the policy allows
/// (`allowed`; `Allowed::Undefined` is never passed here). With
/// `numberOfClusters`, the clusters it has come first (OCM's Steady), then
/// the policy's weight, then the name; the decisions are sorted by name
/// (OCM's default `sortBy`).
pub(crate) fn choose(
    placement: &Placement,
    candidates: Result<Candidates, Misconfigured>,
    allowed: &Allowed,
    current: &BTreeSet<String>,
) -> Outcome {
    let candidates = match candidates {
        Err(Misconfigured(message)) => return Outcome::Misconfigured(message),
        Ok(Candidates::Unsatisfied(u)) => return Outcome::Unsatisfied(u),
        Ok(Candidates::Clusters(c)) => c,
    };
    let allowed = match allowed {
        Allowed::Denied(errors) => return Outcome::Denied(errors.clone()),
        Allowed::Undefined => {
            return Outcome::Denied(vec!["the policy has no decision yet".into()]);
        }
        Allowed::Clusters(allowed) => allowed,
    };
    let mut feasible: Vec<(&String, u64)> = candidates
        .keys()
        .filter_map(|name| match allowed {
            None => Some((name, 0)),
            Some(allowed) => allowed.get(name).map(|c| (name, c.weight)),
        })
        .collect();
    let mut unscheduled = 0;
    if let Some(wanted) = placement.spec.number_of_clusters {
        let wanted = usize::try_from(wanted.max(0)).unwrap_or(0);
        feasible.sort_by(|(a, wa), (b, wb)| {
            current
                .contains(*b)
                .cmp(&current.contains(*a))
                .then(wb.cmp(wa))
                .then(a.cmp(b))
        });
        feasible.truncate(wanted);
        unscheduled = wanted.saturating_sub(feasible.len());
    }
    let mut chosen: Vec<ClusterDecision> = feasible
        .into_iter()
        .map(|(name, _)| ClusterDecision {
            cluster_name: name.clone(),
            reason: reason(allowed.as_ref().and_then(|a| a.get(name))),
        })
        .collect();
    chosen.sort_by(|a, b| a.cluster_name.cmp(&b.cluster_name));
    Outcome::Decided {
        chosen,
        unscheduled,
        candidates: candidates.into_keys().collect(),
    }
}

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

/// The writes that bring a Placement to its outcome.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PlacementWrite {
    /// PlacementDecisions to create (the whole object, without status),
    /// then to write the status of.
    pub(crate) create: Vec<Value>,
    /// Status subresource patches of PlacementDecisions, by name. Those that
    /// add clusters come first.
    pub(crate) status: Vec<(String, Value)>,
    /// Label patches of PlacementDecisions, by name.
    pub(crate) labels: Vec<(String, Value)>,
    /// PlacementDecisions to delete.
    pub(crate) delete: Vec<String>,
    /// JSON merge patch of the Placement's status subresource.
    pub(crate) placement_status: Option<Value>,
    /// The clusters it has once this is written (when they change).
    pub(crate) clusters: Option<Vec<String>>,
    /// The decisions it finally has, when the outcome decides them and this
    /// is no interim step (what the SIG-Multicluster decision publishes).
    pub(crate) decided: Option<Vec<ClusterDecision>>,
    /// The clusters the Placement has that the eventual change removes.
    pub(crate) removes: BTreeSet<String>,
    /// Only the first step of a change that adds and removes clusters: the
    /// removal follows once this is stored.
    pub(crate) interim: bool,
    /// The Event to record on the Placement: normal, reason, note.
    pub(crate) event: Option<(bool, &'static str, String)>,
}

impl PlacementWrite {
    pub(crate) fn is_empty(&self) -> bool {
        self.create.is_empty()
            && self.status.is_empty()
            && self.labels.is_empty()
            && self.delete.is_empty()
            && self.placement_status.is_none()
    }

    /// The changes of decisions only (no Placement status).
    pub(crate) fn changes_decisions(&self) -> bool {
        !(self.create.is_empty()
            && self.status.is_empty()
            && self.labels.is_empty()
            && self.delete.is_empty())
    }
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

/// Plan the writes for `outcome`: `existing` are the Placement's decisions
/// as stored, `clusters` the hub's ManagedClusters by name (for the group
/// selectors), `now` the time (RFC 3339) of a changed condition.
pub(crate) fn plan(
    placement: &Placement,
    outcome: &Outcome,
    existing: &[Existing],
    clusters: &BTreeMap<String, ManagedCluster>,
    now: &str,
) -> PlacementWrite {
    let current = decided(existing);
    let not_honoured = placement.not_honoured();
    let mut write = PlacementWrite::default();
    let (chosen, satisfied) = match outcome {
        Outcome::Decided {
            chosen,
            unscheduled,
            candidates,
        } => {
            let satisfied = if chosen.is_empty() && *unscheduled == 0 && candidates.is_empty() {
                condition(
                    false,
                    "NoManagedClusterMatched",
                    "No ManagedCluster matches any of the cluster predicate",
                )
            } else if chosen.is_empty() && *unscheduled == 0 {
                condition(
                    false,
                    "NoManagedClusterMatched",
                    &format!(
                        "The placement policy allows none of the ManagedClusters the Placement selects ({})",
                        candidates.join(", ")
                    ),
                )
            } else if *unscheduled > 0 {
                condition(
                    false,
                    "NotAllDecisionsScheduled",
                    &format!("{unscheduled} cluster decisions unscheduled"),
                )
            } else {
                condition(
                    true,
                    "AllDecisionsScheduled",
                    "All cluster decisions scheduled",
                )
            };
            (chosen.clone(), satisfied)
        }
        Outcome::Unsatisfied(u) => (Vec::new(), condition(false, u.reason, &u.message)),
        Outcome::Denied(errors) => {
            let message = format!(
                "The placement policy reports errors, so the Placement keeps its {} decisions until the policy gives a valid one: {}",
                current.len(),
                errors.join("; ")
            );
            let satisfied = condition(false, "PolicyDenied", &message);
            write.placement_status = status_patch(
                placement,
                None,
                &[satisfied.clone(), configured(&not_honoured)],
                now,
            );
            if changed(placement, SATISFIED, &satisfied) {
                write.event = Some((false, "PolicyDenied", message));
            }
            return write;
        }
        Outcome::Misconfigured(problem) => {
            let message = format!(
                "{problem}; the Placement keeps its {} decisions until it is fixed",
                current.len()
            );
            let misconfigured = condition(true, "Misconfigured", &message);
            let satisfied = condition(false, "Misconfigured", &message);
            write.placement_status =
                status_patch(placement, None, &[satisfied, misconfigured.clone()], now);
            if changed(placement, MISCONFIGURED, &misconfigured) {
                write.event = Some((false, "Misconfigured", message));
            }
            return write;
        }
    };
    let target: BTreeSet<String> = chosen.iter().map(|d| d.cluster_name.clone()).collect();
    let added: Vec<&String> = target.difference(&current).collect();
    let removed: Vec<&String> = current.difference(&target).collect();
    write.removes = removed.iter().map(|c| (*c).clone()).collect();
    write.interim = !added.is_empty() && !removed.is_empty();
    // A change that adds and removes first writes both.
    let mut writing = chosen;
    if write.interim {
        for e in existing {
            for d in &e.decisions {
                if removed.contains(&&d.cluster_name)
                    && !writing.iter().any(|w| w.cluster_name == d.cluster_name)
                {
                    writing.push(d.clone());
                }
            }
        }
        writing.sort_by(|a, b| a.cluster_name.cmp(&b.cluster_name));
    }
    let groups = match groups(placement, &writing, clusters) {
        Ok(groups) => groups,
        Err(Misconfigured(problem)) => {
            return plan(
                placement,
                &Outcome::Misconfigured(problem),
                existing,
                clusters,
                now,
            );
        }
    };
    let (desired, group_status) = objects(placement, &groups);
    let by_name: BTreeMap<&str, &Existing> =
        existing.iter().map(|e| (e.name.as_str(), e)).collect();
    let mut adding = Vec::new();
    let mut removing = Vec::new();
    for d in &desired {
        let status = json!({"status": {"decisions": d.decisions}});
        match by_name.get(d.name.as_str()) {
            None => {
                write.create.push(new_object(placement, d));
                adding.push((d.name.clone(), status));
            }
            Some(e) => {
                if e.decisions != d.decisions {
                    let before: BTreeSet<&String> =
                        e.decisions.iter().map(|x| &x.cluster_name).collect();
                    let adds = d
                        .decisions
                        .iter()
                        .any(|x| !before.contains(&x.cluster_name));
                    if adds {
                        adding.push((d.name.clone(), status));
                    } else {
                        removing.push((d.name.clone(), status));
                    }
                }
                let labels_differ = d.labels.iter().any(|(k, v)| e.labels.get(k) != Some(v));
                if labels_differ {
                    write
                        .labels
                        .push((d.name.clone(), json!({"metadata": {"labels": d.labels}})));
                }
            }
        }
    }
    write.status = adding.into_iter().chain(removing).collect();
    write.delete = existing
        .iter()
        .filter(|e| !desired.iter().any(|d| d.name == e.name))
        .map(|e| e.name.clone())
        .collect();
    if write.changes_decisions() {
        let now_clusters: Vec<String> = if write.interim {
            writing.iter().map(|d| d.cluster_name.clone()).collect()
        } else {
            target.iter().cloned().collect()
        };
        write.clusters = Some(now_clusters.clone());
        let was: Vec<&String> = current.iter().collect();
        let note = if write.interim {
            format!(
                "placement-policy decided [{}]; added [{}] first, removes [{}] next (was [{}])",
                target.iter().cloned().collect::<Vec<_>>().join(", "),
                added
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                removed
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                join(&was)
            )
        } else {
            format!(
                "placement-policy decided [{}] (was [{}])",
                now_clusters.join(", "),
                join(&was)
            )
        };
        write.event = Some((true, "DecisionUpdate", note));
    }
    // The status follows the decisions once they are final.
    if !write.interim {
        write.decided = Some(
            writing
                .iter()
                .filter(|d| target.contains(&d.cluster_name))
                .cloned()
                .collect(),
        );
        write.placement_status = status_patch(
            placement,
            Some((target.len(), group_status)),
            &[satisfied, configured(&not_honoured)],
            now,
        );
    }
    write
}

fn join(names: &[&String]) -> String {
    names
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `PlacementMisconfigured` of a Placement decided here: what it asks that
/// is not honoured, or OCM's "check pass".
fn configured(not_honoured: &[&str]) -> Value {
    if not_honoured.is_empty() {
        condition(
            false,
            "Succeedconfigured",
            "Placement configurations check pass",
        )
    } else {
        condition(
            true,
            "NotHonoured",
            &format!(
                "placement-policy decides this Placement and does not honour {}: the placement policy's weights rank the clusters",
                not_honoured.join(", ")
            ),
        )
    }
}

/// A condition without its transition time.
fn condition(status: bool, reason: &str, message: &str) -> Value {
    json!({
        "status": if status { "True" } else { "False" },
        "reason": reason,
        "message": message,
    })
}

/// Whether `wanted`, of type `type_`, differs from what the Placement has.
fn changed(placement: &Placement, type_: &str, wanted: &Value) -> bool {
    let current = placement.condition(type_);
    let field = |name: &str| current.and_then(|c| c.get(name));
    field("status") != wanted.get("status")
        || field("reason") != wanted.get("reason")
        || field("message") != wanted.get("message")
}

/// The status patch of the Placement (none when it has that status):
/// `selected` the number of selected clusters and the decision groups
/// (`None`: kept as they are), `conditions` `[PlacementSatisfied,
/// PlacementMisconfigured]`; a condition keeps its transition time while its
/// status stays.
fn status_patch(
    placement: &Placement,
    selected: Option<(usize, Vec<Value>)>,
    conditions: &[Value; 2],
    now: &str,
) -> Option<Value> {
    let mut all: Vec<Value> = placement
        .status
        .conditions
        .iter()
        .filter(|c| {
            let t = c.get("type").and_then(Value::as_str);
            t != Some(SATISFIED) && t != Some(MISCONFIGURED)
        })
        .cloned()
        .collect();
    let mut unchanged = true;
    for (type_, wanted) in [SATISFIED, MISCONFIGURED].into_iter().zip(conditions) {
        let current = placement.condition(type_);
        let field = |name: &str| current.and_then(|c| c.get(name));
        let same = field("status") == wanted.get("status")
            && field("reason") == wanted.get("reason")
            && field("message") == wanted.get("message");
        unchanged &= same;
        let transition = match (field("status"), field("lastTransitionTime")) {
            (Some(s), Some(at)) if Some(s) == wanted.get("status") => at.clone(),
            _ => json!(now),
        };
        let mut condition = json!({"type": type_, "lastTransitionTime": transition});
        for key in ["status", "reason", "message"] {
            condition[key] = wanted[key].clone();
        }
        all.push(condition);
    }
    let mut status = json!({"conditions": all});
    if let Some((count, groups)) = selected {
        unchanged &= placement.status.number_of_selected_clusters == count as i64
            && placement.status.decision_groups == groups;
        status["numberOfSelectedClusters"] = json!(count);
        status["decisionGroups"] = json!(groups);
    }
    (!unchanged).then(|| json!({"status": status}))
}

#[cfg(test)]
mod tests;
