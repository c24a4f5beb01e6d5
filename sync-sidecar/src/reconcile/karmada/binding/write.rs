//! The writes that bring a binding to a placement, as karmada-scheduler
//! makes them.

use serde_json::{Value, json};

use super::decide::Placement;
use super::model::{
    APPLIED_PLACEMENT_ANNOTATION, Binding, Reason, SCHEDULED, SUCCESS_MESSAGE, TargetCluster,
};

/// The writes that bring a binding to a placement (none when it has it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BindingWrite {
    /// JSON merge patch of the binding (annotation and `spec.clusters`).
    pub(crate) spec: Option<Value>,
    /// JSON merge patch of its `status` subresource.
    pub(crate) status: Option<Value>,
    /// The spec patch changes `spec.clusters` (not only the annotation).
    pub(crate) moves: bool,
    /// The Event to record on the binding and its template, when anything
    /// is written: type (`Normal`/`Warning`), reason, note.
    pub(crate) event: Option<(bool, &'static str, String)>,
}

impl BindingWrite {
    pub(crate) fn is_empty(&self) -> bool {
        self.spec.is_none() && self.status.is_none()
    }
}

/// `clusters` as Karmada prints them in its Events: `{a:3, b:3}`.
pub(crate) fn describe_clusters(clusters: &[TargetCluster]) -> String {
    let parts: Vec<String> = clusters
        .iter()
        .map(|c| format!("{}:{}", c.name, c.replicas))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// Plan the writes for `placement`; `now` is the current time (RFC 3339,
/// seconds, UTC), used for `lastScheduledTime` and a changed condition's
/// `lastTransitionTime`.
pub(crate) fn plan(binding: &Binding, placement: &Placement, now: &str) -> BindingWrite {
    let (spec, moves) = match placement {
        Placement::Clusters { clusters, .. } => spec_patch(binding, clusters),
        Placement::Failed { .. } => (None, false),
    };
    let condition = Condition::of(placement);
    let current = binding.scheduled_condition();
    let condition_changed = condition.differs_from(current);
    let status_due = condition_changed || scheduled_again(binding, placement, spec.is_some());
    let status = status_due.then(|| status_patch(binding, placement, &condition, now));
    let event = match placement {
        Placement::Clusters { clusters, .. } if spec.is_some() => Some((
            true,
            "ScheduleBindingSucceed",
            format!("{SUCCESS_MESSAGE} Result: {}", describe_clusters(clusters)),
        )),
        Placement::Failed { message, .. } if condition_changed => {
            Some((false, "ScheduleBindingFailed", message.clone()))
        }
        _ => None,
    };
    BindingWrite {
        spec,
        status,
        moves,
        event,
    }
}

/// The spec patch putting `binding` on `clusters` with its placement recorded
/// as applied, when either differs; and whether it moves the binding.
fn spec_patch(binding: &Binding, clusters: &[TargetCluster]) -> (Option<Value>, bool) {
    let applied = binding
        .spec
        .placement
        .as_ref()
        .map(Value::to_string)
        .unwrap_or_default();
    let applied_now = binding
        .metadata
        .annotations
        .get(APPLIED_PLACEMENT_ANNOTATION)
        .and_then(|a| serde_json::from_str::<Value>(a).ok());
    let placement_changed = applied_now.as_ref() != binding.spec.placement.as_ref();
    let moves = sorted(&binding.spec.clusters) != sorted(clusters);
    let spec = (placement_changed || moves).then(|| {
        json!({
            "metadata": {"annotations": {APPLIED_PLACEMENT_ANNOTATION: applied}},
            "spec": {"clusters": clusters},
        })
    });
    (spec, moves)
}

/// The `Scheduled` condition a placement gives its binding.
struct Condition {
    status: &'static str,
    reason: Reason,
    message: String,
}

impl Condition {
    fn of(placement: &Placement) -> Condition {
        let (status, reason, message) = match placement {
            Placement::Clusters { .. } => ("True", Reason::Success, SUCCESS_MESSAGE.to_owned()),
            Placement::Failed { reason, message } => ("False", *reason, message.clone()),
        };
        Condition {
            status,
            reason,
            message,
        }
    }

    /// Whether the binding's condition now (`current`) says otherwise.
    fn differs_from(&self, current: Option<&Value>) -> bool {
        let field = |name: &str| field(current, name);
        field("status") != Some(self.status)
            || field("reason") != Some(self.reason.as_str())
            || field("message") != Some(self.message.as_str())
    }

    /// As written over `current`: its transition time stays while its
    /// status does.
    fn to_json(&self, current: Option<&Value>, now: &str) -> Value {
        let transition = match (
            field(current, "status"),
            field(current, "lastTransitionTime"),
        ) {
            (Some(s), Some(at)) if s == self.status => at.to_owned(),
            _ => now.to_owned(),
        };
        json!({
            "type": SCHEDULED,
            "status": self.status,
            "reason": self.reason.as_str(),
            "message": self.message,
            "lastTransitionTime": transition,
        })
    }
}

fn field<'a>(condition: Option<&'a Value>, name: &str) -> Option<&'a str> {
    condition.and_then(|c| c.get(name)).and_then(Value::as_str)
}

/// The affinity term a successful placement was chosen from.
fn affinity(placement: &Placement) -> Option<&String> {
    match placement {
        Placement::Clusters {
            affinity: Some(name),
            ..
        } => Some(name),
        _ => None,
    }
}

/// Whether a successful placement is news to the binding's status (besides a
/// changed condition): the spec is written, the affinity term changed, the
/// generation is not observed yet, or a reschedule was asked for.
fn scheduled_again(binding: &Binding, placement: &Placement, spec_written: bool) -> bool {
    let succeeded = matches!(placement, Placement::Clusters { .. });
    let affinity = affinity(placement);
    let affinity_changed =
        affinity.is_some() && affinity != binding.status.scheduler_observed_affinity_name.as_ref();
    succeeded
        && (spec_written
            || affinity_changed
            || binding.status.scheduler_observed_generation != binding.metadata.generation
            || binding.reschedule_required())
}

/// The status patch: `condition` in place of the binding's `Scheduled` one,
/// and, after a success, what Karmada records of it.
fn status_patch(
    binding: &Binding,
    placement: &Placement,
    condition: &Condition,
    now: &str,
) -> Value {
    let mut conditions: Vec<Value> = binding
        .status
        .conditions
        .iter()
        .filter(|c| c.get("type").and_then(Value::as_str) != Some(SCHEDULED))
        .cloned()
        .collect();
    conditions.push(condition.to_json(binding.scheduled_condition(), now));
    let mut status = json!({"conditions": conditions});
    if matches!(placement, Placement::Clusters { .. }) {
        // Karmada sets these only once a schedule succeeded.
        status["schedulerObservedGeneration"] = json!(binding.metadata.generation);
        status["lastScheduledTime"] = json!(now);
    }
    if let Some(name) = affinity(placement) {
        status["schedulerObservingAffinityName"] = json!(name);
    }
    json!({ "status": status })
}

fn sorted(clusters: &[TargetCluster]) -> Vec<(&str, i32)> {
    let mut list: Vec<(&str, i32)> = clusters
        .iter()
        .map(|c| (c.name.as_str(), c.replicas))
        .collect();
    list.sort();
    list
}
