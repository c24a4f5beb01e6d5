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

use std::sync::Arc;

use policy_client::karmada::{
    ALLOWED_CLUSTERS_ANNOTATION, Bound, TemplateError, TemplateRef, Templates, guarded,
    stored_bound,
};
use policy_client::placement::MergeError;
use serde_json::Value;

use crate::review::{AdmissionRequest, Operation};

/// Which bindings the guardrail narrows, and how it reads their templates.
#[derive(Debug, Clone)]
pub(crate) struct Guardrail {
    /// `None` without Kubernetes API access: templates cannot be read, and
    /// every binding review then fails as a template that cannot be read.
    templates: Option<Arc<Templates>>,
    /// placement-sync's scheduler name: its bindings are not narrowed.
    own_scheduler: String,
}

/// Why a binding's template gives no decision.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TemplateFailure {
    #[error("the binding names no resource template (spec.resource)")]
    NoReference,
    #[error("no Kubernetes API access to read the binding's resource template")]
    NoClient,
    #[error("its resource template {kind} {name} does not exist")]
    Gone { kind: String, name: String },
    #[error(transparent)]
    Unreadable(#[from] TemplateError),
}

impl Guardrail {
    pub(crate) fn new(client: Option<kube::Client>, own_scheduler: String) -> Guardrail {
        Guardrail {
            templates: client.map(|c| Arc::new(Templates::new(c))),
            own_scheduler,
        }
    }

    /// Whether the guardrail narrows this binding write (not a binding of
    /// placement-sync's own scheduler).
    pub(crate) fn guards(&self, object: &Value) -> bool {
        object
            .pointer("/spec/schedulerName")
            .and_then(Value::as_str)
            != Some(self.own_scheduler.as_str())
    }

    /// An UPDATE that changes neither the placement nor the guardrail's
    /// record (karmada-scheduler writing its result, a status or eviction
    /// controller): it cannot widen what is stored, so it is not evaluated
    /// again. A changed answer reaches the binding through placement-sync.
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
mod tests {
    use super::*;
    use policy_client::karmada::NO_CLUSTER;
    use serde_json::json;

    fn request(operation: &str, object: &Value, old: Option<&Value>) -> AdmissionRequest {
        serde_json::from_value(json!({
            "uid": "u",
            "kind": {"group": "work.karmada.io", "version": "v1alpha2", "kind": "ResourceBinding"},
            "resource": {"group": "work.karmada.io", "version": "v1alpha2", "resource": "resourcebindings"},
            "operation": operation,
            "object": object,
            "oldObject": old,
        }))
        .unwrap()
    }

    fn binding(names: &[&str], record: Option<&str>) -> Value {
        let mut b = json!({"metadata": {"name": "web-deployment", "annotations": {}},
                           "spec": {"placement": {"clusterAffinity": {"clusterNames": names}},
                                    "clusters": [{"name": "member-eu-1", "replicas": 2}]}});
        if let Some(record) = record {
            b["metadata"]["annotations"][ALLOWED_CLUSTERS_ANNOTATION] = json!(record);
        }
        b
    }

    fn apply(object: &Value, patch: Option<json_patch::Patch>) -> Value {
        let mut out = object.clone();
        if let Some(p) = patch {
            json_patch::patch(&mut out, &p).unwrap();
        }
        out
    }

    /// Through `status`, a binding keeps its stored record and narrowed
    /// placement: a forged record and a widened placement are put back.
    #[test]
    fn a_status_update_keeps_the_stored_record_and_placement() {
        let stored = binding(&["member-eu-2"], Some("member-eu-1,member-eu-2"));
        assert_eq!(keep_stored_record(&stored, &stored).unwrap(), None);
        let mut forged = binding(
            &["member-eu-2", "member-us-1"],
            Some("member-eu-1,member-eu-2,member-us-1"),
        );
        forged["status"] = json!({"schedulerObservedGeneration": 3});
        let out = apply(&forged, keep_stored_record(&forged, &stored).unwrap());
        assert_eq!(out["metadata"], stored["metadata"]);
        assert_eq!(out["spec"], stored["spec"]);
        assert_eq!(
            out["status"], forged["status"],
            "the status update itself stays"
        );
        // A record removed is put back; a record added to a binding that had
        // none, and a placement added to one without, are taken away.
        let mut bare = forged.clone();
        bare["metadata"]["annotations"] = json!({});
        assert_eq!(
            apply(&bare, keep_stored_record(&bare, &stored).unwrap())["metadata"],
            stored["metadata"]
        );
        let unplaced = json!({"metadata": {"name": "web-deployment"}, "spec": {}});
        let out = apply(&forged, keep_stored_record(&forged, &unplaced).unwrap());
        assert_eq!(out["metadata"].get("annotations"), None);
        assert_eq!(out["spec"].get("placement"), None);
        assert!(keep_stored_record(&json!(5), &stored).is_err());
    }

    #[test]
    fn a_write_is_narrowed_and_recorded() {
        let object = binding(&["member-eu-2", "member-us-1"], None);
        let allowed = Bound::Clusters(["member-eu-1".into(), "member-eu-2".into()].into());
        let out = apply(&object, patch(&object, &allowed));
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!(["member-eu-2"])
        );
        assert_eq!(
            out["metadata"]["annotations"][ALLOWED_CLUSTERS_ANNOTATION],
            "member-eu-1,member-eu-2"
        );
        assert_eq!(patch(&out, &allowed), None, "narrowed already: no patch");
    }

    #[test]
    fn without_a_decision_an_update_keeps_the_stored_bound_and_a_create_gets_none() {
        let old = binding(&["member-eu-1"], Some("member-eu-1"));
        let widened = binding(
            &["member-eu-1", "member-us-1"],
            Some("member-eu-1,member-us-1"),
        );
        let update = request("UPDATE", &widened, Some(&old));
        let out = apply(&widened, patch(&widened, &fallback_bound(&update)));
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!(["member-eu-1"]),
            "a user's widening (and a forged record) is narrowed by the stored record"
        );
        assert_eq!(
            out["metadata"]["annotations"][ALLOWED_CLUSTERS_ANNOTATION],
            "member-eu-1"
        );
        let create = request("CREATE", &widened, None);
        let out = apply(&widened, patch(&widened, &fallback_bound(&create)));
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!([NO_CLUSTER])
        );
    }

    #[test]
    fn only_writes_that_keep_placement_and_record_skip_evaluation() {
        let old = binding(&["member-eu-1"], Some("member-eu-1"));
        let mut scheduled = old.clone();
        scheduled["spec"]["clusters"] = json!([{"name": "member-eu-1", "replicas": 3}]);
        assert!(Guardrail::unchanged(
            &request("UPDATE", &scheduled, Some(&old)),
            &scheduled
        ));
        let rewritten = binding(&["member-eu-1", "member-us-1"], Some("member-eu-1"));
        assert!(!Guardrail::unchanged(
            &request("UPDATE", &rewritten, Some(&old)),
            &rewritten
        ));
        let forged = binding(&["member-eu-1"], Some("member-eu-1,member-us-1"));
        assert!(!Guardrail::unchanged(
            &request("UPDATE", &forged, Some(&old)),
            &forged
        ));
        let unguarded = binding(&["member-eu-1"], None);
        assert!(
            !Guardrail::unchanged(&request("UPDATE", &unguarded, Some(&unguarded)), &unguarded),
            "a binding the guardrail never admitted is evaluated"
        );
    }

    #[test]
    fn bindings_of_placement_syncs_own_scheduler_are_left_to_it() {
        let guardrail = Guardrail::new(None, "placement-policy".to_owned());
        let mut ours = binding(&[], None);
        ours["spec"]["schedulerName"] = json!("placement-policy");
        assert!(!guardrail.guards(&ours));
        ours["spec"]["schedulerName"] = json!("default-scheduler");
        assert!(guardrail.guards(&ours));
        assert!(guardrail.guards(&binding(&[], None)));
    }
}
