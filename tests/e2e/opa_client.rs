//! policy-client against a real OPA server, and the embedded engine doing the
//! same operations with the same outcomes; and OPA's own conformance cases
//! through the embedded engine ([`conformance`]).

#[path = "opa_client/conformance.rs"]
mod conformance;

use std::time::Duration;

use placement_tests::OpaServer;
use policy_client::embedded::Embedded;
use policy_client::engine::{EngineError, PolicyEngine, QueryOutcome};
use serde_json::{Value, json};
use tokio::time::Instant;

const GOOD_V1: &str = r#"package probe

answer := {"region": data.config.region, "who": input.who}
"#;

const GOOD_V2: &str = r#"package probe

answer := {"region": data.config.region, "who": input.who, "version": 2}
"#;

const BROKEN: &str = "package probe\n\nanswer := {\n";

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// What `probe/answer` is now, `"<undefined>"` when undefined.
async fn answer(engine: &dyn PolicyEngine) -> Value {
    match engine
        .query("probe/answer", &json!({"who": "dev"}), soon())
        .await
        .expect("query")
    {
        QueryOutcome::Defined(v) => v,
        QueryOutcome::Undefined => json!("<undefined>"),
    }
}

/// The same sequence of operations on any engine; returns what each query saw.
async fn exercise(engine: &dyn PolicyEngine) -> Vec<Value> {
    let mut seen = Vec::new();
    engine.health().await.expect("healthy");
    seen.push(answer(engine).await);

    engine
        .put_policy("tests/probe.rego", GOOD_V1)
        .await
        .expect("good policy");
    engine
        .put_data("config", &json!({"region": "eu"}))
        .await
        .expect("put data");
    seen.push(answer(engine).await);

    let err = engine
        .put_policy("tests/probe.rego", BROKEN)
        .await
        .expect_err("broken policy");
    match &err {
        EngineError::Compile(errors) => {
            assert!(!errors.is_empty());
            assert!(
                errors[0]
                    .file
                    .as_deref()
                    .is_some_and(|f| f.contains("probe")),
                "{errors:?}"
            );
            assert!(errors[0].row.is_some(), "{errors:?}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    // The last good version stays in force.
    seen.push(answer(engine).await);
    engine
        .put_policy("tests/probe.rego", GOOD_V2)
        .await
        .expect("fixed policy");

    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/region", "value": "us"}]))
            .unwrap();
    engine
        .patch_data("config", &patch)
        .await
        .expect("patch data");
    seen.push(answer(engine).await);

    let missing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/absent"}])).unwrap();
    let err = engine
        .patch_data("config", &missing)
        .await
        .expect_err("patch of a missing member");
    assert!(matches!(err, EngineError::NotFound { .. }), "{err:?}");
    let err = engine
        .patch_data("nowhere/at/all", &patch)
        .await
        .expect_err("patch of a missing document");
    assert!(matches!(err, EngineError::NotFound { .. }), "{err:?}");

    engine.delete_data("config").await.expect("delete");
    engine
        .delete_data("config")
        .await
        .expect("deleting an absent document succeeds");
    seen.push(answer(engine).await);

    let ids = engine.policies().await.expect("policies");
    assert_eq!(
        ids.get("tests/probe.rego").map(String::as_str),
        Some(GOOD_V2),
        "the engine lists each module with its source"
    );
    engine
        .delete_policy("tests/probe.rego")
        .await
        .expect("delete policy");
    engine
        .delete_policy("tests/probe.rego")
        .await
        .expect("deleting an absent policy succeeds");
    seen.push(answer(engine).await);
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn opa_and_embedded_behave_the_same() {
    let opa = OpaServer::start();
    let remote = exercise(&opa.client()).await;
    let local = exercise(&Embedded::new()).await;
    assert_eq!(remote, local);
    assert_eq!(
        remote,
        vec![
            json!("<undefined>"),
            json!({"region": "eu", "who": "dev"}),
            json!({"region": "eu", "who": "dev"}),
            json!({"region": "us", "who": "dev", "version": 2}),
            json!("<undefined>"),
            json!("<undefined>"),
        ]
    );
}

/// The issue's example: a cluster labelled non-EU in a `europe-*` region is
/// both `ok[name] := false` and `ok[name] := true`, a conflict.
const CLUSTERS_OK: &str = r#"package io.k8s.federation.admission

ok[name] := false if {
	some name, cluster in data.clusters
	cluster.labels.jurisdiction == "non-eu"
}

ok[name] := true if {
	some name, cluster in data.clusters
	startswith(cluster.region, "europe-")
}

errors := [sprintf("%s is not allowed", [name]) | some name, allowed in ok; not allowed]
"#;

async fn decide(engine: &dyn PolicyEngine) -> Result<QueryOutcome, EngineError> {
    engine
        .query("io/k8s/federation/admission", &json!({}), soon())
        .await
}

fn conflict(outcome: &Result<QueryOutcome, EngineError>) -> bool {
    matches!(outcome, Err(EngineError::Evaluation(m)) if m.contains("conflict"))
}

fn clusters(eu_1_jurisdiction: &str) -> Value {
    json!({
        "eu-1": {"region": "europe-west1", "labels": {"jurisdiction": eu_1_jurisdiction}},
        "us-1": {"region": "us-central1", "labels": {"jurisdiction": "non-eu"}}
    })
}

/// A conflict OPA refuses to answer (it fails closed) is refused by the
/// embedded engine too, whose compiled form would keep one of the values:
/// when the policy arrives with the conflicting data, and when a cluster is
/// relabelled long after the policy (the comparisons that follow a policy
/// change spent), where the first decision after the change is compared
/// with the interpreter before it is given.
#[tokio::test(flavor = "multi_thread")]
async fn a_conflict_opa_refuses_the_embedded_engine_refuses_too() {
    let opa = OpaServer::start();
    let remote = opa.client();

    // The conflict is there when the policy is loaded.
    let local = Embedded::new();
    for engine in [&remote as &dyn PolicyEngine, &local] {
        engine
            .put_data("clusters", &clusters("non-eu"))
            .await
            .unwrap();
        engine.put_policy("ok.rego", CLUSTERS_OK).await.unwrap();
    }
    let (opa_says, embedded_says) = (decide(&remote).await, decide(&local).await);
    assert!(conflict(&opa_says), "OPA: {opa_says:?}");
    assert!(conflict(&embedded_says), "embedded: {embedded_says:?}");

    // The conflict comes with a relabelling, long after the policy.
    let local = Embedded::new().with_decision_cache(0);
    for engine in [&remote as &dyn PolicyEngine, &local] {
        engine.put_data("clusters", &clusters("eu")).await.unwrap();
        engine.put_policy("ok.rego", CLUSTERS_OK).await.unwrap();
    }
    let agreed = decide(&remote).await.unwrap();
    assert_eq!(
        agreed,
        QueryOutcome::Defined(
            json!({"ok": {"eu-1": true, "us-1": false}, "errors": ["us-1 is not allowed"]})
        )
    );
    for _ in 0..100 {
        assert_eq!(decide(&local).await.unwrap(), agreed);
    }
    for engine in [&remote as &dyn PolicyEngine, &local] {
        engine
            .put_data("clusters", &clusters("non-eu"))
            .await
            .unwrap();
    }
    let (opa_says, embedded_says) = (decide(&remote).await, decide(&local).await);
    assert!(conflict(&opa_says), "OPA: {opa_says:?}");
    assert!(conflict(&embedded_says), "embedded: {embedded_says:?}");
    assert_eq!(local.answer_checks().unwrap().disagreements, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn opa_without_the_token_is_unauthorized() {
    let opa = OpaServer::start();
    placement_tests::install_crypto();
    let anonymous = policy_client::opa::Opa::new(policy_client::opa::OpaConfig::new(
        opa.url().parse().unwrap(),
    ))
    .unwrap();
    let err = anonymous.put_data("x", &json!(1)).await.unwrap_err();
    assert!(
        matches!(err, EngineError::Unauthorized { status: 401 }),
        "{err:?}"
    );
    assert!(!err.is_transient());
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_opa_is_retried_until_the_deadline() {
    let mut opa = OpaServer::start();
    let client = opa.client();
    opa.kill();
    let started = Instant::now();
    let err = client
        .query(
            "probe/answer",
            &json!({}),
            started + Duration::from_millis(1500),
        )
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    match &err {
        EngineError::DeadlineExceeded { attempts, last, .. } => {
            assert!(*attempts >= 3, "{attempts} attempts");
            assert!(
                matches!(**last, EngineError::Unreachable { .. }),
                "{last:?}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        elapsed <= Duration::from_millis(1700),
        "kept to the deadline: {elapsed:?}"
    );
    assert!(err.to_string().contains("unreachable"), "{err}");
}
