//! A Karmada ResourceBinding or ClusterResourceBinding as the scheduler reads
//! it, and what scheduling writes into it: exactly what karmada-scheduler
//! writes (`pkg/scheduler/scheduler.go`): `spec.clusters`, the
//! `policy.karmada.io/applied-placement` annotation, the `Scheduled`
//! condition, `status.schedulerObservedGeneration` and
//! `status.lastScheduledTime`, and nothing else.

use std::collections::{BTreeMap, BTreeSet};

use policy_client::Decision;
use policy_client::placement::desired_annotations;
use policy_client::{OwnershipKeys, QueryOutcome};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::division::{ClusterPreference, DivisionError, divide};

/// The annotation holding the placement a binding was scheduled with (the
/// taint manager evicts only bindings that carry it).
pub(crate) const APPLIED_PLACEMENT_ANNOTATION: &str = "policy.karmada.io/applied-placement";
/// The placement the policy decides: Federation v1's replica-set preferences.
pub(crate) const PREFERENCES_ANNOTATION: &str = "federation.kubernetes.io/replica-set-preferences";
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

/// The template a binding propagates (`spec.resource`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResourceRef {
    pub(crate) api_version: String,
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) uid: String,
    #[serde(default)]
    pub(crate) resource_version: String,
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
    resource: ResourceRef,
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

/// Why a binding is not scheduled by us at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// Another scheduler's binding.
    OtherScheduler,
    Deleting,
    /// `spec.suspension.scheduling` is set.
    Suspended,
    /// No `spec.placement` (the detector always sets one).
    NoPlacement,
}

impl Binding {
    pub(crate) fn parse(json: &[u8]) -> Result<Binding, serde_json::Error> {
        serde_json::from_slice(json)
    }

    pub(crate) fn template(&self) -> &ResourceRef {
        &self.spec.resource
    }

    pub(crate) fn resource_version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }

    pub(crate) fn clusters(&self) -> &[TargetCluster] {
        &self.spec.clusters
    }

    /// Whether this scheduler (`scheduler_name`) schedules the binding now.
    pub(crate) fn skip(&self, scheduler_name: &str) -> Option<Skip> {
        if self.spec.scheduler_name.as_deref() != Some(scheduler_name) {
            Some(Skip::OtherScheduler)
        } else if self.metadata.deletion_timestamp.is_some() {
            Some(Skip::Deleting)
        } else if self
            .spec
            .suspension
            .as_ref()
            .and_then(|s| s.scheduling)
            .unwrap_or(false)
        {
            Some(Skip::Suspended)
        } else if self.spec.placement.is_none() {
            Some(Skip::NoPlacement)
        } else {
            None
        }
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

    /// What the policy sees of the binding (`input._binding`): its identity
    /// and spec, not its status (aggregated status churns and decides nothing).
    pub(crate) fn policy_view(raw: &Value) -> Value {
        let mut metadata = Map::new();
        for key in [
            "name",
            "namespace",
            "uid",
            "generation",
            "labels",
            "annotations",
        ] {
            if let Some(v) = raw.pointer(&format!("/metadata/{key}")) {
                metadata.insert(key.to_owned(), v.clone());
            }
        }
        json!({
            "apiVersion": raw.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": raw.get("kind").cloned().unwrap_or(Value::Null),
            "metadata": metadata,
            "spec": raw.get("spec").cloned().unwrap_or(Value::Null),
        })
    }
}

/// Where the policy puts a binding: its clusters, or why it cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    Clusters(Vec<TargetCluster>),
    Failed { reason: Reason, message: String },
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
/// template as stored; the clusters the policy may name are `known` (the
/// Karmada Clusters replicated), when they are known.
pub(crate) fn placement(
    binding: &Binding,
    template: &Value,
    outcome: &QueryOutcome,
    keys: &OwnershipKeys,
    known: Option<&BTreeSet<String>>,
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
    Some(clusters_from(binding, preferences, known))
}

#[derive(Debug, Deserialize)]
struct ReplicaSetPreferences {
    clusters: BTreeMap<String, ClusterPreference>,
}

fn clusters_from(
    binding: &Binding,
    preferences: &str,
    known: Option<&BTreeSet<String>>,
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
    if let Some(known) = known {
        let unknown: Vec<&str> = preferences
            .keys()
            .filter(|name| !known.contains(*name))
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
    if !binding.is_workload() {
        // Non-workloads go to every cluster, without replicas.
        return Placement::Clusters(
            preferences
                .into_keys()
                .map(|name| TargetCluster { name, replicas: 0 })
                .collect(),
        );
    }
    if !binding.is_divided_workload() {
        // Duplicated: every cluster runs all replicas.
        return Placement::Clusters(
            preferences
                .into_keys()
                .map(|name| TargetCluster {
                    name,
                    replicas: binding.spec.replicas,
                })
                .collect(),
        );
    }
    match divide(
        binding.spec.replicas,
        &preferences,
        &binding.spec.resource.uid,
    ) {
        Ok(division) => Placement::Clusters(
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
        Placement::Clusters(_) => ("True", Reason::Success, SUCCESS_MESSAGE.to_owned()),
        Placement::Failed { reason, message } => ("False", *reason, message.clone()),
    };
    let mut spec = None;
    let mut moves = false;
    if let Placement::Clusters(clusters) = placement {
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
    let succeeded = matches!(placement, Placement::Clusters(_));
    let status_due = condition_changed
        || (succeeded
            && (spec.is_some()
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
        json!({ "status": status })
    });
    let event = match placement {
        Placement::Clusters(clusters) if spec.is_some() => Some((
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

    const EU: &str =
        r#"{"clusters":{"member-eu-1":{"weight":1},"member-eu-2":{"weight":1}},"rebalance":true}"#;

    #[test]
    fn the_policys_weights_divide_the_replicas() {
        let (_, b) = binding(json!({"replicas": 6}), json!({}));
        let placed = placement(&b, &template(), &decision(json!(EU), &[]), keys(), None);
        assert_eq!(
            placed,
            Some(Placement::Clusters(targets(&[
                ("member-eu-1", 3),
                ("member-eu-2", 3)
            ])))
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
            Some(Placement::Clusters(targets(&[
                ("member-eu-1", 4),
                ("member-eu-2", 4)
            ])))
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
            Some(Placement::Clusters(targets(&[
                ("member-eu-1", 0),
                ("member-eu-2", 0)
            ])))
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
        let known: BTreeSet<String> = ["member-eu-1".to_owned()].into();
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
            Some(Placement::Clusters(targets(&[("member-eu-1", 6)])))
        );
    }

    #[test]
    fn a_new_placement_writes_spec_status_and_an_event() {
        let (raw, b) = binding(json!({"replicas": 6}), json!({}));
        let placed = Placement::Clusters(targets(&[("member-eu-1", 3), ("member-eu-2", 3)]));
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
        let placed = Placement::Clusters(targets(&[("member-eu-1", 3), ("member-eu-2", 3)]));
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

    #[test]
    fn the_policy_sees_the_bindings_spec_not_its_status() {
        let (raw, _) = binding(
            json!({"replicas": 6}),
            json!({"aggregatedStatus": [{"clusterName": "x"}]}),
        );
        let view = Binding::policy_view(&raw);
        assert_eq!(view["spec"]["replicas"], 6);
        assert_eq!(view["metadata"]["name"], "web-deployment");
        assert!(view.get("status").is_none());
    }
}
