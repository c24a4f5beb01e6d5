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

/// The shipped packages, owned by the policy namespace.
fn owners() -> PackageOwners {
    PackageOwners::new(
        crate::policies::owners::SHIPPED_PACKAGES.map(str::to_owned),
        [NS.to_owned()],
    )
}

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
        owners(),
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
        owners(),
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
        owners: owners(),
        records: Mutex::new(set.records.lock().clone()),
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
        owners(),
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
        owners(),
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

/// The shipped packages in the policy namespace: the decision names the
/// clusters its rules allow.
const OWNED_DECISION: &str = "package io.k8s.federation.admission\n\nimport data.io.k8s.federation.placement\n\nannotations[\"a\"] := concat(\",\", sort(placement.allowed)) if placement.loaded\n";
const OWNED_RULES: &str =
    "package io.k8s.federation.placement\n\nloaded := true\n\nallowed contains \"eu-1\"\n";
const TENANT: &str = "team-a/tenant-policy";

/// A tenant's module extending a shipped package is refused, its status
/// naming the package and who may write it, and the set in force stays as
/// it was; a module of its own package loads; the policy namespace still
/// extends the package.
#[tokio::test]
async fn a_module_writing_a_package_its_namespace_does_not_own_is_refused() {
    let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let set = module_set(&engine);
    let out = set
        .sync(
            PLACEMENT,
            Some(&data(&[
                ("placement.rego", OWNED_DECISION),
                ("placement_rules.rego", OWNED_RULES),
            ])),
            false,
        )
        .await
        .unwrap();
    assert_eq!(out.status, Some(PolicyStatus::Ok));
    assert_eq!(decision(engine.as_ref()).await, Some(json!("eu-1")));

    for extension in [
        "package io.k8s.federation.placement\n\nallowed contains \"us-1\"\n",
        // A conflict would make every decision fail.
        "package io.k8s.federation.placement\n\nloaded := false\n",
        "package io.k8s\n\nfederation.placement.allowed contains \"us-1\"\n",
    ] {
        let out = set
            .sync(TENANT, Some(&data(&[("main.rego", extension)])), false)
            .await
            .unwrap();
        assert!(!out.changed, "{extension}");
        let Some(PolicyStatus::Error { errors }) = &out.status else {
            panic!("expected an error status, got {:?}", out.status);
        };
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].code.as_deref(), Some("owned_package"));
        assert_eq!(
            errors[0].file.as_deref(),
            Some("team-a/tenant-policy/main.rego")
        );
        assert!(
            errors[0]
                .message
                .contains(&format!("package io.k8s.federation.placement, which namespace team-a does not own: only ConfigMaps in namespace {NS} may")),
            "{}",
            errors[0].message
        );
        assert_eq!(
            decision(engine.as_ref()).await,
            Some(json!("eu-1")),
            "{extension}"
        );
        assert_eq!(engine.policies().await.unwrap().len(), 2, "{extension}");
    }

    // The tenant's own package loads.
    let out = set
        .sync(
            TENANT,
            Some(&data(&[(
                "main.rego",
                "package tenant.rules\n\nok := true\n",
            )])),
            false,
        )
        .await
        .unwrap();
    assert_eq!(out.status, Some(PolicyStatus::Ok));
    // An edit of it into the shipped package is refused; its last good
    // version stays.
    let out = set
        .sync(
            TENANT,
            Some(&data(&[(
                "main.rego",
                "package io.k8s.federation.placement\n\nallowed contains \"us-1\"\n",
            )])),
            false,
        )
        .await
        .unwrap();
    assert_eq!(codes(&out.status), ["owned_package"]);
    assert_eq!(
        engine.policies().await.unwrap()[&format!("{TENANT}/main.rego")],
        "package tenant.rules\n\nok := true\n"
    );
    assert_eq!(decision(engine.as_ref()).await, Some(json!("eu-1")));

    // The policy namespace owns the package: it may extend it.
    let out = set
        .sync(
            &format!("{NS}/extra"),
            Some(&data(&[(
                "main.rego",
                "package io.k8s.federation.placement\n\nallowed contains \"us-1\"\n",
            )])),
            false,
        )
        .await
        .unwrap();
    assert_eq!(out.status, Some(PolicyStatus::Ok));
    assert_eq!(decision(engine.as_ref()).await, Some(json!("eu-1,us-1")));
}

/// A trespassing module from before the owners were configured so is not
/// put back from the kept set, and one the engine still holds is removed.
#[tokio::test]
async fn a_trespassing_module_loaded_earlier_is_neither_restored_nor_kept() {
    let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let extension = "package io.k8s.federation.placement\n\nallowed contains \"us-1\"\n";
    let tenant_id = format!("{TENANT}/main.rego");
    for (id, source) in [
        (format!("{PLACEMENT}/placement.rego"), OWNED_DECISION),
        (format!("{PLACEMENT}/placement_rules.rego"), OWNED_RULES),
        (tenant_id.clone(), extension),
    ] {
        engine.put_policy(&id, source).await.unwrap();
    }
    assert_eq!(decision(engine.as_ref()).await, Some(json!("eu-1,us-1")));
    let set = module_set(&engine);
    set.restore_last_good(
        [
            (
                format!("{PLACEMENT}/placement.rego"),
                OWNED_DECISION.to_owned(),
            ),
            (
                format!("{PLACEMENT}/placement_rules.rego"),
                OWNED_RULES.to_owned(),
            ),
            (tenant_id.clone(), extension.to_owned()),
        ]
        .into(),
    );
    assert!(!set.last_good().contains_key(&tenant_id));
    // A full sync: every ConfigMap again, then the orphans.
    set.sync(
        PLACEMENT,
        Some(&data(&[
            ("placement.rego", OWNED_DECISION),
            ("placement_rules.rego", OWNED_RULES),
        ])),
        true,
    )
    .await
    .unwrap();
    let out = set
        .sync(TENANT, Some(&data(&[("main.rego", extension)])), true)
        .await
        .unwrap();
    assert_eq!(codes(&out.status), ["owned_package"]);
    assert!(set.remove_orphans().await.unwrap());
    assert!(!engine.policies().await.unwrap().contains_key(&tenant_id));
    assert_eq!(decision(engine.as_ref()).await, Some(json!("eu-1")));
}
