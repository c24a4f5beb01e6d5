use super::*;
use policy_client::embedded::Embedded;
use policy_client::engine::QueryOutcome;
use serde_json::{Value, json};
use std::time::Duration;

const GOOD: &str = "package io.k8s.federation.admission\n\nannotations[\"a\"] := \"1\"\n";
const BETTER: &str = "package io.k8s.federation.admission\n\nannotations[\"a\"] := \"2\"\n";
const BROKEN: &str = "package io.k8s.federation.admission\n\nannotations[\"a\"] := \n";
const NS: &str = "kube-federation-scheduling-policy";
const PLACEMENT: &str = "kube-federation-scheduling-policy/placement";
const A: &str = "kube-federation-scheduling-policy/a";

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

async fn decision(engine: &dyn PolicyEngine) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    match engine
        .query("io/k8s/federation/admission", &json!({}), deadline)
        .await
        .unwrap()
    {
        QueryOutcome::Defined(v) => Some(v["annotations"]["a"].clone()),
        QueryOutcome::Undefined => None,
    }
}

#[tokio::test]
async fn broken_update_keeps_the_last_good_module_and_reports_the_error() {
    let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let set = ModuleSet::new(
        vec![NS.into()],
        engine.clone(),
        vec!["kubernetes".into()],
        "io/k8s/federation/admission",
    );

    let out = set
        .sync(PLACEMENT, Some(&data(&[("main.rego", GOOD)])), false)
        .await
        .unwrap();
    assert_eq!(
        out,
        ModuleSync {
            changed: true,
            status: Some(PolicyStatus::Ok)
        }
    );
    assert_eq!(decision(engine.as_ref()).await, Some(json!("1")));

    // Unchanged source: nothing to do.
    let out = set
        .sync(PLACEMENT, Some(&data(&[("main.rego", GOOD)])), false)
        .await
        .unwrap();
    assert!(!out.changed);

    let out = set
        .sync(PLACEMENT, Some(&data(&[("main.rego", BROKEN)])), false)
        .await
        .unwrap();
    assert!(!out.changed);
    match out.status {
        Some(PolicyStatus::Error { errors }) => {
            assert!(!errors.is_empty());
            assert!(errors[0].row.is_some(), "{errors:?}");
        }
        other => panic!("expected an error status, got {other:?}"),
    }
    assert_eq!(
        decision(engine.as_ref()).await,
        Some(json!("1")),
        "last good version in force"
    );
    assert_eq!(set.counts(), (1, 1));

    let out = set
        .sync(PLACEMENT, Some(&data(&[("main.rego", BETTER)])), false)
        .await
        .unwrap();
    assert_eq!(
        out,
        ModuleSync {
            changed: true,
            status: Some(PolicyStatus::Ok)
        }
    );
    assert_eq!(decision(engine.as_ref()).await, Some(json!("2")));
    assert_eq!(set.counts(), (1, 0));
}

#[tokio::test]
async fn reload_into_a_fresh_engine_restores_the_last_good_version() {
    let first: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let set = ModuleSet::new(
        vec![NS.into()],
        first.clone(),
        vec!["kubernetes".into()],
        "io/k8s/federation/admission",
    );
    set.sync(PLACEMENT, Some(&data(&[("main.rego", GOOD)])), false)
        .await
        .unwrap();
    set.sync(PLACEMENT, Some(&data(&[("main.rego", BROKEN)])), false)
        .await
        .unwrap();

    // Same records, new engine: what an engine restart looks like to the loader.
    let fresh: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let reloaded = ModuleSet {
        owned_namespaces: vec![NS.into()],
        engine: fresh.clone(),
        data_roots: vec!["kubernetes".into()],
        decision: "io.k8s.federation.admission".into(),
        records: Mutex::new(set.records().clone()),
    };
    let out = reloaded
        .sync(PLACEMENT, Some(&data(&[("main.rego", BROKEN)])), true)
        .await
        .unwrap();
    assert!(matches!(out.status, Some(PolicyStatus::Error { .. })));
    assert_eq!(decision(fresh.as_ref()).await, Some(json!("1")));
}

fn module_set(engine: &Arc<dyn PolicyEngine>) -> ModuleSet {
    ModuleSet::new(
        vec![NS.into()],
        engine.clone(),
        vec!["kubernetes".into()],
        "io/k8s/federation/admission",
    )
}

fn codes(status: &Option<PolicyStatus>) -> Vec<String> {
    match status {
        Some(PolicyStatus::Error { errors }) => {
            errors.iter().filter_map(|e| e.code.clone()).collect()
        }
        other => panic!("expected an error status, got {other:?}"),
    }
}

/// The decision removed while its rules stay, or one of two files of a
/// package removed: refused whole, the last good set in force.
#[tokio::test]
async fn removing_the_decision_or_part_of_a_package_is_refused_whole() {
    let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let set = module_set(&engine);
    let decision_rego = "package io.k8s.federation.admission\n\nimport data.rules\n\nannotations[\"a\"] := rules.v\n";
    let v = "package rules\n\nv := \"1\"\n";
    let w = "package rules\n\nw := \"2\"\n";
    let whole = data(&[
        ("decision.rego", decision_rego),
        ("v.rego", v),
        ("w.rego", w),
    ]);
    let out = set.sync(PLACEMENT, Some(&whole), false).await.unwrap();
    assert_eq!(out.status, Some(PolicyStatus::Ok));
    assert_eq!(decision(engine.as_ref()).await, Some(json!("1")));

    let out = set
        .sync(
            PLACEMENT,
            Some(&data(&[("v.rego", v), ("w.rego", w)])),
            false,
        )
        .await
        .unwrap();
    assert_eq!(codes(&out.status), ["removes_decision"]);
    assert_eq!(decision(engine.as_ref()).await, Some(json!("1")));
    assert_eq!(set.counts(), (3, 1), "the decision is in force, failing");

    let out = set
        .sync(
            PLACEMENT,
            Some(&data(&[("decision.rego", decision_rego), ("v.rego", v)])),
            false,
        )
        .await
        .unwrap();
    assert_eq!(codes(&out.status), ["removes_part_of_package"]);
    assert_eq!(engine.policies().await.unwrap().len(), 3, "w.rego stays");

    // Back to the whole set: ok; then the whole policy removed: accepted.
    let out = set.sync(PLACEMENT, Some(&whole), false).await.unwrap();
    assert_eq!(out.status, Some(PolicyStatus::Ok));
    let out = set.sync(PLACEMENT, None, false).await.unwrap();
    assert!(out.changed);
    assert!(engine.policies().await.unwrap().is_empty());
}

/// A restarted sidecar takes the set kept in the cluster as the last good
/// one: a ConfigMap in error leaves it in force, not nothing.
#[tokio::test]
async fn a_restored_last_good_set_stays_in_force_when_the_configmap_is_in_error() {
    let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let set = module_set(&engine);
    set.restore_last_good([(format!("{PLACEMENT}/main.rego"), GOOD.to_owned())].into());
    let out = set
        .sync(PLACEMENT, Some(&data(&[("main.rego", BROKEN)])), true)
        .await
        .unwrap();
    assert!(matches!(out.status, Some(PolicyStatus::Error { .. })));
    assert_eq!(decision(engine.as_ref()).await, Some(json!("1")));
    assert_eq!(
        set.last_good(),
        [(format!("{PLACEMENT}/main.rego"), GOOD.to_owned())].into()
    );
}

#[tokio::test]
async fn removed_keys_configmaps_and_orphans_are_deleted() {
    let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    engine
        .put_policy(&format!("{NS}/old/gone.rego"), "package old\n")
        .await
        .unwrap();
    engine
        .put_policy("elsewhere/keep.rego", "package keep\n")
        .await
        .unwrap();
    let set = ModuleSet::new(
        vec![NS.into()],
        engine.clone(),
        vec!["kubernetes".into()],
        "io/k8s/federation/admission",
    );
    set.sync(
        A,
        Some(&data(&[
            ("one.rego", "package one\n"),
            ("two.rego", "package two\n"),
        ])),
        false,
    )
    .await
    .unwrap();
    let out = set
        .sync(A, Some(&data(&[("one.rego", "package one\n")])), false)
        .await
        .unwrap();
    assert!(out.changed);
    let ids: Vec<String> = engine.policies().await.unwrap().into_keys().collect();
    assert_eq!(
        ids,
        [
            "elsewhere/keep.rego".to_owned(),
            format!("{NS}/a/one.rego"),
            format!("{NS}/old/gone.rego")
        ]
    );

    assert!(set.remove_orphans().await.unwrap());
    let out = set.sync(A, None, false).await.unwrap();
    assert_eq!(
        out,
        ModuleSync {
            changed: true,
            status: None
        }
    );
    assert_eq!(
        engine
            .policies()
            .await
            .unwrap()
            .into_keys()
            .collect::<Vec<_>>(),
        ["elsewhere/keep.rego"]
    );
    assert!(set.configmaps().is_empty());
}
