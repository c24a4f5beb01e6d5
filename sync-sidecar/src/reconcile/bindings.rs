//! Karmada bindings as a target of the reconciler: the scheduler. A binding
//! whose `spec.schedulerName` is ours is placed where the decision for its
//! resource template puts it (the template as the webhook sees it, plus the
//! binding under `input._binding`), with exactly the writes karmada-scheduler
//! makes ([`crate::reconcile::karmada::binding`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::events::EventType;
use policy_client::{BINDING_INPUT_KEY, QueryOutcome};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::changes::fingerprint;
use super::pass::Step;
use super::target::{BindingItem, Item, Kind, describe};
use super::{FIELD_MANAGER, Reconciler};
use crate::error::SyncError;
use crate::reconcile::karmada::binding::{
    Binding, BindingWrite, Placement, ResourceRef, placement, plan,
};
use crate::replication::document::{ObjectKey, object_value};
use crate::replication::watched::Need;

/// The binding types of Karmada, scheduled when the scheduler is on.
pub(crate) const BINDING_TYPES: [(&str, &str, &str); 2] = [
    ("work.karmada.io", "v1alpha2", "resourcebindings"),
    ("work.karmada.io", "v1alpha2", "clusterresourcebindings"),
];

/// Karmada's Cluster type; its replicated objects name the clusters a
/// placement may use.
pub(crate) const KARMADA_CLUSTERS: (&str, &str, &str) =
    ("cluster.karmada.io", "v1alpha1", "clusters");

/// What the scheduler needs of a binding type's watch.
pub(crate) fn need() -> Need {
    Need {
        listed: true,
        ..Need::default()
    }
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
}

impl BindingEvaluation {
    /// Whether this write would move a placement the binding has.
    pub(crate) fn replaces_a_placement(&self) -> bool {
        !self.item.binding.clusters().is_empty()
            && matches!(&self.verdict, Verdict::Planned { write, .. } if write.moves)
    }
}

/// Resource types of templates found by discovery, by apiVersion and kind.
#[derive(Default)]
pub(crate) struct TemplateTypes {
    found: std::sync::Mutex<HashMap<(String, String), (ApiResource, bool)>>,
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
                if binding.skip(&self.ctx.scheduler_name).is_some() {
                    return None;
                }
                Some(Item::Binding(
                    i,
                    Arc::new(BindingItem { key, raw, binding }),
                ))
            },
        )
    }

    /// The names of the Karmada Clusters replicated, when they are.
    fn known_clusters(&self) -> Option<BTreeSet<String>> {
        let clusters = self.karmada_clusters.as_ref()?;
        Some(
            clusters
                .objects
                .snapshot(|_| true)
                .into_iter()
                .map(|(key, _)| key.name)
                .collect(),
        )
    }

    /// The template of a binding as stored, with its resource type: from the
    /// watch of its type when it is watched and current, else from the API
    /// server. `None` when it is gone.
    async fn template(
        &self,
        template: &ResourceRef,
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
        let (resource, namespaced) = self.template_type(template).await?;
        let client = self.ctx.client.clone();
        let api: Api<DynamicObject> = match (&template.namespace, namespaced) {
            (Some(ns), true) => Api::namespaced_with(client, ns, &resource),
            _ => Api::all_with(client, &resource),
        };
        Ok(api
            .get_opt(&template.name)
            .await?
            .map(|object| (object_value(&object, &resource), resource)))
    }

    async fn template_type(
        &self,
        template: &ResourceRef,
    ) -> Result<(ApiResource, bool), SyncError> {
        let id = (template.api_version.clone(), template.kind.clone());
        if let Some(found) = self
            .templates
            .found
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
        {
            return Ok(found.clone());
        }
        let (group, version) = match template.api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", template.api_version.as_str()),
        };
        let gvk = GroupVersionKind::gvk(group, version, &template.kind);
        let (resource, capabilities) = kube::discovery::pinned_kind(&self.ctx.client, &gvk)
            .await
            .map_err(|e| SyncError::Discovery {
            gvr: format!("{}/{}", template.api_version, template.kind),
            reason: e.to_string(),
        })?;
        let found = (
            resource,
            capabilities.scope == kube::discovery::Scope::Namespaced,
        );
        self.templates
            .found
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, found.clone());
        Ok(found)
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
        let mut input = self.update_input(&template, &template_type);
        if let Value::Object(map) = &mut input {
            map.insert(
                BINDING_INPUT_KEY.to_owned(),
                Binding::policy_view(&item.raw),
            );
        }
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
        let write = plan(&item.binding, &placement, &now());
        Verdict::Planned { placement, write }
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
            Verdict::Planned { placement, write } => (placement, write),
        };
        let failed = matches!(placement, Placement::Failed { .. });
        if write.is_empty() {
            return if failed {
                Step::Unplaceable
            } else {
                Step::Placed
            };
        }
        let key = (i, item.key.clone());
        if self.is_in_flight(&key, item.binding.resource_version()) {
            return Step::InFlight;
        }
        self.limiter.acquire().await;
        if cancel.is_cancelled() || !self.may_act() {
            return Step::Aborted;
        }
        let name = describe(self.targets[i].resource(), Some(&item.key));
        match self.write_binding(i, &item, &write).await {
            Ok(()) => {
                self.ctx
                    .metrics
                    .binding_schedule(if failed { "failed" } else { "scheduled" });
                tracing::info!(binding = %name, placement = ?placement, "scheduled binding");
                if let Some((normal, reason, note)) = &write.event {
                    let type_ = if *normal {
                        EventType::Normal
                    } else {
                        EventType::Warning
                    };
                    for reference in [
                        binding_reference(&item.raw),
                        template_reference(&item.binding),
                    ] {
                        self.events
                            .queue(reference, type_, reason, "Schedule", note.clone());
                    }
                }
                if failed {
                    Step::Unplaceable
                } else {
                    Step::Stale {
                        patched: true,
                        failed: false,
                    }
                }
            }
            Err(e) => {
                self.ctx.metrics.binding_schedule("error");
                tracing::warn!(binding = %name, error = %e, "writing the binding's placement failed; will retry");
                Step::Stale {
                    patched: false,
                    failed: true,
                }
            }
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
        let target = &self.targets[i];
        let api = match &item.key.namespace {
            Some(ns) => {
                Api::namespaced_with(target.api.clone().into_client(), ns, target.resource())
            }
            None => target.api.clone(),
        };
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
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
            self.mark_in_flight(key.clone(), planned_from.clone());
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
            self.mark_in_flight(key, planned_from);
        }
        Ok(())
    }
}

/// Now, as Kubernetes writes times (RFC 3339, seconds, UTC).
fn now() -> String {
    serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now()))
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn binding_reference(raw: &Value) -> ObjectReference {
    let text = |pointer: &str| {
        raw.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    ObjectReference {
        api_version: text("/apiVersion"),
        kind: text("/kind"),
        name: text("/metadata/name"),
        namespace: text("/metadata/namespace"),
        uid: text("/metadata/uid"),
        ..ObjectReference::default()
    }
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
        let t = now();
        assert_eq!(t.len(), "2026-11-25T10:00:00Z".len(), "{t}");
        assert!(t.ends_with('Z'));
    }
}
