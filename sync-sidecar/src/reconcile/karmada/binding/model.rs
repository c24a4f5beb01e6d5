//! The binding as the scheduler reads it: its spec and status, whether it
//! is scheduled or guarded, and the clusters and reasons scheduling writes.

use std::collections::{BTreeMap, BTreeSet};

use policy_client::karmada::TemplateRef;
use serde::Deserialize;
use serde_json::Value;

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
pub(super) struct Meta {
    #[serde(default)]
    pub(super) generation: i64,
    #[serde(default)]
    pub(super) resource_version: Option<String>,
    #[serde(default)]
    pub(super) deletion_timestamp: Option<String>,
    #[serde(default)]
    pub(super) annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Eviction {
    pub(super) from_cluster: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Suspension {
    #[serde(default)]
    pub(super) scheduling: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Spec {
    pub(super) resource: TemplateRef,
    #[serde(default)]
    pub(super) replicas: i32,
    #[serde(default)]
    pub(super) replica_requirements: Option<Value>,
    #[serde(default)]
    pub(super) components: Vec<Value>,
    #[serde(default)]
    pub(super) clusters: Vec<TargetCluster>,
    #[serde(default)]
    pub(super) placement: Option<Value>,
    #[serde(default)]
    pub(super) graceful_eviction_tasks: Vec<Eviction>,
    #[serde(default)]
    pub(super) scheduler_name: Option<String>,
    #[serde(default)]
    pub(super) reschedule_triggered_at: Option<String>,
    #[serde(default)]
    pub(super) suspension: Option<Suspension>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Status {
    #[serde(default)]
    pub(super) scheduler_observed_generation: i64,
    /// Karmada's `SchedulerObservedAffinityName` (its JSON name differs).
    #[serde(default, rename = "schedulerObservingAffinityName")]
    pub(super) scheduler_observed_affinity_name: Option<String>,
    #[serde(default)]
    pub(super) last_scheduled_time: Option<String>,
    #[serde(default)]
    pub(super) conditions: Vec<Value>,
}

/// A binding, decoded from the JSON the watch holds.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Binding {
    pub(super) metadata: Meta,
    pub(super) spec: Spec,
    #[serde(default)]
    pub(super) status: Status,
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

    /// Whether the binding delivers to one of `members`, or is being evicted
    /// from one.
    pub(crate) fn touches(&self, members: &BTreeSet<String>) -> bool {
        self.spec.clusters.iter().any(|c| members.contains(&c.name))
            || (self.spec.graceful_eviction_tasks.iter()).any(|t| members.contains(&t.from_cluster))
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
    pub(super) fn reschedule_required(&self) -> bool {
        match (
            &self.spec.reschedule_triggered_at,
            &self.status.last_scheduled_time,
        ) {
            (Some(_), None) => true,
            (Some(asked), Some(last)) => asked > last,
            (None, _) => false,
        }
    }

    pub(super) fn is_divided_workload(&self) -> bool {
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

    pub(super) fn is_workload(&self) -> bool {
        (self.spec.replicas > 0 || self.spec.replica_requirements.is_some())
            && self.spec.components.len() <= 1
    }

    /// The scheduled condition as the binding has it.
    pub(super) fn scheduled_condition(&self) -> Option<&Value> {
        self.status
            .conditions
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(SCHEDULED))
    }
}
