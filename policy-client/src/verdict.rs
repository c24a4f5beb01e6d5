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
mod tests {
    use super::*;
    use serde_json::json;

    const PREFS: &str = "federation.kubernetes.io/replica-set-preferences";

    fn keys() -> &'static OwnershipKeys {
        static KEYS: std::sync::OnceLock<OwnershipKeys> = std::sync::OnceLock::new();
        KEYS.get_or_init(|| OwnershipKeys::ephemeral().unwrap())
    }

    fn decision(annotations: &[(&str, &str)], errors: &[&str]) -> Decision {
        Decision {
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            errors: errors.iter().map(|e| (*e).to_owned()).collect(),
            ..Decision::default()
        }
    }

    fn apply(object: &Value, patch: &Patch) -> Value {
        let mut doc = object.clone();
        json_patch::patch(&mut doc, patch).unwrap();
        doc
    }

    /// The example EU ReplicaSet, placed by the policy on two clusters.
    fn placed() -> Value {
        let object = json!({"kind": "ReplicaSet", "metadata": {"name": "rs", "namespace": "ns",
            "labels": {"app": "x"},
            "annotations": {"policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true"}}});
        let Plan::Place(Some(patch)) = plan(
            &object,
            None,
            &decision(&[(PREFS, r#"{"clusters":{"eu-1":{},"eu-2":{}}}"#)], &[]),
            keys(),
        )
        .unwrap() else {
            panic!("placed")
        };
        apply(&object, &patch)
    }

    #[test]
    fn an_error_free_decision_places() {
        let object = placed();
        let moved = decision(&[(PREFS, r#"{"clusters":{"eu-1":{}}}"#)], &[]);
        let Plan::Place(Some(patch)) = plan(&object, Some(&object), &moved, keys()).unwrap() else {
            panic!("re-placed")
        };
        assert_eq!(
            apply(&object, &patch)["metadata"]["annotations"][PREFS],
            r#"{"clusters":{"eu-1":{}}}"#
        );
    }

    /// Errors with no annotations (every allowed cluster offline) and errors
    /// beside annotations (a requested cluster the policy no longer allows)
    /// alike keep the placement.
    #[test]
    fn a_decision_with_errors_keeps_the_stored_placement() {
        let object = placed();
        for d in [
            decision(&[], &["no cluster satisfies the placement requirements"]),
            decision(
                &[(PREFS, r#"{"clusters":{"eu-1":{}}}"#)],
                &["requested replica-set-preferences includes invalid clusters: eu-2"],
            ),
        ] {
            assert_eq!(
                plan(&object, Some(&object), &d, keys()).unwrap(),
                Plan::Keep {
                    restore: None,
                    errors: d.errors.clone()
                }
            );
        }
    }

    /// An UPDATE that carries the stored annotations (`kubectl label`) needs
    /// nothing; one that lacks the policy's values and record (a PUT of the
    /// developer's manifest) gets them back exactly as stored.
    #[test]
    fn a_kept_placement_is_restored_onto_an_update_that_lacks_it() {
        let stored = placed();
        let errors = decision(&[], &["no cluster satisfies the placement requirements"]);
        let mut labelled = stored.clone();
        labelled["metadata"]["labels"]["a"] = json!("b");
        assert_eq!(
            plan(&labelled, Some(&stored), &errors, keys()).unwrap(),
            Plan::Keep {
                restore: None,
                errors: errors.errors.clone()
            }
        );
        let mut put = stored.clone();
        let annotations = put["metadata"]["annotations"].as_object_mut().unwrap();
        annotations.remove(PREFS);
        annotations.remove(OWNERSHIP_ANNOTATION);
        let Plan::Keep {
            restore: Some(patch),
            ..
        } = plan(&put, Some(&stored), &errors, keys()).unwrap()
        else {
            panic!("restored")
        };
        let restored = apply(&put, &patch);
        assert_eq!(
            restored["metadata"]["annotations"],
            stored["metadata"]["annotations"]
        );
        assert!(
            !ownership(&restored, keys()).is_empty(),
            "the record verifies"
        );
        // A CREATE has nothing stored to keep.
        assert_eq!(
            plan(&put, None, &errors, keys()).unwrap(),
            Plan::Keep {
                restore: None,
                errors: errors.errors.clone()
            }
        );
    }

    /// Through `status`, the annotations stay as stored: the placement, its
    /// record and the developer's request alike.
    #[test]
    fn the_stored_annotations_are_kept() {
        let stored = placed();
        assert_eq!(keep_stored_annotations(&stored, &stored).unwrap(), None);
        let mut forged = stored.clone();
        let annotations = forged["metadata"]["annotations"].as_object_mut().unwrap();
        annotations.insert(PREFS.into(), json!(r#"{"clusters":{"us-1":{}}}"#));
        annotations.remove(OWNERSHIP_ANNOTATION);
        annotations.insert("team".into(), json!("payments"));
        let patch = keep_stored_annotations(&forged, &stored).unwrap().unwrap();
        assert_eq!(
            apply(&forged, &patch)["metadata"]["annotations"],
            stored["metadata"]["annotations"]
        );
        // A stored object without annotations: the added ones go.
        let bare = json!({"metadata": {"name": "rs"}});
        let patch = keep_stored_annotations(&forged, &bare).unwrap().unwrap();
        assert_eq!(apply(&forged, &patch)["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn the_request_is_the_developer_views_annotations() {
        let stored = placed();
        let unchanged = |edit: &dyn Fn(&mut Value)| {
            let mut object = stored.clone();
            edit(&mut object);
            !request_changed(&object, &stored, keys())
        };
        assert!(unchanged(&|o| o["metadata"]["labels"]["a"] = json!("b")));
        assert!(unchanged(&|o| o["spec"] = json!({"replicas": 3})));
        // The policy's own value and record removed: the request is the same.
        assert!(unchanged(&|o| {
            let a = o["metadata"]["annotations"].as_object_mut().unwrap();
            a.remove(PREFS);
            a.remove(OWNERSHIP_ANNOTATION);
        }));
        // kubectl's and the controllers' bookkeeping is no request.
        assert!(unchanged(&|o| {
            o["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
                json!("{}");
            o["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!("2");
        }));
        assert!(!unchanged(
            &|o| o["metadata"]["annotations"]["team"] = json!("payments")
        ));
        assert!(!unchanged(
            &|o| o["metadata"]["annotations"][PREFS] = json!(r#"{"clusters":{"us-1":{}}}"#)
        ));
        assert!(!unchanged(&|o| {
            o["metadata"]["annotations"]
                .as_object_mut()
                .unwrap()
                .remove("policy.federation.alpha.kubernetes.io/eu-jurisdiction-required");
        }));
    }
}
