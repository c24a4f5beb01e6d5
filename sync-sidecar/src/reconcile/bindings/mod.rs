//! Karmada bindings as a target of the reconciler. The decision for a
//! binding's resource template (the template as the webhook sees it, plus the
//! binding under `input._binding`: [`policy_client::karmada::template_input`])
//! either schedules it, when its `spec.schedulerName` is ours, with exactly
//! the writes karmada-scheduler makes
//! ([`crate::reconcile::karmada::binding`]), or, with the guardrail, bounds
//! the placement karmada-scheduler works from
//! ([`crate::reconcile::karmada::guard`]).

mod clusters;
mod evaluation;
mod kinds;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject, Patch};
use policy_client::engine::QueryOutcome;
use policy_client::karmada::{ALLOWED_CLUSTERS_ANNOTATION, TemplateRef, Templates, template_input};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) use self::clusters::KnownClusters;
use self::evaluation::Verdict;
pub(crate) use self::evaluation::{BindingEvaluation, BindingItem};
use self::kinds::written_fingerprint;
pub(crate) use self::kinds::{
    BINDING_TYPES, KARMADA_CLUSTERS, PROPAGATION_POLICY_TYPES, PropagationPolicies,
    binding_fingerprint, guarded_fingerprint, need,
};
use crate::error::SyncError;
use crate::kube_writes::patch_params;
use crate::reconcile::changes::ItemKey;
use crate::reconcile::common::Common;
use crate::reconcile::events::reference;
use crate::reconcile::karmada::binding::{Binding, BindingWrite, Mode, Placement, placement, plan};
use crate::reconcile::karmada::guard::{
    Due, Guarding, Overdue, enforced_conditions, guard, outside_record, scheduler_said,
    without_members,
};
use crate::reconcile::per_target::TargetReconciler;
use crate::reconcile::step::Step;
use crate::reconcile::target::{Kind, describe};
use crate::reconcile::writer::{Sent, Writer, is_gone, now_rfc3339};
use crate::replication::document::ObjectKey;

/// The bindings' reconciler: the scheduler and the guardrail.
pub(crate) struct Bindings {
    /// Bindings' templates that are not among the watched workload types,
    /// read from the API server.
    pub(crate) templates: Templates,
    /// Karmada's Clusters, when replicated.
    pub(crate) karmada_clusters: Option<KnownClusters>,
    pub(crate) propagation_policies: Option<PropagationPolicies>,
    /// Since when guarded bindings deliver outside their record.
    pub(crate) overdue: parking_lot::Mutex<Overdue>,
    /// Status writes of this pass's moves, sent once every move is.
    pub(crate) deferred: parking_lot::Mutex<Vec<DeferredStatus>>,
}

/// A scheduled binding's status write, after its spec write moved it: the
/// pass sends every move first, so a failover's workloads leave a failed
/// member at one round trip each, not two. Lost, it is planned again: the
/// binding's observed generation stays behind its generation.
pub(crate) struct DeferredStatus {
    key: ItemKey,
    api: Api<DynamicObject>,
    patch: Value,
    planned_from: Option<String>,
}

impl TargetReconciler for Bindings {
    type Item = Arc<BindingItem>;
    type Evaluation = BindingEvaluation;

    /// The bindings of `only` (or every one of ours) in the binding targets.
    fn items(&self, c: &Common, only: Option<&BTreeSet<ItemKey>>) -> Vec<(usize, Self::Item)> {
        c.cached_items(
            only,
            |t| t.kind == Kind::Bindings,
            |_| true,
            |i, key, json| {
                let binding = Binding::parse(json).ok()?;
                let mode = binding.mode(&c.ctx.karmada)?;
                // The guardrail acts on the bindings of the namespaces the
                // webhook configuration selects (the scope); bindings handed
                // to our scheduler are ours wherever they are.
                if mode == Mode::Guard && !c.scope.admits(key.namespace.as_deref()) {
                    return None;
                }
                let item = BindingItem::new(key, json.clone(), binding, mode);
                Some((i, Arc::new(item)))
            },
        )
    }

    fn is_placed(&self, item: &Self::Item) -> bool {
        !item.binding.clusters().is_empty()
    }

    /// Ask the decision for one binding's template and plan the writes.
    async fn evaluate(&self, c: &Common, i: usize, item: Self::Item) -> BindingEvaluation {
        let verdict = self.binding_verdict(c, i, &item).await;
        BindingEvaluation { i, item, verdict }
    }

    /// Act on one binding's evaluation: write its placement and status.
    async fn act(
        &self,
        c: &Common,
        evaluation: BindingEvaluation,
        cancel: &CancellationToken,
    ) -> Step {
        let BindingEvaluation { i, item, verdict } = evaluation;
        match verdict {
            Verdict::Failed => Step::Failed,
            Verdict::Nothing => Step::Undefined,
            Verdict::Guarded(guarding) => self.act_guarded(c, i, &item, guarding, cancel).await,
            Verdict::Overdue(at) => Step::Overdue(at),
            Verdict::Repair(members) => self.act_repair(c, i, &item, &members, cancel).await,
            Verdict::Planned { placement, write } => {
                self.act_planned(c, i, &item, placement, write, cancel)
                    .await
            }
        }
    }
}

impl Bindings {
    /// The template of a binding as stored, with its resource type: from the
    /// watch of its type when it is watched and current, else from the API
    /// server. `None` when it is gone.
    async fn template(
        &self,
        c: &Common,
        template: &TemplateRef,
    ) -> Result<Option<(Value, ApiResource)>, SyncError> {
        let key = ObjectKey::new(template.namespace.as_deref(), &template.name);
        for target in &c.targets {
            let resource = target.resource();
            if resource.api_version != template.api_version || resource.kind != template.kind {
                continue;
            }
            let current = template.resource_version.is_empty()
                || target.resource_version(&key).as_deref()
                    == Some(template.resource_version.as_str());
            if current && let Some(json) = target.watched.objects.get(&key) {
                return Ok(Some((serde_json::from_slice(&json)?, resource.clone())));
            }
        }
        // A stored binding's reference: its version, when read before.
        Ok(self.templates.get_version(template).await?)
    }

    async fn binding_verdict(&self, c: &Common, i: usize, item: &BindingItem) -> Verdict {
        let name = describe(c.targets[i].resource(), Some(&item.key));
        let template = match self.template(c, item.binding.template()).await {
            Ok(Some(found)) => found,
            Ok(None) => return Verdict::Nothing,
            Err(e) => {
                tracing::warn!(binding = %name, error = %e, "cannot read the binding's resource template");
                return Verdict::Failed;
            }
        };
        let (template, template_type) = template;
        let input = template_input(&template, &template_type, item.raw(), &c.keys.current());
        let deadline = Instant::now() + c.ctx.query_timeout;
        c.ctx.metrics.remediation_queries.inc();
        let outcome = match c.ctx.engine.query(&c.ctx.decision, &input, deadline).await {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::warn!(binding = %name, error = %e, "placement query failed");
                return Verdict::Failed;
            }
        };
        if matches!(outcome, QueryOutcome::Undefined) {
            return Verdict::Nothing;
        }
        if item.mode == Mode::Guard {
            let requested = self
                .propagation_policies
                .as_ref()
                .and_then(|p| p.placement(item.raw()));
            let guarding = guard(item.raw(), &template, requested.as_ref(), &outcome);
            return self.overdue_or(c, i, item, guarding);
        }
        let known = self.karmada_clusters.as_ref().map(KnownClusters::get);
        let Some(placement) = placement(
            &item.binding,
            &template,
            &outcome,
            &c.keys.current(),
            known.as_deref(),
        ) else {
            return Verdict::Nothing;
        };
        let write = plan(&item.binding, &placement, &now_rfc3339());
        Verdict::Planned { placement, write }
    }

    /// A guarded binding admitted under the answer (nothing to re-admit)
    /// that still delivers outside its record: repaired once the grace is
    /// over, looked at again when it will be; else `guarding` as it is.
    fn overdue_or(&self, c: &Common, i: usize, item: &BindingItem, guarding: Guarding) -> Verdict {
        let key = (i, item.key.clone());
        let outside = match &guarding {
            Guarding::Bounded { patch: None, .. } => outside_record(item.raw()),
            _ => BTreeSet::new(),
        };
        let due = self.overdue.lock().observe(
            &key,
            &outside,
            Instant::now(),
            c.ctx.karmada.reschedule_grace,
        );
        match due {
            Due::Nothing => Verdict::Guarded(guarding),
            Due::At(at) => Verdict::Overdue(at),
            Due::Now => Verdict::Repair(outside),
        }
    }

    /// Write a scheduled binding's planned placement and status.
    async fn act_planned(
        &self,
        c: &Common,
        i: usize,
        item: &BindingItem,
        placement: Placement,
        write: BindingWrite,
        cancel: &CancellationToken,
    ) -> Step {
        let failed = matches!(placement, Placement::Failed { .. });
        if write.is_empty() {
            return Step::unwritten(failed);
        }
        let key = (i, item.key.clone());
        let name = describe(c.targets[i].resource(), Some(&item.key));
        let sent = c.writer.send(
            Some(&key),
            item.binding.resource_version(),
            cancel,
            self.write_binding(c, i, item, &write),
        );
        match sent.await {
            Sent::Skipped(step) => step,
            Sent::Done(()) => {
                c.ctx
                    .metrics
                    .binding_schedule(if failed { "failed" } else { "scheduled" });
                tracing::info!(binding = %name, placement = ?placement, "scheduled binding");
                if let Some((normal, reason, note)) = &write.event {
                    binding_events(c, item, *normal, reason, note);
                }
                Step::written(failed)
            }
            Sent::Failed(e) => Step::write_failed(&e, || {
                c.ctx.metrics.binding_schedule("error");
                tracing::warn!(binding = %name, error = %e, "writing the binding's placement failed; will retry");
            }),
        }
    }

    /// Act on the guardrail's plan for one binding: admit it again with its
    /// placement bounded by the new answer.
    async fn act_guarded(
        &self,
        c: &Common,
        i: usize,
        item: &BindingItem,
        guarding: Guarding,
        cancel: &CancellationToken,
    ) -> Step {
        let name = describe(c.targets[i].resource(), Some(&item.key));
        let (bound, patch) = match guarding {
            Guarding::Undefined => return Step::Undefined,
            Guarding::Kept(why) => {
                let note = format!(
                    "the placement stays within the clusters allowed before, because {why}"
                );
                binding_events(c, item, false, "PlacementGuardKept", &note);
                return Step::Unplaceable;
            }
            Guarding::Bounded { patch: None, .. } => return Step::Placed,
            Guarding::Bounded {
                bound,
                patch: Some(patch),
                ..
            } => (bound, patch),
        };
        let key = (i, item.key.clone());
        let api = binding_api(c, i, item);
        let planned_from = item.binding.resource_version();
        let write = Writer::json_patch(&api, &item.key.name, &patch, planned_from);
        match c.writer.send(Some(&key), planned_from, cancel, write).await {
            Sent::Skipped(step) => step,
            Sent::Done(_) => {
                c.ctx.metrics.binding_schedule("bounded");
                c.writer
                    .mark_in_flight(key, planned_from.map(str::to_owned));
                tracing::info!(binding = %name, allowed = %bound, "admitted the binding again with its placement bounded by the policy");
                let note = format!(
                    "the placement policy now allows {bound}: the placement is admitted again with its cluster names bounded to them"
                );
                binding_events(c, item, true, "PlacementBounded", &note);
                Step::written(false)
            }
            Sent::Failed(e) if is_gone(&e) => Step::Placed,
            Sent::Failed(e) => Step::write_failed(&e, || {
                c.ctx.metrics.binding_schedule("error");
                tracing::warn!(binding = %name, error = %e, "admitting the binding again failed; will retry");
            }),
        }
    }

    /// Take `members` out of what a guarded binding delivers: karmada-scheduler
    /// did not move them within the grace. The spec write (preconditioned on
    /// the resourceVersion it was planned from) passes the webhook, as it
    /// adds nothing; then the condition, and an Event on the binding and
    /// its template.
    async fn act_repair(
        &self,
        c: &Common,
        i: usize,
        item: &BindingItem,
        members: &BTreeSet<String>,
        cancel: &CancellationToken,
    ) -> Step {
        let key = (i, item.key.clone());
        let name = describe(c.targets[i].resource(), Some(&item.key));
        let members_text = members.iter().cloned().collect::<Vec<_>>().join(", ");
        let note = repair_note(item.raw(), &members_text, c.ctx.karmada.reschedule_grace);
        let planned_from = item.binding.resource_version();
        let write = self.write_repair(c, i, item, members, &note);
        match c.writer.send(Some(&key), planned_from, cancel, write).await {
            Sent::Skipped(step) => step,
            Sent::Done(()) => {
                self.overdue.lock().forget(&key);
                c.writer
                    .mark_in_flight(key, planned_from.map(str::to_owned));
                c.ctx.metrics.binding_schedule("repaired");
                tracing::warn!(binding = %name, members = %members_text, "took members the placement policy forbids out of the binding");
                binding_events(c, item, false, "ForbiddenClustersRemoved", &note);
                Step::written(false)
            }
            Sent::Failed(e) if is_gone(&e) => {
                self.overdue.lock().forget(&key);
                Step::Placed
            }
            Sent::Failed(e) => Step::write_failed(&e, || {
                c.ctx.metrics.binding_schedule("error");
                tracing::warn!(binding = %name, error = %e, "taking forbidden members out of the binding failed; will retry");
            }),
        }
    }

    /// The repair's spec patch, then its condition.
    async fn write_repair(
        &self,
        c: &Common,
        i: usize,
        item: &BindingItem,
        members: &BTreeSet<String>,
        note: &str,
    ) -> Result<(), SyncError> {
        let api = binding_api(c, i, item);
        let updated = Writer::json_patch(
            &api,
            &item.key.name,
            &without_members(item.raw(), members),
            item.binding.resource_version(),
        )
        .await?;
        let status = json!({
            "metadata": {"resourceVersion": updated.metadata.resource_version},
            "status": {"conditions": enforced_conditions(item.raw(), note, &now_rfc3339())},
        });
        // The condition says why; the repair itself is done when it fails.
        if let Err(e) = api
            .patch_status(&item.key.name, &patch_params(), &Patch::Merge(&status))
            .await
        {
            tracing::warn!(binding = %item.key, error = %e, "cannot write the PlacementPolicyEnforced condition");
        }
        Ok(())
    }

    /// The spec patch (with the resourceVersion it was planned from, so a
    /// binding changed meanwhile is planned again) and the status patch,
    /// deferred to the end of the pass when the spec patch moved it.
    async fn write_binding(
        &self,
        c: &Common,
        i: usize,
        item: &BindingItem,
        write: &BindingWrite,
    ) -> Result<(), SyncError> {
        let api = binding_api(c, i, item);
        let params = patch_params();
        let key = (i, item.key.clone());
        let planned_from = item.binding.resource_version().map(str::to_owned);
        let mut resource_version = planned_from.clone();
        let mut generation = None;
        if let Some(spec) = &write.spec {
            // The watch may deliver our own write before its response
            // arrives: known beforehand, it is no change to schedule again
            // (which would cost another template read and query each).
            c.changes
                .observe(key.clone(), written_fingerprint(item.raw(), spec), false);
            let mut patch = spec.clone();
            patch["metadata"]["resourceVersion"] = json!(resource_version);
            let updated = api
                .patch(&item.key.name, &params, &Patch::Merge(&patch))
                .await?;
            resource_version = updated.metadata.resource_version.clone();
            generation = updated.metadata.generation;
            // Our own write as stored (defaults included) is no change either.
            let written = serde_json::to_value(&updated)?;
            c.changes
                .observe(key.clone(), binding_fingerprint(&written), false);
            c.writer.mark_in_flight(key.clone(), planned_from.clone());
        }
        if let Some(status) = &write.status {
            let mut patch = status.clone();
            patch["metadata"] = json!({"resourceVersion": resource_version});
            // Our own spec write moved the generation; what it changed is
            // this schedule's result, so the schedule observed that generation.
            if let (Some(observed), Some(generation)) = (
                patch.pointer_mut("/status/schedulerObservedGeneration"),
                generation,
            ) {
                *observed = json!(generation);
            }
            let status = DeferredStatus {
                key,
                api,
                patch,
                planned_from,
            };
            if write.moves {
                self.deferred.lock().push(status);
            } else {
                self.write_status(c, status).await?;
            }
        }
        Ok(())
    }

    async fn write_status(&self, c: &Common, status: DeferredStatus) -> Result<(), SyncError> {
        let DeferredStatus {
            key,
            api,
            patch,
            planned_from,
        } = status;
        api.patch_status(&key.1.name, &patch_params(), &Patch::Merge(&patch))
            .await?;
        c.writer.mark_in_flight(key, planned_from);
        Ok(())
    }

    /// Send the status writes this pass's moves deferred. One that fails is
    /// planned again by a later pass (the binding's observed generation is
    /// behind), so it is only logged.
    pub(crate) async fn write_deferred(
        &self,
        c: &Common,
        concurrency: usize,
        cancel: &CancellationToken,
    ) {
        let deferred = std::mem::take(&mut *self.deferred.lock());
        futures::stream::iter(deferred)
            .for_each_concurrent(concurrency, |status| async move {
                let name = describe(c.targets[status.key.0].resource(), Some(&status.key.1));
                let write = self.write_status(c, status);
                if let Sent::Failed(e) = c.writer.send(None, None, cancel, write).await {
                    tracing::debug!(binding = %name, error = %e, "writing a moved binding's status failed; a later pass writes it");
                }
            })
            .await;
    }
}

/// The API of binding `item` of target `i` (its namespace's).
fn binding_api(c: &Common, i: usize, item: &BindingItem) -> Api<DynamicObject> {
    let target = &c.targets[i];
    match &item.key.namespace {
        Some(ns) => Api::namespaced_with(target.api.clone().into_client(), ns, target.resource()),
        None => target.api.clone(),
    }
}

/// Queue an Event on a binding and on its resource template.
fn binding_events(c: &Common, item: &BindingItem, normal: bool, reason: &str, note: &str) {
    let action = match item.mode {
        Mode::Schedule => "Schedule",
        Mode::Guard => "Guard",
    };
    for reference in [reference(item.raw()), template_reference(&item.binding)] {
        c.writer
            .event(reference, normal, reason, action, note.to_owned());
    }
}

/// Why a repair took `members` out of a guarded binding (`raw`) after the
/// grace karmada-scheduler had.
fn repair_note(raw: &Value, members: &str, grace: Duration) -> String {
    let allowed = raw
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ALLOWED_CLUSTERS_ANNOTATION))
        .and_then(Value::as_str)
        .unwrap_or_default();
    format!(
        "took {members} out of spec.clusters: the placement policy allows this binding's template only {}, and karmada-scheduler did not move its replicas within {} ({})",
        if allowed.is_empty() {
            "no cluster"
        } else {
            allowed
        },
        humantime::format_duration(Duration::from_secs(grace.as_secs().max(1))),
        scheduler_said(raw),
    )
}

fn template_reference(binding: &Binding) -> ObjectReference {
    let template = binding.template();
    ObjectReference {
        api_version: Some(template.api_version.clone()),
        kind: Some(template.kind.clone()),
        name: Some(template.name.clone()),
        namespace: template.namespace.clone(),
        uid: (!template.uid.is_empty()).then(|| template.uid.clone()),
        ..ObjectReference::default()
    }
}
