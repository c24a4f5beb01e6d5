//! What the reconciler decides of a workload: the placement annotations of the
//! objects the webhook evaluates. A workload is stale when its policy-owned
//! annotations differ from what the decision for its developer view asks;
//! `auto` mode PATCHes them (with a `test` of the resourceVersion the patch
//! was computed from, so it never overwrites a change it has not seen),
//! `report` mode emits an Event. The webhook runs on the PATCH too and,
//! reading the same developer view, returns the same decision: no loop.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::DynamicObject;
use kube::core::{Selector, SelectorExt};
use policy_client::decision::Decision;
use policy_client::engine::QueryOutcome;
use policy_client::ownership_keys::OwnershipKeys;
use policy_client::placement::{
    OWNERSHIP_ANNOTATION, annotations, desired_annotations, developer_view,
};
use policy_client::verdict::{Plan, plan};
use serde_json::Value;

use crate::reconcile::changes::fingerprint;
use crate::replication::watched::Need;
use crate::scope::Scope;

/// How an object's placement compares with the current decision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Assessment {
    /// The object carries what the decision asks for.
    Placed,
    /// The annotations differ; `patch` fixes them, `changed` names the annotation
    /// keys whose values change (the ownership record left out; empty when
    /// only the record's signature changes, e.g. after a key rotation).
    Stale {
        patch: json_patch::Patch,
        changed: Vec<String>,
    },
    /// The policy reports errors (none of the allowed clusters is running, or
    /// the developer's request conflicts with the policy): the object keeps
    /// its placement, since a decision with errors never removes or replaces
    /// one ([`policy_client::verdict`]), and the developer is told what the
    /// policy reports.
    Unplaceable(Vec<String>),
    /// No decision (the engine has no policy at the decision path).
    Undefined,
    /// The decision or the object cannot be used.
    Invalid(String),
}

/// Compare `object` (as stored, not the developer view) with the decision the
/// engine returned for its developer view.
pub(crate) fn assess(object: &Value, outcome: &QueryOutcome, keys: &OwnershipKeys) -> Assessment {
    let result = match outcome {
        QueryOutcome::Undefined => return Assessment::Undefined,
        QueryOutcome::Defined(result) => result,
    };
    let decision = match Decision::from_result(result) {
        Ok(d) => d,
        Err(e) => return Assessment::Invalid(e.to_string()),
    };
    let patch = match plan(object, Some(object), &decision, keys) {
        Ok(Plan::Keep { errors, .. }) => return Assessment::Unplaceable(errors),
        Ok(Plan::Place(None)) => return Assessment::Placed,
        Ok(Plan::Place(Some(patch))) => patch,
        Err(e) => return Assessment::Invalid(e.to_string()),
    };
    let current = annotations(object).ok().flatten().unwrap_or_default();
    let changed = match desired_annotations(object, &decision, keys) {
        Ok(desired) => current
            .keys()
            .chain(desired.keys())
            .filter(|k| k.as_str() != OWNERSHIP_ANNOTATION && current.get(*k) != desired.get(*k))
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        Err(e) => return Assessment::Invalid(e.to_string()),
    };
    Assessment::Stale { patch, changed }
}

/// The object carries a placement the policy wrote (its ownership record).
pub(crate) fn is_placed(object: &DynamicObject) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(OWNERSHIP_ANNOTATION))
}

/// Whether `object` matches `selector` (no selector: every object).
pub(crate) fn selected(selector: Option<&Selector>, object: &Value) -> bool {
    selector.is_none_or(|selector| {
        let labels: BTreeMap<String, String> = object
            .pointer("/metadata/labels")
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        selector.matches(&labels)
    })
}

/// What the reconciler needs of the watch of a workload type.
pub(crate) fn need(scope: &Scope) -> Need {
    Need {
        scope: None,
        fields: None,
        labels: scope.object_selector.clone(),
        listed: true,
    }
}

/// A fingerprint of what the policy sees of a workload that its own status
/// and the policy's own annotations cannot change: the developer view (see
/// [`developer_view`]) without `status`, `resourceVersion` and an empty
/// annotation map.
pub(crate) fn developer_fingerprint(object: &Value, keys: &OwnershipKeys) -> u64 {
    let mut view = developer_view(object, keys);
    if let Value::Object(map) = &mut view {
        map.remove("status");
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            meta.remove("resourceVersion");
            meta.remove("managedFields");
            // The view of a placed object that had no annotations has an
            // empty map: the same request.
            if meta
                .get("annotations")
                .and_then(Value::as_object)
                .is_some_and(|a| a.is_empty())
            {
                meta.remove("annotations");
            }
        }
    }
    fingerprint(&view)
}

#[cfg(test)]
mod tests;
