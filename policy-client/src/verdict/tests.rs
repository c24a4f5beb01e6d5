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
