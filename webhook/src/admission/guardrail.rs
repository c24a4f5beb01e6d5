//! The Karmada guardrail in admission: every write of a ResourceBinding or
//! ClusterResourceBinding (the detector's rewrites on every reconcile, a
//! user's edit, placement-sync's re-admission) has its `spec.placement`
//! narrowed to the clusters the policy allows for the binding's resource
//! template ([`policy_client::karmada`]), so karmada-scheduler, unchanged,
//! only ever chooses among them.
//!
//! A decision that cannot be used (errors, undefined, the engine or the
//! template unavailable) never widens what is stored: an UPDATE is narrowed
//! by the stored binding's bound ([`stored_bound`]), a CREATE with errors to
//! no cluster; a CREATE without any decision fails closed iff policies exist.
//! Bindings handed to placement-sync's own scheduler (`schedulerName`) are
//! left to it: it applies the policy in full.
//!
//! Its one home: the mechanics ([`Guardrail`]: which bindings, their
//! templates, the patch) and the policy ([`Admission::guard_binding`]: what
//! a decision, or its absence, narrows a binding to). What a binding write
//! delivers is checked in `/validate` by the delivery guard.

use std::sync::Arc;

use policy_client::karmada::{
    ALLOWED_CLUSTERS_ANNOTATION, Bound, TemplateRef, Templates, guarded, stored_bound,
};
use policy_client::placement::MergeError;
use serde_json::Value;

use policy_client::decision::Decision;
use policy_client::delivery::allowed;
use policy_client::input::PolicyInput;
use policy_client::karmada::template_input;
use policy_client::text::bounded;
use tokio::time::Instant;

use super::Admission;
use crate::failure::{PlacementFailure, TemplateFailure};
use crate::metrics::Outcome;
use crate::review::{AdmissionRequest, AdmissionResponse, Operation};

/// Which bindings the guardrail narrows, and how it reads their templates.
#[derive(Clone)]
pub(crate) struct Guardrail {
    /// `None` without Kubernetes API access: templates cannot be read, and
    /// every binding review then fails as a template that cannot be read.
    templates: Option<Arc<Templates>>,
    /// placement-sync's scheduler name: its bindings are not narrowed.
    own_scheduler: String,
    /// The API, for what the delivery guard reads (an OCM Placement's
    /// decisions); `None` without Kubernetes API access.
    client: Option<kube::Client>,
}

impl std::fmt::Debug for Guardrail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guardrail")
            .field("templates", &self.templates)
            .field("own_scheduler", &self.own_scheduler)
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl Guardrail {
    pub(crate) fn new(client: Option<kube::Client>, own_scheduler: String) -> Guardrail {
        Guardrail {
            templates: client.clone().map(|c| Arc::new(Templates::new(c))),
            own_scheduler,
            client,
        }
    }

    /// The API client, when the webhook has one.
    pub(crate) fn client(&self) -> Option<&kube::Client> {
        self.client.as_ref()
    }

    /// Whether the guardrail narrows this binding write (not a binding of
    /// placement-sync's own scheduler).
    pub(crate) fn guards(&self, object: &Value) -> bool {
        object
            .pointer("/spec/schedulerName")
            .and_then(Value::as_str)
            != Some(self.own_scheduler.as_str())
    }

    /// An UPDATE that changes neither the placement, the guardrail's record
    /// nor the template the binding propagates (karmada-scheduler writing
    /// its result, a status or eviction controller): it cannot widen what is
    /// stored, so its placement is not narrowed again. What it delivers
    /// (`spec.clusters`, `spec.requiredBy`) is checked apart, in validation
    /// ([`crate::admission`]'s delivery guard). A changed answer reaches the
    /// binding through placement-sync.
    pub(crate) fn unchanged(request: &AdmissionRequest, object: &Value) -> bool {
        let Some(old) = request.old_object.as_ref() else {
            return false;
        };
        let record = |v: &Value| {
            v.pointer("/metadata/annotations")
                .and_then(|a| a.get(ALLOWED_CLUSTERS_ANNOTATION))
                .cloned()
        };
        request.operation == Operation::Update
            && record(old).is_some()
            && object.pointer("/spec/placement") == old.pointer("/spec/placement")
            && object.pointer("/spec/resource") == old.pointer("/spec/resource")
            && record(object) == record(old)
    }

    /// The binding's resource template, with its type: the version the
    /// binding names when the write keeps the stored binding's reference (the
    /// detector's rewrites), else the current one (the writer chose the
    /// reference: an old version must not decide).
    pub(crate) async fn template(
        &self,
        request: &AdmissionRequest,
        binding: &Value,
    ) -> Result<(Value, kube::api::ApiResource), TemplateFailure> {
        let reference = TemplateRef::of(binding).ok_or(TemplateFailure::NoReference)?;
        let templates = self.templates.as_ref().ok_or(TemplateFailure::NoClient)?;
        let kept_reference = request
            .old_object
            .as_ref()
            .is_some_and(|old| old.pointer("/spec/resource") == binding.pointer("/spec/resource"));
        let found = if kept_reference {
            templates.get_version(&reference).await?
        } else {
            templates.get(&reference).await?
        };
        found.ok_or_else(|| TemplateFailure::Gone {
            kind: reference.kind.clone(),
            name: match &reference.namespace {
                Some(ns) => format!("{ns}/{}", reference.name),
                None => reference.name.clone(),
            },
        })
    }
}

impl Admission {
    /// A Karmada binding write in `/mutate`: its placement narrowed to the
    /// clusters the policy allows its template ([`Guardrail`]). No binding
    /// write is denied here for the policy's errors (the detector's updates
    /// carry the template's scaling too); what a write delivers is checked in
    /// `/validate` (the delivery guard).
    pub(super) async fn guard_binding(
        &self,
        request: &AdmissionRequest,
        object: &Value,
    ) -> (AdmissionResponse, Outcome) {
        let uid = request.uid.as_str();
        if !self.guardrail.guards(object) || Guardrail::unchanged(request, object) {
            return (AdmissionResponse::allow(uid), Outcome::Skipped);
        }
        let (bound, kept) = match self.binding_decision(request, object).await {
            Ok((decision, template)) => match allowed(&template, &decision) {
                Ok(bound) => (bound, None),
                Err(refusal) => (
                    fallback_bound(request),
                    Some(format!("for the binding's resource template, {refusal}")),
                ),
            },
            // Without a decision a new binding fails closed iff policies exist.
            Err(failure) if request.operation == Operation::Create => {
                return self.guard(request, failure);
            }
            Err(failure) => {
                self.count_engine_error(&failure);
                (fallback_bound(request), Some(failure.to_string()))
            }
        };
        let patch = patch(object, &bound);
        let mut response = AdmissionResponse::allow(uid);
        if let Some(patch) = &patch {
            response = response.with_patch(patch);
        }
        match kept {
            None if patch.is_some() => (response, Outcome::Patched),
            None => (response, Outcome::Unchanged),
            Some(why) => {
                let message = bounded(format!(
                    "placement-policy: the binding's placement is kept within the clusters allowed before ({bound}), because {why}"
                ));
                tracing::warn!(uid, "{message}");
                self.events.emit(request, "PlacementGuardKept", &message);
                (response.with_warning(message), Outcome::Tolerated)
            }
        }
    }

    /// The decision for a binding's resource template, and the template.
    pub(super) async fn binding_decision(
        &self,
        request: &AdmissionRequest,
        binding: &Value,
    ) -> Result<(Decision, Value), PlacementFailure> {
        let deadline = Instant::now() + self.settings.engine_deadline;
        let keys = self.keys()?;
        let (template, resource) = self.guardrail.template(request, binding).await?;
        let input = template_input(&template, &resource, binding, &keys);
        let decision = self.query(&PolicyInput::from(input), deadline).await?;
        Ok((decision, template))
    }
}

/// The binding the guardrail admits under `bound`, as a patch of `object`
/// (`None`: it is that already).
pub(crate) fn patch(object: &Value, bound: &Bound) -> Option<json_patch::Patch> {
    let requested = object
        .pointer("/spec/placement")
        .cloned()
        .unwrap_or(Value::Null);
    let narrowed = guarded(object, &requested, bound);
    let patch = json_patch::diff(object, &narrowed);
    (!patch.0.is_empty()).then_some(patch)
}

/// A binding as `stored` holds its record, as a patch of `object` (`None`:
/// it is that already): its annotations (the guardrail's record among them)
/// and its narrowed `spec.placement`, which an update through the `status`
/// subresource may not change. An `object` that is not a JSON object is
/// an error.
pub(crate) fn keep_stored_record(
    object: &Value,
    stored: &Value,
) -> Result<Option<json_patch::Patch>, MergeError> {
    let mut kept = object.clone();
    let Some(root) = kept.as_object_mut() else {
        return Err(MergeError::InvalidObject(
            "a binding that is not a JSON object".to_owned(),
        ));
    };
    for (parent, field) in [("metadata", "annotations"), ("spec", "placement")] {
        let value = stored.get(parent).and_then(|p| p.get(field)).cloned();
        match (root.get_mut(parent).and_then(Value::as_object_mut), value) {
            (Some(into), Some(value)) => {
                into.insert(field.to_owned(), value);
            }
            (Some(into), None) => {
                into.remove(field);
            }
            (None, Some(value)) => {
                root.insert(parent.to_owned(), serde_json::json!({ field: value }));
            }
            (None, None) => {}
        }
    }
    let patch = json_patch::diff(object, &kept);
    Ok((!patch.0.is_empty()).then_some(patch))
}

/// The bound a write is narrowed by when no decision can be used: the stored
/// binding's for an UPDATE (never wider than what is stored), no cluster for
/// a CREATE.
pub(crate) fn fallback_bound(request: &AdmissionRequest) -> Bound {
    match (&request.operation, &request.old_object) {
        (Operation::Update, Some(old)) => stored_bound(old),
        _ => Bound::Clusters(Default::default()),
    }
}

#[cfg(test)]
mod tests;
