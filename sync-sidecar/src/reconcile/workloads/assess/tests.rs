use super::*;
use serde_json::json;

fn keys() -> &'static OwnershipKeys {
    static KEYS: std::sync::OnceLock<OwnershipKeys> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| OwnershipKeys::ephemeral().unwrap())
}

const PREFS: &str = "federation.kubernetes.io/replica-set-preferences";

fn decision(prefs: &str) -> QueryOutcome {
    QueryOutcome::Defined(json!({"annotations": {PREFS: prefs}, "errors": []}))
}

fn apply(object: &Value, patch: &json_patch::Patch) -> Value {
    let mut doc = object.clone();
    json_patch::patch(&mut doc, patch).unwrap();
    doc
}

#[test]
fn unannotated_object_is_stale_and_the_patch_converges() {
    let object =
        json!({"metadata": {"name": "rs", "namespace": "default", "resourceVersion": "7"}});
    let outcome = decision(r#"{"clusters":{"eu-1":{"weight":1}}}"#);
    let Assessment::Stale { patch, changed, .. } = assess(&object, &outcome, keys()) else {
        panic!("expected stale");
    };
    assert_eq!(changed, [PREFS]);
    let patched = apply(&object, &patch);
    assert_eq!(
        patched["metadata"]["annotations"][PREFS],
        r#"{"clusters":{"eu-1":{"weight":1}}}"#
    );
    assert!(patched["metadata"]["annotations"][OWNERSHIP_ANNOTATION].is_string());
    // Evaluating the patched object again (the webhook on the PATCH, or the next
    // pass) finds it placed: no loop.
    let view = developer_view(&patched, keys());
    assert!(
        view["metadata"]["annotations"].get(PREFS).is_none(),
        "developer asked for nothing"
    );
    assert_eq!(assess(&patched, &outcome, keys()), Assessment::Placed);
}

#[test]
fn policy_change_makes_the_policy_value_stale_but_not_the_developer_request() {
    let developer_prefs = r#"{"clusters":{"eu-1":{"weight":1},"eu-2":{"weight":1}}}"#;
    let object = json!({"metadata": {"name": "rs", "annotations": {PREFS: developer_prefs}}});
    // The policy narrows to eu-1.
    let first = decision(r#"{"clusters":{"eu-1":{"weight":1}}}"#);
    let Assessment::Stale { patch, .. } = assess(&object, &first, keys()) else {
        panic!()
    };
    let placed = apply(&object, &patch);
    // The developer's request survives in the developer view.
    assert_eq!(
        developer_view(&placed, keys())["metadata"]["annotations"][PREFS],
        developer_prefs
    );
    // The policy now allows both: the object goes back to the developer's request.
    let second = decision(developer_prefs);
    let Assessment::Stale { patch, changed, .. } = assess(&placed, &second, keys()) else {
        panic!("expected stale")
    };
    assert_eq!(changed, [PREFS]);
    let replaced = apply(&placed, &patch);
    assert_eq!(replaced["metadata"]["annotations"][PREFS], developer_prefs);
    assert!(
        replaced["metadata"]["annotations"]
            .get(OWNERSHIP_ANNOTATION)
            .is_none()
    );
    assert_eq!(assess(&replaced, &second, keys()), Assessment::Placed);
}

#[test]
fn errors_undefined_and_bad_shapes() {
    let object = json!({"metadata": {"name": "rs"}});
    assert_eq!(
        assess(
            &object,
            &QueryOutcome::Defined(json!({"annotations": {}, "errors": ["no cluster allowed"]})),
            keys()
        ),
        Assessment::Unplaceable(vec!["no cluster allowed".into()])
    );
    assert_eq!(
        assess(&object, &QueryOutcome::Undefined, keys()),
        Assessment::Undefined
    );
    assert!(matches!(
        assess(&object, &QueryOutcome::Defined(json!("x")), keys()),
        Assessment::Invalid(_)
    ));
    assert!(matches!(
        assess(
            &object,
            &QueryOutcome::Defined(json!({"annotations": {"bad key!": "v"}, "errors": []})),
            keys()
        ),
        Assessment::Invalid(_)
    ));
    // A decision without `errors` (or `annotations`) is an incomplete policy.
    assert!(matches!(
        assess(
            &object,
            &QueryOutcome::Defined(json!({"annotations": {}})),
            keys()
        ),
        Assessment::Invalid(_)
    ));
    assert_eq!(
        assess(
            &object,
            &QueryOutcome::Defined(json!({"annotations": {}, "errors": []})),
            keys()
        ),
        Assessment::Placed
    );
}

/// A request the policy no longer allows: errors and the intersection. A decision with
/// errors never removes or replaces a placement: the object keeps what it
/// has (here the developer's own request of a and b) and the errors are
/// named for the developer; so does one the policy placed, when the
/// policy can place it nowhere any more.
#[test]
fn a_conflict_keeps_the_placement_and_names_the_errors() {
    let object = json!({"metadata": {"name": "rs", "namespace": "default", "resourceVersion": "3",
        "annotations": {PREFS: r#"{"clusters":{"a":{"weight":1},"b":{"weight":1}}}"#}}});
    let conflict = QueryOutcome::Defined(json!({
        "annotations": {PREFS: {"clusters": {"a": {"weight": 1}}, "rebalance": true}},
        "errors": ["requested replica-set-preferences includes invalid clusters: b"]
    }));
    assert_eq!(
        assess(&object, &conflict, keys()),
        Assessment::Unplaceable(vec![
            "requested replica-set-preferences includes invalid clusters: b".into()
        ])
    );
    let unplaced = json!({"metadata": {"name": "rs", "namespace": "default"}});
    let Assessment::Stale { patch, .. } =
        assess(&unplaced, &decision(r#"{"clusters":{"a":{}}}"#), keys())
    else {
        panic!("placed by the policy")
    };
    let placed = apply(&unplaced, &patch);
    let nowhere = QueryOutcome::Defined(json!({
        "annotations": {}, "errors": ["no cluster satisfies the placement requirements"]
    }));
    assert_eq!(
        assess(&placed, &nowhere, keys()),
        Assessment::Unplaceable(vec![
            "no cluster satisfies the placement requirements".into()
        ])
    );
}

#[test]
fn the_fingerprint_ignores_status_and_the_policys_own_placement() {
    let object = json!({
        "metadata": {"name": "rs", "namespace": "default", "resourceVersion": "7", "labels": {"app": "a"}},
        "spec": {"replicas": 1},
        "status": {"replicas": 0}
    });
    let outcome = decision(r#"{"clusters":{"eu-1":{"weight":1}}}"#);
    let Assessment::Stale { patch, .. } = assess(&object, &outcome, keys()) else {
        panic!("expected stale");
    };
    let placed = apply(&object, &patch);
    let print = |o: &Value| developer_fingerprint(o, keys());
    assert_eq!(print(&object), print(&placed), "the policy's own PATCH");
    let mut status = placed.clone();
    status["status"]["replicas"] = json!(3);
    status["metadata"]["resourceVersion"] = json!("8");
    assert_eq!(print(&placed), print(&status), "a status update");
    let mut labelled = placed.clone();
    labelled["metadata"]["labels"]["tier"] = json!("web");
    assert_ne!(print(&placed), print(&labelled), "a label edit");
    let mut requested = placed.clone();
    requested["metadata"]["annotations"][PREFS] = json!(r#"{"clusters":{"eu-2":{}}}"#);
    assert_ne!(print(&placed), print(&requested), "a new request");
}
