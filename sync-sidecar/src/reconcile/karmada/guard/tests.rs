use super::*;
use policy_client::karmada::{NO_CLUSTER, PREFERENCES_ANNOTATION};
use serde_json::json;

fn allows(clusters: &[&str]) -> QueryOutcome {
    let prefs: serde_json::Map<String, Value> = clusters
        .iter()
        .map(|c| ((*c).to_owned(), json!({"weight": 1})))
        .collect();
    QueryOutcome::Defined(json!({
        "annotations": {PREFERENCES_ANNOTATION: json!({"clusters": prefs}).to_string()},
        "errors": [],
    }))
}

fn stored(names: &[&str], record: &str, on: &[&str]) -> Value {
    let clusters: Vec<Value> = on
        .iter()
        .map(|c| json!({"name": c, "replicas": 1}))
        .collect();
    json!({"metadata": {"name": "web-deployment", "resourceVersion": "5",
                        "annotations": {ALLOWED_CLUSTERS_ANNOTATION: record}},
           "spec": {"placement": {"clusterAffinity": {"clusterNames": names}},
                    "clusters": clusters}})
}

fn admitted(raw: &Value, plan: &Guarding) -> Value {
    let Guarding::Bounded { patch, .. } = plan else {
        panic!("not bounded: {plan:?}")
    };
    let mut out = raw.clone();
    if let Some(p) = patch {
        json_patch::patch(&mut out, p).unwrap();
    }
    out
}

#[test]
fn a_wider_answer_widens_from_the_propagation_policys_placement() {
    let requested =
        json!({"clusterAffinity": {"clusterNames": ["member-eu-1", "member-eu-2", "member-us-1"]}});
    let raw = stored(&["member-eu-1"], "member-eu-1", &["member-eu-1"]);
    let plan = guard(
        &raw,
        Some(&requested),
        &allows(&["member-eu-1", "member-eu-2"]),
    );
    let out = admitted(&raw, &plan);
    assert_eq!(
        out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["member-eu-1", "member-eu-2"])
    );
    assert_eq!(
        out["metadata"]["annotations"][ALLOWED_CLUSTERS_ANNOTATION],
        "member-eu-1,member-eu-2"
    );
    assert!(matches!(plan, Guarding::Bounded { moves: true, .. }));
    assert_eq!(
        guard(
            &out,
            Some(&requested),
            &allows(&["member-eu-1", "member-eu-2"])
        ),
        Guarding::Bounded {
            bound: Bound::Clusters(["member-eu-1".into(), "member-eu-2".into()].into()),
            patch: None,
            moves: false
        },
        "no write once admitted"
    );
}

#[test]
fn a_narrower_answer_narrows_and_none_selects_nothing() {
    let requested = json!({});
    let raw = stored(
        &["member-eu-1", "member-eu-2"],
        "member-eu-1,member-eu-2",
        &["member-eu-2"],
    );
    let out = admitted(
        &raw,
        &guard(&raw, Some(&requested), &allows(&["member-eu-1"])),
    );
    assert_eq!(
        out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["member-eu-1"])
    );
    let out = admitted(&raw, &guard(&raw, Some(&requested), &allows(&[])));
    assert_eq!(
        out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!([NO_CLUSTER])
    );
    // Without its PropagationPolicy, what is stored can only narrow.
    let out = admitted(
        &raw,
        &guard(&raw, None, &allows(&["member-eu-1", "member-us-1"])),
    );
    assert_eq!(
        out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["member-eu-1"])
    );
}

#[test]
fn errors_and_undefined_keep_what_is_stored() {
    let raw = stored(&["member-eu-1"], "member-eu-1", &["member-eu-1"]);
    let errors =
        QueryOutcome::Defined(json!({"annotations": {}, "errors": ["no cluster satisfies"]}));
    let Guarding::Kept(why) = guard(&raw, Some(&json!({})), &errors) else {
        panic!("errors must keep the placement")
    };
    assert!(why.contains("no cluster satisfies"), "{why}");
    assert_eq!(
        guard(&raw, Some(&json!({})), &QueryOutcome::Undefined),
        Guarding::Undefined
    );
    let bad = QueryOutcome::Defined(json!({
        "annotations": {PREFERENCES_ANNOTATION: "not json"}, "errors": []}));
    assert!(matches!(
        guard(&raw, Some(&json!({})), &bad),
        Guarding::Kept(_)
    ));
}

#[test]
fn the_schedulers_own_result_is_no_change_the_guardrail_sees() {
    let raw = stored(&["member-eu-1"], "member-eu-1", &["member-eu-1"]);
    let mut rescheduled = raw.clone();
    rescheduled["spec"]["clusters"] = json!([{"name": "member-eu-1", "replicas": 4}]);
    assert_eq!(guarded_view(&raw), guarded_view(&rescheduled));
    let mut rewritten = raw.clone();
    rewritten["spec"]["placement"] = json!({});
    assert_ne!(guarded_view(&raw), guarded_view(&rewritten));
}
