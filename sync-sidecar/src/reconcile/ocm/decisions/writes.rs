//! The writes that bring a Placement and its PlacementDecisions to an
//! outcome, and the Placement's status.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::grouping::{Desired, groups, new_object, objects};
use super::model::{ClusterDecision, Existing, MISCONFIGURED, Outcome, SATISFIED, decided};
use crate::reconcile::ocm::clusters::{ManagedCluster, Misconfigured};
use crate::reconcile::ocm::placement::Placement;

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
    /// The Events to record on the Placement: normal, reason, note.
    pub(crate) events: Vec<(bool, &'static str, String)>,
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
            left_out,
        } => {
            let satisfied = decided_condition(
                placement,
                chosen,
                *unscheduled,
                candidates,
                left_out,
                &mut write.events,
            );
            (chosen.clone(), satisfied)
        }
        Outcome::Unsatisfied(u) => (Vec::new(), condition(false, u.reason, &u.message)),
        Outcome::Denied(errors) => {
            return denied(placement, errors, current.len(), &not_honoured, now);
        }
        Outcome::Misconfigured(problem) => {
            return misconfigured(placement, problem, current.len(), now);
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
        keep_removed(&mut writing, existing, &removed);
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
    decision_writes(&mut write, placement, &desired, existing);
    if write.changes_decisions() {
        decision_update(&mut write, &writing, &target, &current, &added, &removed);
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

/// The `PlacementSatisfied` condition of a decided Placement (an Event when
/// workloads are left out and it changed).
fn decided_condition(
    placement: &Placement,
    chosen: &[ClusterDecision],
    unscheduled: usize,
    candidates: &[String],
    left_out: &[String],
    events: &mut Vec<(bool, &'static str, String)>,
) -> Value {
    if !left_out.is_empty() {
        let message = format!(
            "The placement policy reports errors for workloads of the Placement, which are left out: its other workloads decide it, and placement-policy's delivery guard refuses the ManifestWorks of those left out on every cluster: {}",
            left_out.join("; ")
        );
        let satisfied = condition(false, "PolicyDenied", &message);
        if changed(placement, SATISFIED, &satisfied) {
            events.push((false, "PolicyDenied", message));
        }
        satisfied
    } else if chosen.is_empty() && unscheduled == 0 && candidates.is_empty() {
        condition(
            false,
            "NoManagedClusterMatched",
            "No ManagedCluster matches any of the cluster predicate",
        )
    } else if chosen.is_empty() && unscheduled == 0 {
        condition(
            false,
            "NoManagedClusterMatched",
            &format!(
                "The placement policy allows none of the ManagedClusters the Placement selects ({})",
                candidates.join(", ")
            ),
        )
    } else if unscheduled > 0 {
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
    }
}

/// The policy reports errors: the Placement keeps its `kept` decisions and
/// only its status says why.
fn denied(
    placement: &Placement,
    errors: &[String],
    kept: usize,
    not_honoured: &[&str],
    now: &str,
) -> PlacementWrite {
    let mut write = PlacementWrite::default();
    let message = format!(
        "The placement policy reports errors, so the Placement keeps its {} decisions until the policy gives a valid one: {}",
        kept,
        errors.join("; ")
    );
    let satisfied = condition(false, "PolicyDenied", &message);
    write.placement_status = status_patch(
        placement,
        None,
        &[satisfied.clone(), configured(not_honoured)],
        now,
    );
    if changed(placement, SATISFIED, &satisfied) {
        write.events.push((false, "PolicyDenied", message));
    }
    write
}

/// The Placement's configuration cannot be honoured: it keeps its `kept`
/// decisions and only its status says why.
fn misconfigured(placement: &Placement, problem: &str, kept: usize, now: &str) -> PlacementWrite {
    let mut write = PlacementWrite::default();
    let message = format!("{problem}; the Placement keeps its {kept} decisions until it is fixed");
    let misconfigured = condition(true, "Misconfigured", &message);
    let satisfied = condition(false, "Misconfigured", &message);
    write.placement_status =
        status_patch(placement, None, &[satisfied, misconfigured.clone()], now);
    if changed(placement, MISCONFIGURED, &misconfigured) {
        write.events.push((false, "Misconfigured", message));
    }
    write
}

/// Add to `writing` the `removed` clusters' decisions as `existing` has them
/// (the first step of a change that adds and removes), sorted by cluster.
fn keep_removed(writing: &mut Vec<ClusterDecision>, existing: &[Existing], removed: &[&String]) {
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

/// The creates, status and label patches and deletes that turn `existing`
/// into `desired` (status patches that add clusters first).
fn decision_writes(
    write: &mut PlacementWrite,
    placement: &Placement,
    desired: &[Desired],
    existing: &[Existing],
) {
    let by_name: BTreeMap<&str, &Existing> =
        existing.iter().map(|e| (e.name.as_str(), e)).collect();
    let mut adding = Vec::new();
    let mut removing = Vec::new();
    for d in desired {
        let status = json!({"status": {"decisions": d.decisions}});
        let Some(e) = by_name.get(d.name.as_str()) else {
            write.create.push(new_object(placement, d));
            adding.push((d.name.clone(), status));
            continue;
        };
        if e.decisions != d.decisions {
            let before: BTreeSet<&String> = e.decisions.iter().map(|x| &x.cluster_name).collect();
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
    write.status = adding.into_iter().chain(removing).collect();
    write.delete = existing
        .iter()
        .filter(|e| !desired.iter().any(|d| d.name == e.name))
        .map(|e| e.name.clone())
        .collect();
}

/// The clusters the Placement has once `write` is stored, and its
/// `DecisionUpdate` Event.
fn decision_update(
    write: &mut PlacementWrite,
    writing: &[ClusterDecision],
    target: &BTreeSet<String>,
    current: &BTreeSet<String>,
    added: &[&String],
    removed: &[&String],
) {
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
            join(added),
            join(removed),
            join(&was)
        )
    } else {
        format!(
            "placement-policy decided [{}] (was [{}])",
            now_clusters.join(", "),
            join(&was)
        )
    };
    write.events.push((true, "DecisionUpdate", note));
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
