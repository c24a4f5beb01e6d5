use super::*;
use serde_json::json;

fn keys() -> &'static OwnershipKeys {
    static KEYS: std::sync::OnceLock<OwnershipKeys> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| OwnershipKeys::ephemeral().unwrap())
}

fn deployment() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "web", "namespace": "shop"}})
}

fn answer(clusters: &[(&str, i64)], reasons: &[(&str, &str)], errors: &[&str]) -> QueryOutcome {
    let prefs: serde_json::Map<String, Value> = clusters
        .iter()
        .map(|(n, w)| ((*n).to_owned(), json!({"weight": w})))
        .collect();
    let reasons: serde_json::Map<String, Value> = reasons
        .iter()
        .map(|(n, r)| ((*n).to_owned(), json!(r)))
        .collect();
    QueryOutcome::Defined(json!({
        "annotations": {PREFERENCES_ANNOTATION: {"clusters": prefs, "rebalance": true},
                        REASONS_ANNOTATION: reasons},
        "errors": errors,
    }))
}

fn subject(name: &str) -> Subject {
    Subject {
        name: name.to_owned(),
    }
}

#[test]
fn an_answer_names_the_allowed_clusters_with_weights_and_reasons() {
    let read = read(
        &deployment(),
        &answer(&[("a", 1), ("b", 3)], &[("a", "running")], &[]),
        keys(),
    );
    let Read::Clusters(clusters) = read else {
        panic!("{read:?}")
    };
    assert_eq!(clusters["a"].weight, 1);
    assert_eq!(clusters["a"].reason.as_deref(), Some("running"));
    assert_eq!(clusters["b"].weight, 3);
    assert_eq!(clusters["b"].reason, None);
}

#[test]
fn no_placement_restricts_nothing_and_undefined_decides_nothing() {
    let none = QueryOutcome::Defined(json!({"annotations": {}, "errors": []}));
    assert_eq!(read(&deployment(), &none, keys()), Read::Unrestricted);
    let star = answer(&[("*", 1)], &[], &[]);
    assert_eq!(read(&deployment(), &star, keys()), Read::Unrestricted);
    assert_eq!(
        read(&deployment(), &QueryOutcome::Undefined, keys()),
        Read::Undefined
    );
    let incomplete = QueryOutcome::Defined(json!({"annotations": {}}));
    assert!(matches!(
        read(&deployment(), &incomplete, keys()),
        Read::Errors(_)
    ));
    let bad = QueryOutcome::Defined(
        json!({"annotations": {PREFERENCES_ANNOTATION: "not json"}, "errors": []}),
    );
    assert!(matches!(read(&deployment(), &bad, keys()), Read::Errors(_)));
}

#[test]
fn every_restricting_answer_must_allow_a_cluster() {
    let answers = [
        (
            subject("Deployment shop/web"),
            Read::Clusters(
                [
                    (
                        "a".to_owned(),
                        Allowance {
                            weight: 1,
                            reason: Some("in the EU".into()),
                        },
                    ),
                    (
                        "b".to_owned(),
                        Allowance {
                            weight: 1,
                            reason: Some("in the EU".into()),
                        },
                    ),
                ]
                .into(),
            ),
        ),
        (subject("ConfigMap shop/conf"), Read::Unrestricted),
        (
            subject("Placement shop/web"),
            Read::Clusters(
                [
                    (
                        "b".to_owned(),
                        Allowance {
                            weight: 2,
                            reason: Some("running".into()),
                        },
                    ),
                    (
                        "c".to_owned(),
                        Allowance {
                            weight: 1,
                            reason: Some("running".into()),
                        },
                    ),
                ]
                .into(),
            ),
        ),
    ];
    let Allowed::Clusters(Some(allowed)) = combine(&answers) else {
        panic!()
    };
    assert_eq!(allowed.keys().collect::<Vec<_>>(), ["b"]);
    assert_eq!(allowed["b"].weight, 3);
    assert_eq!(
        reason(allowed.get("b")),
        "placement policy: in the EU (Deployment shop/web); running (Placement shop/web)"
    );
    assert_eq!(
        combine(&[(subject("ConfigMap shop/conf"), Read::Unrestricted)]),
        Allowed::Clusters(None)
    );
}

#[test]
fn errors_of_any_subject_deny_and_name_it() {
    let answers = [
        (
            subject("Deployment shop/web"),
            Read::Errors(vec!["no cluster satisfies".into()]),
        ),
        (subject("Placement shop/web"), Read::Unrestricted),
    ];
    assert_eq!(
        combine(&answers),
        Allowed::Denied(vec!["Deployment shop/web: no cluster satisfies".into()])
    );
    let undefined = [
        (
            subject("Deployment shop/web"),
            Read::Errors(vec!["x".into()]),
        ),
        (subject("Placement shop/web"), Read::Undefined),
    ];
    assert_eq!(combine(&undefined), Allowed::Undefined);
}

#[test]
fn identical_reasons_are_said_once() {
    let combined = Combined {
        weight: 2,
        reasons: vec![
            ("Deployment shop/a".into(), "running".into()),
            ("Deployment shop/b".into(), "running".into()),
        ],
    };
    assert_eq!(
        reason(Some(&combined)),
        "placement policy: running (Deployment shop/a, Deployment shop/b)"
    );
    assert!(reason(None).contains("restricts none"));
}
