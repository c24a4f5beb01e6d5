//! The compiled form's answers compared with the interpreter's: the forms
//! regorus's VM answers without the conflict OPA reports are caught before
//! they are given where a comparison is made on the request path (after a
//! policy change, after a data change), and sent to the interpreter once a
//! comparison off the request path finds them.

use super::*;
use crate::compiled::SAMPLE_EVERY;

/// The issue's example: a cluster labelled non-EU in a `europe-*` region is
/// both `ok[name] := false` and `ok[name] := true`, a conflict OPA refuses
/// to answer; regorus's VM keeps the last write.
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

fn clusters(jurisdiction: &str) -> Value {
    json!({
        "eu-1": {"region": "europe-west1", "labels": {"jurisdiction": jurisdiction}},
        "us-1": {"region": "us-central1", "labels": {"jurisdiction": "non-eu"}}
    })
}

async fn decide(engine: &Embedded, input: &Value) -> Result<QueryOutcome, EngineError> {
    engine
        .query(crate::DEFAULT_DECISION_PATH, input, soon())
        .await
}

fn is_conflict(outcome: &Result<QueryOutcome, EngineError>) -> bool {
    matches!(outcome, Err(EngineError::Evaluation(m)) if m.contains("conflict") || m.contains("multiple"))
}

fn disagreements(engine: &Embedded) -> u64 {
    engine.answer_checks().unwrap().disagreements
}

/// The first answers after a policy change are compared before they are
/// given, and an error of the interpreter's (the conflict) where the VM
/// answered is a disagreement: the engine fails closed, as OPA does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_the_vm_overwrites_fails_closed_after_a_policy_change() {
    let engine = Embedded::new().with_decision_cache(0);
    engine
        .put_data("clusters", &clusters("non-eu"))
        .await
        .unwrap();
    engine.put_policy("ok.rego", CLUSTERS_OK).await.unwrap();
    let first = decide(&engine, &json!({})).await;
    assert!(is_conflict(&first), "{first:?}");
    assert_eq!(disagreements(&engine), 1);
    // The query is the interpreter's from then on.
    assert!(!compiled(&engine, crate::DEFAULT_DECISION_PATH));
    assert!(is_conflict(&decide(&engine, &json!({})).await));
}

/// A conflicting rule the decision only reads (a helper of another
/// package) leaves no trace in the VM's answer (an element of `errors` is
/// missing); the interpreter's conflict error is a disagreement all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_helper_fails_closed_rather_than_dropping_an_error() {
    let engine = Embedded::new().with_decision_cache(0);
    engine
        .put_policy(
            "helpers.rego",
            "package helpers

             tier := \"gold\" if input.gold

             tier := \"silver\" if input.silver
",
        )
        .await
        .unwrap();
    engine
        .put_policy(
            "p.rego",
            "package io.k8s.federation.admission

             errors contains \"gold needs PCI\" if data.helpers.tier == \"gold\"

             errors contains \"always\"
",
        )
        .await
        .unwrap();
    let agreed = decide(&engine, &json!({"gold": true})).await.unwrap();
    assert_eq!(
        agreed,
        QueryOutcome::Defined(json!({"errors": ["always", "gold needs PCI"]}))
    );
    let both = decide(&engine, &json!({"gold": true, "silver": true})).await;
    assert!(is_conflict(&both), "{both:?}");
    assert_eq!(disagreements(&engine), 1);
}

/// Once the comparisons after a policy change are spent, the first answer
/// after a data change is compared before it is given: a branch first
/// reached because a cluster was relabelled fails closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_answer_after_a_data_change_is_compared() {
    let engine = Embedded::new().with_decision_cache(0);
    engine.put_data("clusters", &clusters("eu")).await.unwrap();
    engine.put_policy("ok.rego", CLUSTERS_OK).await.unwrap();
    let fine = QueryOutcome::Defined(
        json!({"ok": {"eu-1": true, "us-1": false}, "errors": ["us-1 is not allowed"]}),
    );
    for _ in 0..100 {
        assert_eq!(decide(&engine, &json!({})).await.unwrap(), fine);
    }
    let compared = engine.answer_checks().unwrap().compared;
    assert!(compared >= 64, "{compared}");
    // eu-1 is relabelled non-EU: a conflict.
    engine
        .put_data("clusters", &clusters("non-eu"))
        .await
        .unwrap();
    let relabelled = decide(&engine, &json!({})).await;
    assert!(is_conflict(&relabelled), "{relabelled:?}");
    assert_eq!(disagreements(&engine), 1);
}

/// With policies and data standing, one answer in SAMPLE_EVERY is compared
/// once it is given: a conflict only some inputs reach is found, and the
/// query is the interpreter's (which fails closed) from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_answer_in_n_is_compared_off_the_request_path() {
    let engine = Embedded::new().with_decision_cache(0);
    engine
        .put_policy(
            "p.rego",
            "package io.k8s.federation.admission\n\n\
             ok[name] := false if {\n\tsome name in input.denied\n}\n\n\
             ok[name] := true if {\n\tsome name in input.allowed\n}\n\n\
             errors := []\n",
        )
        .await
        .unwrap();
    let plain = json!({"allowed": ["a"], "denied": ["b"]});
    for _ in 0..64 {
        decide(&engine, &plain).await.unwrap();
    }
    assert_eq!(engine.answer_checks().unwrap().compared, 64);
    // Both for "a": the VM keeps one of the two values, until the sample.
    let conflicting = json!({"allowed": ["a"], "denied": ["a"]});
    let mut failed_after = None;
    for n in 1..=(2 * SAMPLE_EVERY) {
        let outcome = decide(&engine, &conflicting).await;
        if outcome.is_err() {
            assert!(is_conflict(&outcome), "{outcome:?}");
            failed_after = Some(n);
            break;
        }
        // The comparison runs once the sampled answer is given.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let failed_after = failed_after.expect("the conflict is found by a sample");
    assert!(failed_after <= SAMPLE_EVERY, "{failed_after}");
    assert_eq!(
        disagreements(&engine),
        1,
        "{failed_after} {:?}",
        engine.answer_checks()
    );
}

/// A panic inside regorus (0.14.1's `object.subset` of an empty array) is
/// an error of that decision, and the engine goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regorus_panic_is_an_error_not_a_crash() {
    let engine = Embedded::new();
    engine
        .put_policy(
            "p.rego",
            "package io.k8s.federation.admission\n\n\
             subset := object.subset([1, 2], input.sub)\n",
        )
        .await
        .unwrap();
    let panicked = decide(&engine, &json!({"sub": []})).await;
    assert!(
        matches!(&panicked, Err(EngineError::Evaluation(m)) if m.contains("panicked")),
        "{panicked:?}"
    );
    let fine = decide(&engine, &json!({"sub": [2]})).await.unwrap();
    assert_eq!(fine, QueryOutcome::Defined(json!({"subset": true})));
}
