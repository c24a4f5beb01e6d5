//! Workloads as a target of the reconciler: the placement annotations of the
//! objects the webhook evaluates. A workload is stale when its policy-owned
//! annotations differ from what the decision for its developer view asks
//! ([`assess`]); `auto` mode PATCHes them (with a `test` of the
//! resourceVersion the patch was computed from, so it never overwrites a
//! change it has not seen), `report` mode emits an Event. The webhook runs
//! on the PATCH too and, reading the same developer view, returns the same
//! decision: no loop.

mod assess;
mod evaluation;

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::Resource;
use kube::api::{Api, DynamicObject};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use self::assess::{Assessment, assess, is_placed};
pub(crate) use self::assess::{developer_fingerprint, need, selected};
pub(crate) use self::evaluation::WorkloadEvaluation;
use crate::config::writers::RemediationMode;
use crate::reconcile::changes::ItemKey;
use crate::reconcile::common::Common;
use crate::reconcile::per_target::TargetReconciler;
use crate::reconcile::step::Step;
use crate::reconcile::target::{Kind, describe};
use crate::reconcile::writer::{Sent, Writer, is_gone};
use crate::replication::document::{ObjectKey, object_value};

/// The workloads' reconciler (remediation).
pub(crate) struct Workloads;

impl TargetReconciler for Workloads {
    type Item = Arc<DynamicObject>;
    type Evaluation = WorkloadEvaluation;

    /// The workloads in scope, decoded from the watch caches: every one, or
    /// only those of `only` (a few created, edited or failed workloads must
    /// not cost decoding every workload). None when remediation is off.
    fn items(&self, c: &Common, only: Option<&BTreeSet<ItemKey>>) -> Vec<(usize, Self::Item)> {
        c.cached_items(
            only,
            |t| t.kind == Kind::Workloads { act: true },
            |key| c.scope.admits(key.namespace.as_deref()),
            |i, _, json| {
                let value: Value = serde_json::from_slice(json).ok()?;
                if !selected(c.targets[i].selector.as_ref(), &value) {
                    return None;
                }
                Some((i, Arc::new(serde_json::from_value(value).ok()?)))
            },
        )
    }

    fn is_placed(&self, item: &Self::Item) -> bool {
        is_placed(item)
    }

    async fn evaluate(&self, c: &Common, i: usize, object: Self::Item) -> WorkloadEvaluation {
        let resource = c.targets[i].resource();
        let value = object_value(&object, resource);
        let input = c.update_input(&value, resource);
        let assessment = match c.query(&input).await {
            Ok(outcome) => Some(assess(&value, &outcome, &c.keys.current())),
            Err(e) => {
                tracing::warn!(object = %describe(resource, ObjectKey::of(&object.metadata).as_ref()), error = %e, "placement query failed");
                None
            }
        };
        WorkloadEvaluation {
            i,
            placed: is_placed(&object),
            object,
            assessment,
        }
    }

    /// Act on one workload's evaluation: patch, report or note it.
    async fn act(
        &self,
        c: &Common,
        evaluation: WorkloadEvaluation,
        cancel: &CancellationToken,
    ) -> Step {
        let WorkloadEvaluation {
            i,
            object,
            assessment,
            ..
        } = evaluation;
        let resource = c.targets[i].resource();
        let name = describe(resource, ObjectKey::of(&object.metadata).as_ref());
        let Some(assessment) = assessment else {
            return Step::Failed;
        };
        match assessment {
            Assessment::Placed => Step::Placed,
            Assessment::Undefined => Step::Undefined,
            Assessment::Invalid(reason) => {
                tracing::warn!(object = %name, %reason, "cannot remediate");
                Step::Failed
            }
            Assessment::Unplaceable(errors) => {
                let note = format!(
                    "the placement policy reports errors for this object, so it keeps its current placement until the policy gives a valid one; fix: {}",
                    errors.join("; ")
                );
                remediation_event(c, i, &object, false, "PlacementRejected", note);
                Step::Unplaceable
            }
            Assessment::Stale { patch, changed } => match c.ctx.mode {
                RemediationMode::Report => {
                    let note = format!(
                        "{} {name}: placement is stale; policy-owned annotations differ from the current decision: {}",
                        resource.kind,
                        changed.join(", ")
                    );
                    remediation_event(c, i, &object, false, "PlacementStale", note);
                    Step::LEFT_STALE
                }
                RemediationMode::Auto => {
                    patch_workload(c, i, &object, &patch, &changed, cancel).await
                }
                RemediationMode::Off => Step::LEFT_STALE,
            },
        }
    }
}

/// PATCH one workload's placement annotations (`changed`) through the write
/// step.
async fn patch_workload(
    c: &Common,
    i: usize,
    object: &DynamicObject,
    patch: &json_patch::Patch,
    changed: &[String],
    cancel: &CancellationToken,
) -> Step {
    let target = &c.targets[i];
    let name = describe(target.resource(), ObjectKey::of(&object.metadata).as_ref());
    let api = match &object.metadata.namespace {
        Some(ns) => Api::namespaced_with(target.api.clone().into_client(), ns, target.resource()),
        None => target.api.clone(),
    };
    let key = ObjectKey::of(&object.metadata).map(|k| (i, k));
    let rv = object.metadata.resource_version.as_deref();
    let object_name = object.metadata.name.clone().unwrap_or_default();
    let write = Writer::json_patch(&api, &object_name, patch, rv);
    match c.writer.send(key.as_ref(), rv, cancel, write).await {
        Sent::Skipped(step) => step,
        Sent::Done(_) => {
            c.ctx.metrics.patch(true);
            if let Some(key) = key {
                c.writer.mark_in_flight(key, rv.map(str::to_owned));
            }
            tracing::info!(object = %name, "remediated placement");
            let note = format!("updated placement annotations: {}", changed.join(", "));
            remediation_event(c, i, object, true, "PlacementRemediated", note);
            Step::written(false)
        }
        // Gone: nothing to remediate.
        Sent::Failed(e) if is_gone(&e) => Step::LEFT_STALE,
        Sent::Failed(e) => Step::write_failed(&e, || {
            c.ctx.metrics.patch(false);
            tracing::warn!(object = %name, error = %e, "remediation patch failed; will retry");
        }),
    }
}

/// Queue the remediator's Event about a workload (action `Remediate`).
fn remediation_event(
    c: &Common,
    i: usize,
    object: &DynamicObject,
    normal: bool,
    reason: &str,
    note: String,
) {
    let reference = object.object_ref(c.targets[i].resource());
    c.writer.event(reference, normal, reason, "Remediate", note);
}
