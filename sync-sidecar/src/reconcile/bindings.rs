//! Karmada bindings as a target of the reconciler. The decision for a
//! binding's resource template (the template as the webhook sees it, plus the
//! binding under `input._binding`: [`policy_client::karmada::template_input`])
//! either schedules it, when its `spec.schedulerName` is ours, with exactly
//! the writes karmada-scheduler makes
//! ([`crate::reconcile::karmada::binding`]), or, with the guardrail, bounds
//! the placement karmada-scheduler works from
//! ([`crate::reconcile::karmada::guard`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, Patch};
use policy_client::engine::QueryOutcome;
use policy_client::karmada::{
    ALLOWED_CLUSTERS_ANNOTATION, TemplateRef, propagation_policy, template_input,
};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::changes::fingerprint;
use super::events::reference;
use super::step::Step;
use super::target::{BindingItem, Item, Kind, describe};
use super::writer::{Sent, Writer, is_gone};
use super::{Reconciler, now_rfc3339};
use crate::error::SyncError;
use crate::kube_writes::patch_params;
use crate::reconcile::karmada::binding::{Binding, BindingWrite, Mode, Placement, placement, plan};
use crate::reconcile::karmada::guard::{
    Due, Guarding, enforced_conditions, guard, guarded_view, outside_record, scheduler_said,
    without_members,
};
use crate::replication::document::ObjectKey;
use crate::replication::watched::{Need, WatchedType};

/// The binding types of Karmada, scheduled when the scheduler is on.
pub(crate) const BINDING_TYPES: [(&str, &str, &str); 2] = [
    ("work.karmada.io", "v1alpha2", "resourcebindings"),
    ("work.karmada.io", "v1alpha2", "clusterresourcebindings"),
];

/// Karmada's Cluster type; its replicated objects name the clusters a
/// placement may use.
pub(crate) const KARMADA_CLUSTERS: (&str, &str, &str) =
    ("cluster.karmada.io", "v1alpha1", "clusters");

/// Karmada's PropagationPolicy and ClusterPropagationPolicy types: the
/// placements the guardrail admits bindings with again.
pub(crate) const PROPAGATION_POLICY_TYPES: [(&str, &str, &str); 2] = [
    ("policy.karmada.io", "v1alpha1", "propagationpolicies"),
    (
        "policy.karmada.io",
        "v1alpha1",
        "clusterpropagationpolicies",
    ),
];

/// The watched PropagationPolicies and ClusterPropagationPolicies.
pub(crate) struct PropagationPolicies {
    pub(crate) namespaced: Arc<WatchedType>,
    pub(crate) cluster: Arc<WatchedType>,
}

impl PropagationPolicies {
    /// The placement the (Cluster)PropagationPolicy that made `binding` asks
    /// for, as stored; `None` when it is gone or not named.
    fn placement(&self, binding: &Value) -> Option<Value> {
        let (namespace, name) = propagation_policy(binding)?;
        let store = match &namespace {
            Some(_) => &self.namespaced,
            None => &self.cluster,
        };
        let json = store
            .objects
            .get(&ObjectKey::new(namespace.as_deref(), &name))?;
        serde_json::from_slice::<Value>(&json)
            .ok()?
            .pointer("/spec/placement")
            .cloned()
    }
}

/// What the scheduler needs of a binding type's watch.
pub(crate) fn need() -> Need {
    Need {
        listed: true,
        ..Need::default()
    }
}

/// A fingerprint of what the guardrail reads of a binding
/// ([`guarded_view`]: not karmada-scheduler's result).
pub(crate) fn guarded_fingerprint(raw: &Value) -> u64 {
    fingerprint(&guarded_view(raw))
}

/// A fingerprint of what scheduling reads of a binding: its spec (not its
/// status, which the binding controller rewrites as members report) and
/// whether it is being deleted.
pub(crate) fn binding_fingerprint(raw: &Value) -> u64 {
    fingerprint(&json!([
        raw.get("spec"),
        raw.pointer("/metadata/deletionTimestamp").is_some()
    ]))
}

/// The fingerprint `raw` will have once the merge patch `spec` is applied.
fn written_fingerprint(raw: &Value, spec: &Value) -> u64 {
    let mut written = raw.clone();
    json_patch::merge(&mut written, spec);
    binding_fingerprint(&written)
}

/// One binding's evaluation, before anything is written.
pub(crate) struct BindingEvaluation {
    pub(crate) i: usize,
    pub(crate) item: Arc<BindingItem>,
    pub(crate) verdict: Verdict,
}

pub(crate) enum Verdict {
    /// The query or the template lookup failed: retried.
    Failed,
    /// The template is gone (the binding follows it), or the engine has no
    /// decision yet: nothing to write.
    Nothing,
    Planned {
        placement: Placement,
        write: BindingWrite,
    },
    /// The guardrail's plan for another scheduler's binding.
    Guarded(Guarding),
    /// A guarded binding still delivers to members its record leaves out,
    /// past the grace karmada-scheduler had to move them: take them out.
    Repair(BTreeSet<String>),
    /// The same, within the grace: look again then.
    Overdue(Instant),
}

impl BindingEvaluation {
    /// Whether this write would move a placement the binding has.
    pub(crate) fn replaces_a_placement(&self) -> bool {
        match &self.verdict {
            Verdict::Planned { write, .. } => {
                !self.item.binding.clusters().is_empty() && write.moves
            }
            Verdict::Guarded(Guarding::Bounded {
                patch: Some(_),
                moves,
                ..
            }) => *moves,
            Verdict::Repair(_) => true,
            _ => false,
        }
    }

    /// The members a repair takes out of what the binding delivers.
    pub(crate) fn repaired_members(&self) -> Option<&BTreeSet<String>> {
        match &self.verdict {
            Verdict::Repair(members) => Some(members),
            _ => None,
        }
    }
}

impl Reconciler {
    /// The bindings of `only` (or every one of ours) in the binding targets.
    pub(super) fn bindings(&self, only: Option<&BTreeSet<(usize, ObjectKey)>>) -> Vec<Item> {
        self.cached_items(
            only,
            |t| t.kind == Kind::Bindings,
            |_| true,
            |i, key, json| {
                let raw: Value = serde_json::from_slice(json).ok()?;
                let binding = Binding::parse(json).ok()?;
                let mode = binding.mode(&self.ctx.karmada)?;
                // The guardrail acts on the bindings of the namespaces the
                // webhook configuration selects (the scope); bindings handed
                // to our scheduler are ours wherever they are.
                if mode == Mode::Guard && !self.scope.admits(key.namespace.as_deref()) {
                    return None;
                }
                Some(Item::Binding(
                    i,
                    Arc::new(BindingItem {
                        key,
                        raw,
                        binding,
                        mode,
                    }),
                ))
            },
        )
    }

    /// The Karmada Clusters replicated, by name, when they are.
    fn known_clusters(&self) -> Option<BTreeMap<String, Value>> {
        let clusters = self.karmada_clusters.as_ref()?;
        Some(
            clusters
                .objects
                .snapshot(|_| true)
                .into_iter()
                .filter_map(|(key, json)| Some((key.name, serde_json::from_slice(&json).ok()?)))
                .collect(),
        )
    }

    /// The template of a binding as stored, with its resource type: from the
    /// watch of its type when it is watched and current, else from the API
    /// server. `None` when it is gone.
    async fn template(
        &self,
        template: &TemplateRef,
    ) -> Result<Option<(Value, ApiResource)>, SyncError> {
        let key = ObjectKey::new(template.namespace.as_deref(), &template.name);
        for target in &self.targets {
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

    /// Ask the decision for one binding's template and plan the writes.
    pub(super) async fn evaluate_binding(
        &self,
        i: usize,
        item: Arc<BindingItem>,
    ) -> BindingEvaluation {
        let verdict = self.binding_verdict(i, &item).await;
        BindingEvaluation { i, item, verdict }
    }

    async fn binding_verdict(&self, i: usize, item: &BindingItem) -> Verdict {
        let name = describe(self.targets[i].resource(), Some(&item.key));
        let template = match self.template(item.binding.template()).await {
            Ok(Some(found)) => found,
            Ok(None) => return Verdict::Nothing,
            Err(e) => {
                tracing::warn!(binding = %name, error = %e, "cannot read the binding's resource template");
                return Verdict::Failed;
            }
        };
        let (template, template_type) = template;
        let input = template_input(&template, &template_type, &item.raw, &self.keys.current());
        let deadline = Instant::now() + self.ctx.query_timeout;
        self.ctx.metrics.remediation_queries.inc();
        let outcome = match self
            .ctx
            .engine
            .query(&self.ctx.decision, &input, deadline)
            .await
        {
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
                .and_then(|p| p.placement(&item.raw));
            let guarding = guard(&item.raw, &template, requested.as_ref(), &outcome);
            return self.overdue_or(i, item, guarding);
        }
        let known = self.known_clusters();
        let Some(placement) = placement(
            &item.binding,
            &template,
            &outcome,
            &self.keys.current(),
            known.as_ref(),
        ) else {
            return Verdict::Nothing;
        };
        let write = plan(&item.binding, &placement, &now_rfc3339());
        Verdict::Planned { placement, write }
    }

    /// A guarded binding admitted under the answer (nothing to re-admit)
    /// that still delivers outside its record: repaired once the grace is
    /// over, looked at again when it will be; else `guarding` as it is.
    fn overdue_or(&self, i: usize, item: &BindingItem, guarding: Guarding) -> Verdict {
        let key = (i, item.key.clone());
        let outside = match &guarding {
            Guarding::Bounded { patch: None, .. } => outside_record(&item.raw),
            _ => BTreeSet::new(),
        };
        let due = self.overdue.lock().observe(
            &key,
            &outside,
            Instant::now(),
            self.ctx.karmada.reschedule_grace,
        );
        match due {
            Due::Nothing => Verdict::Guarded(guarding),
            Due::At(at) => Verdict::Overdue(at),
            Due::Now => Verdict::Repair(outside),
        }
    }

    /// Act on one binding's evaluation: write its placement and status.
    pub(super) async fn act_binding(
        &self,
        evaluation: BindingEvaluation,
        cancel: &CancellationToken,
    ) -> Step {
        let BindingEvaluation { i, item, verdict } = evaluation;
        let (placement, write) = match verdict {
            Verdict::Failed => return Step::Failed,
            Verdict::Nothing => return Step::Undefined,
            Verdict::Guarded(guarding) => {
                return self.act_guarded(i, &item, guarding, cancel).await;
            }
            Verdict::Overdue(at) => return Step::Overdue(at),
            Verdict::Repair(members) => return self.act_repair(i, &item, &members, cancel).await,
            Verdict::Planned { placement, write } => (placement, write),
        };
        let failed = matches!(placement, Placement::Failed { .. });
        if write.is_empty() {
            return Step::unwritten(failed);
        }
        let key = (i, item.key.clone());
        let name = describe(self.targets[i].resource(), Some(&item.key));
        let sent = self.writer.send(
            Some(&key),
            item.binding.resource_version(),
            cancel,
            self.write_binding(i, &item, &write),
        );
        match sent.await {
            Sent::Skipped(step) => step,
            Sent::Done(()) => {
                self.ctx
                    .metrics
                    .binding_schedule(if failed { "failed" } else { "scheduled" });
                tracing::info!(binding = %name, placement = ?placement, "scheduled binding");
                if let Some((normal, reason, note)) = &write.event {
                    self.binding_events(&item, *normal, reason, note);
                }
                Step::written(failed)
            }
            Sent::Failed(e) => {
                self.ctx.metrics.binding_schedule("error");
                tracing::warn!(binding = %name, error = %e, "writing the binding's placement failed; will retry");
                Step::WRITE_FAILED
            }
        }
    }

    /// Act on the guardrail's plan for one binding: admit it again with its
    /// placement bounded by the new answer.
    async fn act_guarded(
        &self,
        i: usize,
        item: &BindingItem,
        guarding: Guarding,
        cancel: &CancellationToken,
    ) -> Step {
        let name = describe(self.targets[i].resource(), Some(&item.key));
        let (bound, patch) = match guarding {
            Guarding::Undefined => return Step::Undefined,
            Guarding::Kept(why) => {
                let note = format!(
                    "the placement stays within the clusters allowed before, because {why}"
                );
                self.binding_events(item, false, "PlacementGuardKept", &note);
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
        let api = self.binding_api(i, item);
        let planned_from = item.binding.resource_version();
        let write = Writer::json_patch(&api, &item.key.name, &patch, planned_from);
        match self
            .writer
            .send(Some(&key), planned_from, cancel, write)
            .await
        {
            Sent::Skipped(step) => step,
            Sent::Done(_) => {
                self.ctx.metrics.binding_schedule("bounded");
                self.writer
                    .mark_in_flight(key, planned_from.map(str::to_owned));
                tracing::info!(binding = %name, allowed = %bound, "admitted the binding again with its placement bounded by the policy");
                let note = format!(
                    "the placement policy now allows {bound}: the placement is admitted again with its cluster names bounded to them"
                );
                self.binding_events(item, true, "PlacementBounded", &note);
                Step::written(false)
            }
            Sent::Failed(e) if is_gone(&e) => Step::Placed,
            Sent::Failed(e) => {
                self.ctx.metrics.binding_schedule("error");
                tracing::warn!(binding = %name, error = %e, "admitting the binding again failed; will retry");
                Step::WRITE_FAILED
            }
        }
    }

    /// Take `members` out of what a guarded binding delivers: karmada-scheduler
    /// did not move them within the grace. The spec write (preconditioned on
    /// the resourceVersion it was planned from) passes the webhook, as it
    /// adds nothing; then the condition, and an Event on the binding and
    /// its template.
    async fn act_repair(
        &self,
        i: usize,
        item: &BindingItem,
        members: &BTreeSet<String>,
        cancel: &CancellationToken,
    ) -> Step {
        let key = (i, item.key.clone());
        let name = describe(self.targets[i].resource(), Some(&item.key));
        let members_text = members.iter().cloned().collect::<Vec<_>>().join(", ");
        let note = repair_note(&item.raw, &members_text, self.ctx.karmada.reschedule_grace);
        let planned_from = item.binding.resource_version();
        let write = self.write_repair(i, item, members, &note);
        match self
            .writer
            .send(Some(&key), planned_from, cancel, write)
            .await
        {
            Sent::Skipped(step) => step,
            Sent::Done(()) => {
                self.overdue.lock().forget(&key);
                self.writer
                    .mark_in_flight(key, planned_from.map(str::to_owned));
                self.ctx.metrics.binding_schedule("repaired");
                tracing::warn!(binding = %name, members = %members_text, "took members the placement policy forbids out of the binding");
                self.binding_events(item, false, "ForbiddenClustersRemoved", &note);
                Step::written(false)
            }
            Sent::Failed(e) if is_gone(&e) => {
                self.overdue.lock().forget(&key);
                Step::Placed
            }
            Sent::Failed(e) => {
                self.ctx.metrics.binding_schedule("error");
                tracing::warn!(binding = %name, error = %e, "taking forbidden members out of the binding failed; will retry");
                Step::WRITE_FAILED
            }
        }
    }

    /// The repair's spec patch, then its condition.
    async fn write_repair(
        &self,
        i: usize,
        item: &BindingItem,
        members: &BTreeSet<String>,
        note: &str,
    ) -> Result<(), SyncError> {
        let api = self.binding_api(i, item);
        let updated = Writer::json_patch(
            &api,
            &item.key.name,
            &without_members(&item.raw, members),
            item.binding.resource_version(),
        )
        .await?;
        let status = json!({
            "metadata": {"resourceVersion": updated.metadata.resource_version},
            "status": {"conditions": enforced_conditions(&item.raw, note, &now_rfc3339())},
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

    /// Queue an Event on a binding and on its resource template.
    fn binding_events(&self, item: &BindingItem, normal: bool, reason: &str, note: &str) {
        let action = match item.mode {
            Mode::Schedule => "Schedule",
            Mode::Guard => "Guard",
        };
        for reference in [reference(&item.raw), template_reference(&item.binding)] {
            self.writer
                .event(reference, normal, reason, action, note.to_owned());
        }
    }

    /// The spec patch (with the resourceVersion it was planned from, so a
    /// binding changed meanwhile is planned again) and the status patch.
    async fn write_binding(
        &self,
        i: usize,
        item: &BindingItem,
        write: &BindingWrite,
    ) -> Result<(), SyncError> {
        let api = self.binding_api(i, item);
        let params = patch_params();
        let key = (i, item.key.clone());
        let planned_from = item.binding.resource_version().map(str::to_owned);
        let mut resource_version = planned_from.clone();
        let mut generation = None;
        if let Some(spec) = &write.spec {
            // The watch may deliver our own write before its response
            // arrives: known beforehand, it is no change to schedule again
            // (which would cost another template read and query each).
            self.changes
                .observe(key.clone(), written_fingerprint(&item.raw, spec), false);
            let mut patch = spec.clone();
            patch["metadata"]["resourceVersion"] = json!(resource_version);
            let updated = api
                .patch(&item.key.name, &params, &Patch::Merge(&patch))
                .await?;
            resource_version = updated.metadata.resource_version.clone();
            generation = updated.metadata.generation;
            // Our own write as stored (defaults included) is no change either.
            let written = serde_json::to_value(&updated)?;
            self.changes
                .observe(key.clone(), binding_fingerprint(&written), false);
            self.writer
                .mark_in_flight(key.clone(), planned_from.clone());
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
            api.patch_status(&item.key.name, &params, &Patch::Merge(&patch))
                .await?;
            self.writer.mark_in_flight(key, planned_from);
        }
        Ok(())
    }
}

impl Reconciler {
    /// The API of binding `item` of target `i` (its namespace's).
    fn binding_api(&self, i: usize, item: &BindingItem) -> Api<kube::api::DynamicObject> {
        let target = &self.targets[i];
        match &item.key.namespace {
            Some(ns) => {
                Api::namespaced_with(target.api.clone().into_client(), ns, target.resource())
            }
            None => target.api.clone(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_ignores_status_and_sees_spec_and_deletion() {
        let raw = json!({"metadata": {"name": "b"}, "spec": {"replicas": 2},
                         "status": {"aggregatedStatus": []}});
        let mut status = raw.clone();
        status["status"]["aggregatedStatus"] = json!([{"clusterName": "x"}]);
        assert_eq!(binding_fingerprint(&raw), binding_fingerprint(&status));
        let mut scaled = raw.clone();
        scaled["spec"]["replicas"] = json!(3);
        assert_ne!(binding_fingerprint(&raw), binding_fingerprint(&scaled));
        let mut deleting = raw.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-25T10:00:00Z");
        assert_ne!(binding_fingerprint(&raw), binding_fingerprint(&deleting));
    }

    #[test]
    fn a_placement_write_is_known_before_the_watch_brings_it() {
        let raw = json!({"metadata": {"name": "b", "resourceVersion": "7"},
                         "spec": {"replicas": 6, "clusters": [{"name": "old", "replicas": 6}]}});
        let patch = json!({"metadata": {"annotations": {"policy.karmada.io/applied-placement": "{}"}},
                           "spec": {"clusters": [{"name": "a", "replicas": 3}, {"name": "b", "replicas": 3}]}});
        // As the API server stores it: the patch merged, a new resourceVersion.
        let stored = json!({"metadata": {"name": "b", "resourceVersion": "8",
                                         "annotations": {"policy.karmada.io/applied-placement": "{}"}},
                            "spec": {"replicas": 6, "clusters": [{"name": "a", "replicas": 3}, {"name": "b", "replicas": 3}]}});
        assert_eq!(
            written_fingerprint(&raw, &patch),
            binding_fingerprint(&stored)
        );
        assert_ne!(written_fingerprint(&raw, &patch), binding_fingerprint(&raw));
    }

    #[test]
    fn times_are_written_as_kubernetes_writes_them() {
        let t = now_rfc3339();
        assert_eq!(t.len(), "2026-11-25T10:00:00Z".len(), "{t}");
        assert!(t.ends_with('Z'));
    }
}
