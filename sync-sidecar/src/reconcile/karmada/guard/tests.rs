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

fn template() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "annotations": {
        "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true"}}})
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
        &template(),
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
            &template(),
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
        &guard(
            &raw,
            &template(),
            Some(&requested),
            &allows(&["member-eu-1"]),
        ),
    );
    assert_eq!(
        out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["member-eu-1"])
    );
    let out = admitted(
        &raw,
        &guard(&raw, &template(), Some(&requested), &allows(&[])),
    );
    assert_eq!(
        out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!([NO_CLUSTER])
    );
    // Without its PropagationPolicy, what is stored can only narrow.
    let out = admitted(
        &raw,
        &guard(
            &raw,
            &template(),
            None,
            &allows(&["member-eu-1", "member-us-1"]),
        ),
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
    let Guarding::Kept(why) = guard(&raw, &template(), Some(&json!({})), &errors) else {
        panic!("errors must keep the placement")
    };
    assert!(why.contains("no cluster satisfies"), "{why}");
    assert_eq!(
        guard(
            &raw,
            &template(),
            Some(&json!({})),
            &QueryOutcome::Undefined
        ),
        Guarding::Undefined
    );
    let bad = QueryOutcome::Defined(json!({
        "annotations": {PREFERENCES_ANNOTATION: "not json"}, "errors": []}));
    assert!(matches!(
        guard(&raw, &template(), Some(&json!({})), &bad),
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

#[test]
fn a_requirement_the_policy_names_no_clusters_for_keeps_what_is_stored() {
    let raw = stored(&["member-eu-1"], "member-eu-1", &["member-eu-1"]);
    let unbounded = QueryOutcome::Defined(json!({"annotations": {}, "errors": []}));
    let Guarding::Kept(why) = guard(&raw, &template(), Some(&json!({})), &unbounded) else {
        panic!("a requirement is never unbounded")
    };
    assert!(why.contains("eu-jurisdiction-required"), "{why}");
    let plain = json!({"kind": "ConfigMap", "metadata": {"name": "cfg"}});
    assert!(matches!(
        guard(&raw, &plain, Some(&json!({})), &unbounded),
        Guarding::Bounded {
            bound: Bound::Any,
            ..
        }
    ));
}

#[test]
fn members_outside_the_record_are_found_and_taken_out() {
    let mut raw = stored(
        &["member-eu-1"],
        "member-eu-1",
        &["member-eu-1", "member-eu-2"],
    );
    raw["spec"]["requiredBy"] =
        json!([{"name": "dep", "clusters": [{"name": "member-us-1", "replicas": 1}]}]);
    let outside = outside_record(&raw);
    assert_eq!(
        outside,
        ["member-eu-2".to_owned(), "member-us-1".to_owned()].into()
    );
    let mut repaired = raw.clone();
    json_patch::patch(&mut repaired, &without_members(&raw, &outside)).unwrap();
    assert_eq!(
        repaired["spec"]["clusters"],
        json!([{"name": "member-eu-1", "replicas": 1}])
    );
    assert_eq!(repaired["spec"]["requiredBy"][0]["clusters"], json!([]));
    assert!(outside_record(&repaired).is_empty());
    // No record, or one that bounds nothing: nothing is outside.
    let unrecorded = json!({"spec": {"clusters": [{"name": "member-us-1", "replicas": 1}]}});
    assert!(outside_record(&unrecorded).is_empty());
    let any = stored(&[], "*", &["member-us-1"]);
    assert!(outside_record(&any).is_empty());
}

#[test]
fn the_federations_scheduler_gets_a_grace_before_members_are_taken_out() {
    let mut overdue = Overdue::default();
    let key: ItemKey = (
        0,
        crate::replication::document::ObjectKey::new(Some("shop"), "web"),
    );
    let grace = Duration::from_secs(15);
    let t0 = Instant::now();
    let outside: BTreeSet<String> = ["member-eu-2".to_owned()].into();
    assert_eq!(
        overdue.observe(&key, &outside, t0, grace),
        Due::At(t0 + grace)
    );
    assert_eq!(
        overdue.observe(&key, &outside, t0 + Duration::from_secs(5), grace),
        Due::At(t0 + grace),
        "the grace counts from the first sight"
    );
    assert_eq!(overdue.observe(&key, &outside, t0 + grace, grace), Due::Now);
    // Moved meanwhile: the clock stops, and starts over next time.
    assert_eq!(
        overdue.observe(&key, &BTreeSet::new(), t0 + grace, grace),
        Due::Nothing
    );
    let later = t0 + Duration::from_secs(60);
    assert_eq!(
        overdue.observe(&key, &outside, later, grace),
        Due::At(later + grace)
    );
}

#[test]
fn the_enforced_condition_names_why_and_keeps_the_others() {
    let raw = json!({"status": {"conditions": [
        {"type": "Scheduled", "status": "False", "reason": "SchedulerError",
         "message": "the number of feasible region is less than spreadConstraint.MinGroups"},
        {"type": ENFORCED_CONDITION, "status": "True", "message": "old"}]}});
    assert_eq!(
        scheduler_said(&raw),
        "Scheduled=False SchedulerError: the number of feasible region is less than spreadConstraint.MinGroups"
    );
    let conditions = enforced_conditions(&raw, "new", "2026-11-27T00:00:00Z");
    let list = conditions.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[1]["message"], "new");
    assert_eq!(list[1]["reason"], "ForbiddenClustersRemoved");
    assert_eq!(scheduler_said(&json!({})), "no Scheduled condition");
}
