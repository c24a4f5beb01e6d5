//! A Karmada ResourceBinding or ClusterResourceBinding as the scheduler reads
//! it, and what scheduling writes into it: exactly what karmada-scheduler
//! writes (`pkg/scheduler/scheduler.go`): `spec.clusters`, the
//! `policy.karmada.io/applied-placement` annotation, the `Scheduled`
//! condition, `status.schedulerObservedGeneration` and
//! `status.lastScheduledTime`, and nothing else.

use std::collections::BTreeMap;

use policy_client::Decision;
use policy_client::karmada::{PREFERENCES_ANNOTATION, TemplateRef};
use policy_client::placement::desired_annotations;
use policy_client::{OwnershipKeys, QueryOutcome};
use serde::Deserialize;
use serde_json::{Value, json};

use super::affinity::{matches, untolerated_taint};
use super::division::{ClusterPreference, DivisionError, divide};
use crate::config::writers::KarmadaSettings;

/// The annotation holding the placement a binding was scheduled with (the
/// taint manager evicts only bindings that carry it).
pub(crate) const APPLIED_PLACEMENT_ANNOTATION: &str = "policy.karmada.io/applied-placement";
/// The binding's condition type of scheduling.
pub(crate) const SCHEDULED: &str = "Scheduled";
/// karmada-scheduler's message of a successful schedule.
pub(crate) const SUCCESS_MESSAGE: &str = "Binding has been scheduled successfully.";

/// karmada-scheduler's condition reasons (`workv1alpha2.BindingReason*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    Success,
    /// The policy reports errors: no cluster fits the workload.
    NoClusterFit,
    /// The replicas cannot be divided as the policy's preferences ask.
    Unschedulable,
    /// The decision cannot be used (invalid, or no placement at all).
    SchedulerError,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Success => "Success",
            Reason::NoClusterFit => "NoClusterFit",
            Reason::Unschedulable => "Unschedulable",
            Reason::SchedulerError => "SchedulerError",
        }
    }
}

/// One cluster of `spec.clusters`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
pub(crate) struct TargetCluster {
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) replicas: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    generation: i64,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    deletion_timestamp: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Eviction {
    from_cluster: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Suspension {
    #[serde(default)]
    scheduling: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    resource: TemplateRef,
    #[serde(default)]
    replicas: i32,
    #[serde(default)]
    replica_requirements: Option<Value>,
    #[serde(default)]
    components: Vec<Value>,
    #[serde(default)]
    clusters: Vec<TargetCluster>,
    #[serde(default)]
    placement: Option<Value>,
    #[serde(default)]
    graceful_eviction_tasks: Vec<Eviction>,
    #[serde(default)]
    scheduler_name: Option<String>,
    #[serde(default)]
    reschedule_triggered_at: Option<String>,
    #[serde(default)]
    suspension: Option<Suspension>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    scheduler_observed_generation: i64,
    /// Karmada's `SchedulerObservedAffinityName` (its JSON name differs).
    #[serde(default, rename = "schedulerObservingAffinityName")]
    scheduler_observed_affinity_name: Option<String>,
    #[serde(default)]
    last_scheduled_time: Option<String>,
    #[serde(default)]
    conditions: Vec<Value>,
}

/// A binding, decoded from the JSON the watch holds.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Binding {
    metadata: Meta,
    spec: Spec,
    #[serde(default)]
    status: Status,
}

/// What placement-sync does with a binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// It names our scheduler: the policy decides its clusters.
    Schedule,
    /// Another scheduler's (karmada-scheduler's): the guardrail keeps its
    /// placement narrowed to the clusters the policy allows.
    Guard,
}

impl Binding {
    pub(crate) fn parse(json: &[u8]) -> Result<Binding, serde_json::Error> {
        serde_json::from_slice(json)
    }

    pub(crate) fn template(&self) -> &TemplateRef {
        &self.spec.resource
    }

    pub(crate) fn resource_version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }

    pub(crate) fn clusters(&self) -> &[TargetCluster] {
        &self.spec.clusters
    }

    /// What `settings` make placement-sync do with the binding now; `None`:
    /// nothing (another scheduler's binding without the guardrail, one being
    /// deleted, our own with scheduling suspended or without a placement).
    pub(crate) fn mode(&self, settings: &KarmadaSettings) -> Option<Mode> {
        if self.metadata.deletion_timestamp.is_some() {
            return None;
        }
        if self.spec.scheduler_name.as_deref() != Some(settings.scheduler_name.as_str()) {
            return settings.guard.then_some(Mode::Guard);
        }
        let suspended = self
            .spec
            .suspension
            .as_ref()
            .and_then(|s| s.scheduling)
            .unwrap_or(false);
        (settings.schedule && !suspended && self.spec.placement.is_some()).then_some(Mode::Schedule)
    }

    /// A reschedule was asked for (`spec.rescheduleTriggeredAt` after
    /// `status.lastScheduledTime`; Karmada's `RescheduleRequired`). Both are
    /// RFC 3339 times in UTC of the same precision, so they order as strings.
    fn reschedule_required(&self) -> bool {
        match (
            &self.spec.reschedule_triggered_at,
            &self.status.last_scheduled_time,
        ) {
            (Some(_), None) => true,
            (Some(asked), Some(last)) => asked > last,
            (None, _) => false,
        }
    }

    fn is_divided_workload(&self) -> bool {
        let workload = (self.spec.replicas > 0 || self.spec.replica_requirements.is_some())
            && self.spec.components.len() <= 1;
        let divided = self
            .spec
            .placement
            .as_ref()
            .and_then(|p| p.pointer("/replicaScheduling/replicaSchedulingType"))
            .and_then(Value::as_str)
            == Some("Divided");
        workload && divided
    }

    fn is_workload(&self) -> bool {
        (self.spec.replicas > 0 || self.spec.replica_requirements.is_some())
            && self.spec.components.len() <= 1
    }

    /// The scheduled condition as the binding has it.
    fn scheduled_condition(&self) -> Option<&Value> {
        self.status
            .conditions
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(SCHEDULED))
    }
}

/// Where the policy puts a binding: its clusters, or why it cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    Clusters {
        clusters: Vec<TargetCluster>,
        /// The `clusterAffinities` term they were chosen from (Karmada's
        /// `schedulerObservingAffinityName`), when the placement has terms.
        affinity: Option<String>,
    },
    Failed {
        reason: Reason,
        message: String,
    },
}

impl Placement {
    fn failed(reason: Reason, message: impl Into<String>) -> Placement {
        Placement::Failed {
            reason,
            message: message.into(),
        }
    }
}

/// The placement the decision gives `binding`. `template` is the resource
/// template as stored; `clusters` are Karmada's Cluster objects replicated,
/// by name, when they are (the policy may name no others; the user's
/// placement selects among them by their labels, fields and taints).
pub(crate) fn placement(
    binding: &Binding,
    template: &Value,
    outcome: &QueryOutcome,
    keys: &OwnershipKeys,
    clusters: Option<&BTreeMap<String, Value>>,
) -> Option<Placement> {
    let result = match outcome {
        // No decision yet (the engine is not in sync): nothing to write.
        QueryOutcome::Undefined => return None,
        QueryOutcome::Defined(result) => result,
    };
    let decision = match Decision::from_result(result) {
        Ok(decision) => decision,
        Err(e) => return Some(Placement::failed(Reason::SchedulerError, e.to_string())),
    };
    // A decision with errors never changes a placement: the binding keeps
    // its clusters, and its condition says why it is not scheduled.
    if decision.is_denied() {
        return Some(Placement::failed(
            Reason::NoClusterFit,
            decision.errors.join("; "),
        ));
    }
    // The template's annotations as the webhook would write them: the
    // policy's values over the developer's.
    let annotations = match desired_annotations(template, &decision, keys) {
        Ok(a) => a,
        Err(e) => return Some(Placement::failed(Reason::SchedulerError, e.to_string())),
    };
    let Some(preferences) = annotations.get(PREFERENCES_ANNOTATION) else {
        return Some(Placement::failed(
            Reason::NoClusterFit,
            format!(
                "the placement policy gives this {} no placement (no {PREFERENCES_ANNOTATION})",
                binding.spec.resource.kind
            ),
        ));
    };
    Some(clusters_from(
        binding,
        preferences,
        clusters,
        decision.policy_weights,
    ))
}

#[derive(Debug, Deserialize)]
struct ReplicaSetPreferences {
    clusters: BTreeMap<String, ClusterPreference>,
}

/// Where guardrail mode is the answer: a field of the user's placement this
/// scheduler does not implement, named.
fn unimplemented_field(placement: &Value, workload: bool) -> Option<&'static str> {
    let present = |pointer: &str| {
        placement
            .pointer(pointer)
            .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
    };
    if present("/spreadConstraints") {
        return Some("spreadConstraints");
    }
    if present("/workloadAffinity") {
        return Some("workloadAffinity");
    }
    if let Some(terms) = placement.get("clusterAffinities").and_then(Value::as_array)
        && terms.iter().any(|t| {
            t.get("overflowAffinities")
                .and_then(Value::as_array)
                .is_some_and(|o| !o.is_empty())
        })
    {
        return Some("clusterAffinities[].overflowAffinities");
    }
    if !workload {
        return None;
    }
    if present("/replicaScheduling/weightPreference/dynamicWeight") {
        return Some("replicaScheduling.weightPreference.dynamicWeight");
    }
    let divided = placement
        .pointer("/replicaScheduling/replicaSchedulingType")
        .and_then(Value::as_str)
        == Some("Divided");
    let aggregated = placement
        .pointer("/replicaScheduling/replicaDivisionPreference")
        .and_then(Value::as_str)
        == Some("Aggregated");
    (divided && aggregated).then_some("replicaScheduling.replicaDivisionPreference: Aggregated")
}

fn clusters_from(
    binding: &Binding,
    preferences: &str,
    clusters: Option<&BTreeMap<String, Value>>,
    policy_weights: bool,
) -> Placement {
    let mut preferences = match serde_json::from_str::<ReplicaSetPreferences>(preferences) {
        Ok(p) => p.clusters,
        Err(e) => {
            return Placement::failed(
                Reason::SchedulerError,
                format!("the policy's {PREFERENCES_ANNOTATION} cannot be read: {e}"),
            );
        }
    };
    if preferences.contains_key("*") {
        return Placement::failed(
            Reason::SchedulerError,
            format!(
                "the policy's {PREFERENCES_ANNOTATION} uses the \"*\" cluster, which a Karmada binding cannot take: name the clusters"
            ),
        );
    }
    if let Some(known) = clusters {
        let unknown: Vec<&str> = preferences
            .keys()
            .filter(|name| !known.contains_key(*name))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Placement::failed(
                Reason::SchedulerError,
                format!(
                    "the policy names clusters Karmada does not have: {}",
                    unknown.join(", ")
                ),
            );
        }
    }
    let user = binding.spec.placement.clone().unwrap_or(Value::Null);
    if let Some(field) = unimplemented_field(&user, binding.is_workload()) {
        return Placement::failed(
            Reason::SchedulerError,
            format!(
                "placement-policy's scheduler does not implement {field}: run this PropagationPolicy with karmada-scheduler and placement-policy's guardrail (docs/karmada.md#guardrail-mode), which keeps every karmada-scheduler feature within the clusters the policy allows"
            ),
        );
    }
    // Clusters being evicted from are no candidates (Karmada's
    // ClusterEviction filter).
    for task in &binding.spec.graceful_eviction_tasks {
        preferences.remove(&task.from_cluster);
    }
    if preferences.is_empty() {
        return Placement::failed(
            Reason::NoClusterFit,
            "every cluster the policy allows is being evicted from",
        );
    }
    let (preferences, affinity) = match users_choice(binding, &user, preferences, clusters) {
        Ok(chosen) => chosen,
        Err(message) => return Placement::failed(Reason::NoClusterFit, message),
    };
    let scheduled = |clusters: Vec<TargetCluster>| Placement::Clusters {
        clusters,
        affinity: affinity.clone(),
    };
    if !binding.is_workload() {
        // Non-workloads go to every cluster, without replicas.
        return scheduled(
            preferences
                .into_keys()
                .map(|name| TargetCluster { name, replicas: 0 })
                .collect(),
        );
    }
    if !binding.is_divided_workload() {
        // Duplicated: every cluster runs all replicas.
        return scheduled(
            preferences
                .into_keys()
                .map(|name| TargetCluster {
                    name,
                    replicas: binding.spec.replicas,
                })
                .collect(),
        );
    }
    let preferences = if policy_weights {
        preferences
    } else {
        with_static_weights(&user, preferences, clusters)
    };
    match divide(
        binding.spec.replicas,
        &preferences,
        &binding.spec.resource.uid,
    ) {
        Ok(division) => scheduled(
            division
                .into_iter()
                .map(|(name, replicas)| TargetCluster { name, replicas })
                .collect(),
        ),
        Err(e @ DivisionError::Negative { .. }) => {
            Placement::failed(Reason::SchedulerError, e.to_string())
        }
        Err(e) => Placement::failed(Reason::Unschedulable, e.to_string()),
    }
}

/// The policy's clusters the user's placement selects (karmada-scheduler's
/// filters inside the policy's allowed set): its `clusterAffinity`, or the
/// first of its `clusterAffinities` terms (from the one observed last, as
/// karmada-scheduler goes on from it) that selects any, and its
/// `clusterTolerations`. With the term's name; an error message when none fits.
fn users_choice(
    binding: &Binding,
    user: &Value,
    preferences: BTreeMap<String, ClusterPreference>,
    clusters: Option<&BTreeMap<String, Value>>,
) -> Result<(BTreeMap<String, ClusterPreference>, Option<String>), String> {
    let object = |name: &str| -> Value {
        clusters
            .and_then(|c| c.get(name).cloned())
            .unwrap_or_else(|| json!({"metadata": {"name": name}}))
    };
    let tolerations = user
        .get("clusterTolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut untolerated = Vec::new();
    let candidates: BTreeMap<String, ClusterPreference> = preferences
        .into_iter()
        .filter(|(name, _)| {
            // A cluster the binding is on already stays a candidate
            // (Karmada's TaintToleration filter).
            if binding.spec.clusters.iter().any(|c| &c.name == name) {
                return true;
            }
            match untolerated_taint(&object(name), &tolerations) {
                Some(taint) => {
                    untolerated.push(format!("{name} ({taint})"));
                    false
                }
                None => true,
            }
        })
        .collect();
    let allowed = candidates.keys().cloned().collect::<Vec<_>>().join(", ");
    let fitting = |affinity: &Value| -> BTreeMap<String, ClusterPreference> {
        candidates
            .iter()
            .filter(|(name, _)| matches(&object(name), affinity))
            .map(|(name, p)| (name.clone(), *p))
            .collect()
    };
    let why = |what: &str| {
        let mut message = format!(
            "no cluster the placement policy allows ({}) matches the placement's {what}",
            if allowed.is_empty() {
                "none left"
            } else {
                &allowed
            }
        );
        if !untolerated.is_empty() {
            message.push_str(&format!("; untolerated taints: {}", untolerated.join(", ")));
        }
        message
    };
    let terms = user
        .get("clusterAffinities")
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty());
    if let Some(terms) = terms {
        let observed = binding.status.scheduler_observed_affinity_name.as_deref();
        let start = if binding.reschedule_required() {
            0
        } else {
            terms
                .iter()
                .position(|t| t.get("affinityName").and_then(Value::as_str) == observed)
                .unwrap_or(0)
        };
        for term in &terms[start..] {
            let fit = fitting(term);
            if !fit.is_empty() {
                let name = term
                    .get("affinityName")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                return Ok((fit, name));
            }
        }
        let names: Vec<&str> = terms[start..]
            .iter()
            .filter_map(|t| t.get("affinityName").and_then(Value::as_str))
            .collect();
        return Err(why(&format!(
            "clusterAffinities (tried {})",
            names.join(", ")
        )));
    }
    let fit = match user.get("clusterAffinity").filter(|a| !a.is_null()) {
        Some(affinity) => fitting(affinity),
        None => candidates.clone(),
    };
    if fit.is_empty() {
        return Err(why("clusterAffinity and clusterTolerations"));
    }
    Ok((fit, None))
}

/// The user's `staticWeightList` over the policy's even weights (Karmada's
/// rule: a cluster's weight is the largest of the rules that select it; a
/// cluster no rule selects gets none; when none gets any, all weigh alike).
/// The policy's `minReplicas`/`maxReplicas` stay.
fn with_static_weights(
    user: &Value,
    mut preferences: BTreeMap<String, ClusterPreference>,
    clusters: Option<&BTreeMap<String, Value>>,
) -> BTreeMap<String, ClusterPreference> {
    let Some(rules) = user
        .pointer("/replicaScheduling/weightPreference/staticWeightList")
        .and_then(Value::as_array)
        .filter(|r| !r.is_empty())
    else {
        return preferences;
    };
    for (name, preference) in preferences.iter_mut() {
        let object = clusters
            .and_then(|c| c.get(name).cloned())
            .unwrap_or_else(|| json!({"metadata": {"name": name}}));
        preference.weight = rules
            .iter()
            .filter(|rule| {
                rule.get("targetCluster")
                    .is_some_and(|target| matches(&object, target))
            })
            .filter_map(|rule| rule.get("weight").and_then(Value::as_i64))
            .max()
            .unwrap_or(0);
    }
    preferences
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> &'static OwnershipKeys {
        static KEYS: std::sync::OnceLock<OwnershipKeys> = std::sync::OnceLock::new();
        KEYS.get_or_init(|| OwnershipKeys::ephemeral().unwrap())
    }

    fn binding(spec: Value, status: Value) -> (Value, Binding) {
        let mut spec = spec;
        let defaults = json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop",
                         "name": "web", "uid": "a"},
            "schedulerName": "placement-policy",
            "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided",
                                                "replicaDivisionPreference": "Weighted"}},
        });
        for (k, v) in defaults.as_object().unwrap() {
            if spec.get(k).is_none() {
                spec[k] = v.clone();
            }
        }
        let raw = json!({
            "apiVersion": "work.karmada.io/v1alpha2",
            "kind": "ResourceBinding",
            "metadata": {"name": "web-deployment", "namespace": "shop", "generation": 2,
                         "resourceVersion": "10"},
            "spec": spec,
            "status": status,
        });
        let parsed = Binding::parse(raw.to_string().as_bytes()).unwrap();
        (raw, parsed)
    }

    fn decision(prefs: Value, errors: &[&str]) -> QueryOutcome {
        QueryOutcome::Defined(json!({
            "annotations": {PREFERENCES_ANNOTATION: prefs},
            "errors": errors,
        }))
    }

    fn template() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "shop", "uid": "a"}})
    }

    fn targets(pairs: &[(&str, i32)]) -> Vec<TargetCluster> {
        pairs
            .iter()
            .map(|(n, r)| TargetCluster {
                name: n.to_string(),
                replicas: *r,
            })
            .collect()
    }

    fn scheduled(pairs: &[(&str, i32)]) -> Placement {
        Placement::Clusters {
            clusters: targets(pairs),
            affinity: None,
        }
    }

    const EU: &str =
        r#"{"clusters":{"member-eu-1":{"weight":1},"member-eu-2":{"weight":1}},"rebalance":true}"#;

    #[test]
    fn the_policys_weights_divide_the_replicas() {
        let (_, b) = binding(json!({"replicas": 6}), json!({}));
        let placed = placement(&b, &template(), &decision(json!(EU), &[]), keys(), None);
        assert_eq!(
            placed,
            Some(scheduled(&[("member-eu-1", 3), ("member-eu-2", 3)]))
        );
    }

    #[test]
    fn duplicated_and_non_workloads_follow_karmada() {
        let (_, dup) = binding(
            json!({"replicas": 4, "placement": {"replicaScheduling": {"replicaSchedulingType": "Duplicated"}}}),
            json!({}),
        );
        assert_eq!(
            placement(&dup, &template(), &decision(json!(EU), &[]), keys(), None),
            Some(scheduled(&[("member-eu-1", 4), ("member-eu-2", 4)]))
        );
        let (_, config) = binding(json!({"placement": {}}), json!({}));
        assert_eq!(
            placement(
                &config,
                &template(),
                &decision(json!(EU), &[]),
                keys(),
                None
            ),
            Some(scheduled(&[("member-eu-1", 0), ("member-eu-2", 0)]))
        );
    }

    #[test]
    fn errors_fail_the_schedule_and_keep_the_clusters() {
        let (_, b) = binding(
            json!({"replicas": 6, "clusters": [{"name": "member-eu-1", "replicas": 6}]}),
            json!({}),
        );
        let failed = placement(
            &b,
            &template(),
            &decision(
                json!(EU),
                &["no cluster satisfies the placement requirements"],
            ),
            keys(),
            None,
        )
        .unwrap();
        assert_eq!(
            failed,
            Placement::Failed {
                reason: Reason::NoClusterFit,
                message: "no cluster satisfies the placement requirements".into()
            }
        );
        let write = plan(&b, &failed, "2026-11-25T10:00:00Z");
        assert_eq!(write.spec, None, "the clusters stay");
        let status = write.status.unwrap();
        let condition = &status["status"]["conditions"][0];
        assert_eq!(condition["status"], "False");
        assert_eq!(condition["reason"], "NoClusterFit");
        assert!(
            status["status"]
                .get("schedulerObservedGeneration")
                .is_none()
        );
        assert_eq!(write.event.unwrap().1, "ScheduleBindingFailed");
    }

    #[test]
    fn undefined_writes_nothing_and_bad_shapes_are_scheduler_errors() {
        let (_, b) = binding(json!({"replicas": 1}), json!({}));
        assert_eq!(
            placement(&b, &template(), &QueryOutcome::Undefined, keys(), None),
            None
        );
        let bad = placement(
            &b,
            &template(),
            &decision(json!("not json"), &[]),
            keys(),
            None,
        );
        assert!(matches!(
            bad,
            Some(Placement::Failed {
                reason: Reason::SchedulerError,
                ..
            })
        ));
        let none = QueryOutcome::Defined(json!({"annotations": {}, "errors": []}));
        assert!(matches!(
            placement(&b, &template(), &none, keys(), None),
            Some(Placement::Failed {
                reason: Reason::NoClusterFit,
                ..
            })
        ));
        let star = decision(json!({"clusters": {"*": {"weight": 1}}}), &[]);
        assert!(matches!(
            placement(&b, &template(), &star, keys(), None),
            Some(Placement::Failed {
                reason: Reason::SchedulerError,
                ..
            })
        ));
        let known: BTreeMap<String, Value> = [("member-eu-1".to_owned(), json!({}))].into();
        let Some(Placement::Failed { message, .. }) = placement(
            &b,
            &template(),
            &decision(json!(EU), &[]),
            keys(),
            Some(&known),
        ) else {
            panic!("an unknown cluster fails")
        };
        assert!(message.contains("member-eu-2"), "{message}");
    }

    #[test]
    fn clusters_being_evicted_from_are_left_out() {
        let (_, b) = binding(
            json!({"replicas": 6, "gracefulEvictionTasks": [{"fromCluster": "member-eu-2",
                   "reason": "TaintUntolerated", "producer": "TaintManager"}]}),
            json!({}),
        );
        assert_eq!(
            placement(&b, &template(), &decision(json!(EU), &[]), keys(), None),
            Some(scheduled(&[("member-eu-1", 6)]))
        );
    }

    #[test]
    fn a_new_placement_writes_spec_status_and_an_event() {
        let (raw, b) = binding(json!({"replicas": 6}), json!({}));
        let placed = scheduled(&[("member-eu-1", 3), ("member-eu-2", 3)]);
        let write = plan(&b, &placed, "2026-11-25T10:00:00Z");
        assert!(write.moves);
        let spec = write.spec.unwrap();
        assert_eq!(
            spec["spec"]["clusters"],
            json!([{"name": "member-eu-1", "replicas": 3}, {"name": "member-eu-2", "replicas": 3}])
        );
        let applied: Value = serde_json::from_str(
            spec["metadata"]["annotations"][APPLIED_PLACEMENT_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(applied, raw["spec"]["placement"]);
        let status = write.status.unwrap();
        assert_eq!(status["status"]["schedulerObservedGeneration"], 2);
        assert_eq!(
            status["status"]["lastScheduledTime"],
            "2026-11-25T10:00:00Z"
        );
        assert_eq!(status["status"]["conditions"][0]["reason"], "Success");
        let (normal, reason, note) = write.event.unwrap();
        assert!(normal);
        assert_eq!(reason, "ScheduleBindingSucceed");
        assert!(
            note.ends_with("Result: {member-eu-1:3, member-eu-2:3}"),
            "{note}"
        );
    }

    #[test]
    fn nothing_is_written_when_nothing_changes() {
        let placement_json = json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
                                    "replicaDivisionPreference": "Weighted"}});
        let (_, b) = binding(
            json!({"replicas": 6, "clusters": [{"name": "member-eu-2", "replicas": 3},
                                               {"name": "member-eu-1", "replicas": 3}]}),
            json!({"schedulerObservedGeneration": 2, "lastScheduledTime": "2026-11-25T09:00:00Z",
                   "conditions": [{"type": "Scheduled", "status": "True", "reason": "Success",
                                   "message": SUCCESS_MESSAGE,
                                   "lastTransitionTime": "2026-11-25T09:00:00Z"}]}),
        );
        let mut b = b;
        b.metadata.annotations.insert(
            APPLIED_PLACEMENT_ANNOTATION.to_owned(),
            placement_json.to_string(),
        );
        let placed = scheduled(&[("member-eu-1", 3), ("member-eu-2", 3)]);
        let write = plan(&b, &placed, "2026-11-25T10:00:00Z");
        assert!(write.is_empty(), "{write:?}");
        // Another placement (a new PropagationPolicy) with the same clusters:
        // the annotation is written, no replica moves.
        let mut handed = b.clone();
        handed.spec.placement = Some(json!({"clusterAffinity": {"clusterNames": ["member-eu-1"]}}));
        let write = plan(&handed, &placed, "2026-11-25T10:00:00Z");
        assert!(write.spec.is_some() && !write.moves, "{write:?}");
        // A scale (the generation moves) is scheduled again.
        b.metadata.generation = 3;
        let write = plan(&b, &placed, "2026-11-25T10:00:00Z");
        assert!(write.spec.is_none());
        let status = write.status.unwrap();
        assert_eq!(status["status"]["schedulerObservedGeneration"], 3);
        // The condition keeps its transition time while it stays True.
        assert_eq!(
            status["status"]["conditions"][0]["lastTransitionTime"],
            "2026-11-25T09:00:00Z"
        );
        // So is an explicit reschedule.
        b.metadata.generation = 2;
        b.spec.reschedule_triggered_at = Some("2026-11-25T09:30:00Z".into());
        assert!(plan(&b, &placed, "2026-11-25T10:00:00Z").status.is_some());
    }

    /// The Karmada Clusters of the test bed, as replicated.
    fn members() -> BTreeMap<String, Value> {
        [
            ("member-eu-1", "europe-west1", json!([])),
            ("member-eu-2", "europe-west2", json!([])),
            (
                "member-us-1",
                "us-central1",
                json!([{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]),
            ),
        ]
        .into_iter()
        .map(|(name, region, taints)| {
            (
                name.to_owned(),
                json!({"metadata": {"name": name, "labels": {"region": region}},
                       "spec": {"region": region, "taints": taints}}),
            )
        })
        .collect()
    }

    /// Scheduled under the shipped policy's answer for an EU workload (both
    /// EU members, even weights) with the user's `placement`.
    fn schedule_eu(replicas: i32, placement: Value, status: Value) -> Placement {
        let (_, b) = binding(
            json!({"replicas": replicas, "placement": placement}),
            status,
        );
        placement_of(&b, &decision(json!(EU), &[]))
    }

    fn placement_of(b: &Binding, outcome: &QueryOutcome) -> Placement {
        placement(b, &template(), outcome, keys(), Some(&members())).unwrap()
    }

    const DIVIDED: &str = "Divided";

    fn divided(extra: Value) -> Value {
        let mut p = json!({"replicaScheduling": {"replicaSchedulingType": DIVIDED,
                                                 "replicaDivisionPreference": "Weighted"}});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    }

    #[test]
    fn the_users_cluster_names_select_within_what_the_policy_allows() {
        assert_eq!(
            schedule_eu(
                4,
                divided(json!({"clusterAffinity": {"clusterNames": ["member-eu-2"]}})),
                json!({})
            ),
            scheduled(&[("member-eu-2", 4)])
        );
        assert_eq!(
            schedule_eu(
                3,
                divided(
                    json!({"clusterAffinity": {"clusterNames": ["member-eu-2", "member-us-1"]}})
                ),
                json!({})
            ),
            scheduled(&[("member-eu-2", 3)]),
            "a cluster the policy forbids is never chosen"
        );
        let Placement::Failed { reason, message } = schedule_eu(
            3,
            divided(json!({"clusterAffinity": {"clusterNames": ["member-us-1"]}})),
            json!({}),
        ) else {
            panic!("nothing allowed fits")
        };
        assert_eq!(reason, Reason::NoClusterFit);
        assert!(message.contains("member-eu-1, member-eu-2"), "{message}");
        assert_eq!(
            schedule_eu(
                2,
                divided(json!({"clusterAffinity": {"exclude": ["member-eu-1"],
                    "fieldSelector": {"matchExpressions": [{"key": "region", "operator": "In",
                        "values": ["europe-west1", "europe-west2"]}]}}})),
                json!({})
            ),
            scheduled(&[("member-eu-2", 2)])
        );
    }

    #[test]
    fn static_weights_replace_the_policys_even_weights_unless_the_policy_weighs() {
        let weighted = divided(json!({"replicaScheduling": {
            "replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
            "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["member-eu-1"]}, "weight": 2},
                {"targetCluster": {"clusterNames": ["member-eu-2"]}, "weight": 1}]}}}));
        assert_eq!(
            schedule_eu(6, weighted.clone(), json!({})),
            scheduled(&[("member-eu-1", 4), ("member-eu-2", 2)])
        );
        let (_, b) = binding(json!({"replicas": 6, "placement": weighted}), json!({}));
        let policy_weighs = QueryOutcome::Defined(json!({
            "annotations": {PREFERENCES_ANNOTATION:
                r#"{"clusters":{"member-eu-1":{"weight":1000},"member-eu-2":{"weight":5000}}}"#},
            "errors": [],
            "policy_weights": true,
        }));
        assert_eq!(
            placement_of(&b, &policy_weighs),
            scheduled(&[("member-eu-1", 1), ("member-eu-2", 5)]),
            "a policy that weighs on purpose wins"
        );
    }

    #[test]
    fn the_first_affinity_term_with_an_allowed_cluster_is_chosen_and_observed() {
        let terms = divided(json!({"clusterAffinities": [
            {"affinityName": "primary", "clusterNames": ["member-us-1"]},
            {"affinityName": "backup", "clusterNames": ["member-eu-1"]}]}));
        let placed = schedule_eu(2, terms.clone(), json!({}));
        assert_eq!(
            placed,
            Placement::Clusters {
                clusters: targets(&[("member-eu-1", 2)]),
                affinity: Some("backup".to_owned())
            }
        );
        let (_, b) = binding(
            json!({"replicas": 2, "placement": terms.clone()}),
            json!({}),
        );
        let write = plan(&b, &placed, "2026-11-25T10:00:00Z");
        assert_eq!(
            write.status.unwrap()["status"]["schedulerObservingAffinityName"],
            "backup"
        );
        // karmada-scheduler goes on from the observed term.
        let both = divided(json!({"clusterAffinities": [
            {"affinityName": "primary", "clusterNames": ["member-eu-2"]},
            {"affinityName": "backup", "clusterNames": ["member-eu-1"]}]}));
        assert_eq!(
            schedule_eu(
                2,
                both.clone(),
                json!({"schedulerObservingAffinityName": "backup"})
            ),
            Placement::Clusters {
                clusters: targets(&[("member-eu-1", 2)]),
                affinity: Some("backup".to_owned())
            }
        );
        assert_eq!(
            schedule_eu(2, both, json!({})),
            Placement::Clusters {
                clusters: targets(&[("member-eu-2", 2)]),
                affinity: Some("primary".to_owned())
            }
        );
        let none = divided(json!({"clusterAffinities": [
            {"affinityName": "primary", "clusterNames": ["member-us-1"]}]}));
        assert!(matches!(
            schedule_eu(2, none, json!({})),
            Placement::Failed {
                reason: Reason::NoClusterFit,
                ..
            }
        ));
    }

    #[test]
    fn untolerated_taints_keep_new_replicas_off_a_cluster() {
        // A policy that allows every member, the tainted one too.
        let all = QueryOutcome::Defined(json!({
            "annotations": {PREFERENCES_ANNOTATION: r#"{"clusters":{"member-eu-1":{"weight":1},"member-us-1":{"weight":1}}}"#},
            "errors": [],
        }));
        let (_, b) = binding(
            json!({"replicas": 2, "placement": divided(json!({}))}),
            json!({}),
        );
        assert_eq!(placement_of(&b, &all), scheduled(&[("member-eu-1", 2)]));
        let tolerated =
            divided(json!({"clusterTolerations": [{"key": "gpu", "operator": "Exists"}]}));
        let (_, b) = binding(json!({"replicas": 2, "placement": tolerated}), json!({}));
        assert_eq!(
            placement_of(&b, &all),
            scheduled(&[("member-eu-1", 1), ("member-us-1", 1)])
        );
        let (_, on_it) = binding(
            json!({"replicas": 2, "placement": divided(json!({})),
                   "clusters": [{"name": "member-us-1", "replicas": 2}]}),
            json!({}),
        );
        assert_eq!(
            placement_of(&on_it, &all),
            scheduled(&[("member-eu-1", 1), ("member-us-1", 1)]),
            "a cluster the binding is on stays a candidate"
        );
    }

    #[test]
    fn what_the_scheduler_does_not_implement_is_named_never_dropped() {
        for (extra, field) in [
            (
                json!({"spreadConstraints": [{"spreadByField": "region", "maxGroups": 2}]}),
                "spreadConstraints",
            ),
            (
                json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
                    "replicaDivisionPreference": "Weighted",
                    "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}),
                "dynamicWeight",
            ),
            (
                json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
                    "replicaDivisionPreference": "Aggregated"}}),
                "Aggregated",
            ),
            (
                json!({"clusterAffinities": [{"affinityName": "a",
                    "overflowAffinities": [{"affinityName": "b"}]}]}),
                "overflowAffinities",
            ),
        ] {
            let Placement::Failed { reason, message } =
                schedule_eu(2, divided(extra.clone()), json!({}))
            else {
                panic!("{extra} was scheduled")
            };
            assert_eq!(reason, Reason::SchedulerError);
            assert!(message.contains(field), "{message}");
            assert!(message.contains("guardrail"), "{message}");
        }
    }

    #[test]
    fn only_the_bindings_settings_ask_for_are_acted_on() {
        let settings = |schedule, guard| KarmadaSettings {
            scheduler_name: "placement-policy".to_owned(),
            schedule,
            guard,
        };
        let (_, ours) = binding(json!({}), json!({}));
        let (_, theirs) = binding(json!({"schedulerName": "default-scheduler"}), json!({}));
        assert_eq!(ours.mode(&settings(true, false)), Some(Mode::Schedule));
        assert_eq!(ours.mode(&settings(false, true)), None);
        assert_eq!(theirs.mode(&settings(true, false)), None);
        assert_eq!(theirs.mode(&settings(false, true)), Some(Mode::Guard));
        let (_, suspended) = binding(json!({"suspension": {"scheduling": true}}), json!({}));
        assert_eq!(suspended.mode(&settings(true, true)), None);
    }
}
