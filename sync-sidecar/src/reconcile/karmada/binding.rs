//! A Karmada ResourceBinding or ClusterResourceBinding as the scheduler reads
//! it, and what scheduling writes into it: exactly what karmada-scheduler
//! writes (`pkg/scheduler/scheduler.go`): `spec.clusters`, the
//! `policy.karmada.io/applied-placement` annotation, the `Scheduled`
//! condition, `status.schedulerObservedGeneration` and
//! `status.lastScheduledTime`, and nothing else. Deciding is in [`decide`], the
//! writes in [`write`].

mod decide;
mod write;

use std::collections::BTreeMap;

use policy_client::karmada::TemplateRef;
use serde::Deserialize;
use serde_json::Value;

pub(crate) use self::decide::{Placement, placement};
pub(crate) use self::write::{BindingWrite, plan};
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

#[cfg(test)]
mod tests;
