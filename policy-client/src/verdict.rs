//! What a decision may do to a placement an object already has: one rule for
//! every target (the webhook's and the remediator's placement annotations, a
//! Karmada binding's clusters).
//!
//! **A decision with `errors` never removes or replaces a placement.** What
//! the policy owns on the stored object (its annotations and the ownership
//! record) stays exactly as stored until the policy gives an error-free
//! decision: a policy that cannot place a workload (every allowed cluster
//! offline, a request it rejects) must not leave it with no placement, which a
//! federation reads as "anywhere", nor hand the policy's values back to the
//! developer.
//!
//! The webhook's tolerance of existing violations (Kyverno's
//! `allowExistingViolations`) applies only to an UPDATE that leaves the
//! developer's request as it was ([`request_changed`]): labels, scaling,
//! finalizers. An UPDATE that changes the request is judged on the new object
//! alone.

use std::collections::BTreeMap;

use json_patch::Patch;
use serde_json::Value;

use crate::decision::Decision;
use crate::ownership_keys::OwnershipKeys;
use crate::placement::{
    MergeError, OWNERSHIP_ANNOTATION, annotations, developer_view, digest, ownership,
    patch_annotations_to, plan_patch,
};

/// Whether `decision` must leave the stored placement as it is (for a target
/// whose placement is not an annotation, e.g. a binding's clusters).
pub fn keeps_placement(decision: &Decision) -> bool {
    decision.is_denied()
}

/// What a decision does to an object's placement.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// An error-free decision: the patch to its annotations (`None`: the
    /// object carries them already).
    Place(Option<Patch>),
    /// A decision with errors: the stored placement stays. `restore` puts
    /// back onto the object what the policy owned on the stored object, where
    /// the object lacks it (a PUT of the developer's own manifest); `None`:
    /// nothing to restore.
    Keep {
        restore: Option<Patch>,
        errors: Vec<String>,
    },
}

/// The plan for `object` under `decision`. `stored` is the object as stored
/// (`oldObject` of an UPDATE; the object itself for the remediator; `None`
/// for a CREATE, which has no placement to keep).
pub fn plan(
    object: &Value,
    stored: Option<&Value>,
    decision: &Decision,
    keys: &OwnershipKeys,
) -> Result<Plan, MergeError> {
    if !keeps_placement(decision) {
        return Ok(Plan::Place(plan_patch(object, decision, keys)?));
    }
    let restore = match stored {
        Some(stored) => patch_annotations_to(object, &kept_annotations(object, stored, keys)?)?,
        None => None,
    };
    Ok(Plan::Keep {
        restore,
        errors: decision.errors.clone(),
    })
}

/// `object`'s annotations with the stored placement put back: every value the
/// stored object's verified record says the policy wrote (and that is still
/// what it wrote), and the record itself exactly as stored (removed when the
/// stored object has none).
fn kept_annotations(
    object: &Value,
    stored: &Value,
    keys: &OwnershipKeys,
) -> Result<BTreeMap<String, String>, MergeError> {
    let mut kept = annotations(object)?.unwrap_or_default();
    let stored_annotations = annotations(stored)?.unwrap_or_default();
    for (key, owned) in ownership(stored, keys) {
        if let Some(value) = stored_annotations.get(&key)
            && digest(value) == owned.written
        {
            kept.insert(key, value.clone());
        }
    }
    match stored_annotations.get(OWNERSHIP_ANNOTATION) {
        Some(record) => kept.insert(OWNERSHIP_ANNOTATION.to_owned(), record.clone()),
        None => kept.remove(OWNERSHIP_ANNOTATION),
    };
    Ok(kept)
}

/// The patch that puts `stored`'s annotations back onto `object`, `None`
/// when they are the same: what an update through the `status`
/// subresource, which the API server lets change metadata, may not change
/// (neither a placement the policy wrote nor the developer's request, which
/// only an update of the object itself may change, through the webhook).
pub fn keep_stored_annotations(
    object: &Value,
    stored: &Value,
) -> Result<Option<Patch>, MergeError> {
    patch_annotations_to(object, &annotations(stored)?.unwrap_or_default())
}

/// Annotation prefixes that kubectl and Kubernetes' own controllers maintain
/// (`kubectl apply`'s last-applied configuration, the Deployment controller's
/// revision and replica counts): bookkeeping, not a developer's request, so a
/// rollout or a `kubectl apply` of a label stays tolerated.
const NOT_A_REQUEST: &[&str] = &["kubectl.kubernetes.io/", "deployment.kubernetes.io/"];

/// The developer's request: the annotations of the developer view (values the
/// policy wrote replaced by what the developer had asked for), without the
/// bookkeeping of kubectl and the controllers.
pub fn developer_request(object: &Value, keys: &OwnershipKeys) -> BTreeMap<String, String> {
    let view = developer_view(object, keys);
    let mut request = annotations(&view).ok().flatten().unwrap_or_default();
    request.retain(|key, _| !NOT_A_REQUEST.iter().any(|prefix| key.starts_with(prefix)));
    request
}

/// Whether an UPDATE from `old` to `object` changes the developer's request
/// (then it is judged on the new object alone, never tolerated).
pub fn request_changed(object: &Value, old: &Value, keys: &OwnershipKeys) -> bool {
    developer_request(object, keys) != developer_request(old, keys)
}

#[cfg(test)]
mod tests;
