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
    let (status, reason, message) = match placement {
        Placement::Clusters { .. } => ("True", Reason::Success, SUCCESS_MESSAGE.to_owned()),
        Placement::Failed { reason, message } => ("False", *reason, message.clone()),
    };
    let mut spec = None;
    let mut moves = false;
    if let Placement::Clusters { clusters, .. } = placement {
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
        moves = sorted(&binding.spec.clusters) != sorted(clusters);
        if placement_changed || moves {
            spec = Some(json!({
                "metadata": {"annotations": {APPLIED_PLACEMENT_ANNOTATION: applied}},
                "spec": {"clusters": clusters},
            }));
        }
    }
    let current = binding.scheduled_condition();
    let field = |name: &str| current.and_then(|c| c.get(name)).and_then(Value::as_str);
    let condition_changed = field("status") != Some(status)
        || field("reason") != Some(reason.as_str())
        || field("message") != Some(message.as_str());
    let succeeded = matches!(placement, Placement::Clusters { .. });
    let affinity = match placement {
        Placement::Clusters {
            affinity: Some(name),
            ..
        } => Some(name),
        _ => None,
    };
    let affinity_changed =
        affinity.is_some() && affinity != binding.status.scheduler_observed_affinity_name.as_ref();
    let status_due = condition_changed
        || (succeeded
            && (spec.is_some()
                || affinity_changed
                || binding.status.scheduler_observed_generation != binding.metadata.generation
                || binding.reschedule_required()));
    let status_patch = status_due.then(|| {
        let transition = match (field("status"), field("lastTransitionTime")) {
            (Some(s), Some(at)) if s == status => at.to_owned(),
            _ => now.to_owned(),
        };
        let condition = json!({
            "type": SCHEDULED,
            "status": status,
            "reason": reason.as_str(),
            "message": message,
            "lastTransitionTime": transition,
        });
        let mut conditions: Vec<Value> = binding
            .status
            .conditions
            .iter()
            .filter(|c| c.get("type").and_then(Value::as_str) != Some(SCHEDULED))
            .cloned()
            .collect();
        conditions.push(condition);
        let mut status = json!({"conditions": conditions});
        if succeeded {
            // Karmada sets these only once a schedule succeeded.
            status["schedulerObservedGeneration"] = json!(binding.metadata.generation);
            status["lastScheduledTime"] = json!(now);
        }
        if let Some(name) = affinity {
            status["schedulerObservingAffinityName"] = json!(name);
        }
        json!({ "status": status })
    });
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
        status: status_patch,
        moves,
        event,
    }
}

fn sorted(clusters: &[TargetCluster]) -> Vec<(&str, i32)> {
    let mut list: Vec<(&str, i32)> = clusters
        .iter()
        .map(|c| (c.name.as_str(), c.replicas))
        .collect();
    list.sort();
    list
}
