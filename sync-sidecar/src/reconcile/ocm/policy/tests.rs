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

/// A workload of ManifestWorkReplicaSet `shop/web`, or the Placement.
fn subject(name: &str) -> Subject {
    if name.starts_with("Placement ") {
        Subject::placement(name.to_owned())
    } else {
        carried(name, "web")
    }
}

/// A workload of ManifestWorkReplicaSet `shop/<set>`.
fn carried(name: &str, set: &str) -> Subject {
    Subject::workload(
        name.to_owned(),
        format!("ManifestWorkReplicaSet shop/{set}"),
    )
}

fn clusters(names: &[&str], reason: &str) -> Read {
    Read::Clusters(
        names
            .iter()
            .map(|n| {
                (
                    (*n).to_owned(),
                    Allowance {
                        weight: 1,
                        reason: Some(reason.into()),
                    },
                )
            })
            .collect(),
    )
}

fn decided(allowed: &Allowed) -> (Vec<&str>, &[String]) {
    let Allowed::Clusters {
        allowed: Some(clusters),
        left_out,
    } = allowed
    else {
        panic!("{allowed:?}")
    };
    (clusters.keys().map(String::as_str).collect(), left_out)
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
    let Allowed::Clusters {
        allowed: Some(allowed),
        left_out,
    } = combine(&answers)
    else {
        panic!()
    };
    assert!(left_out.is_empty());
    assert_eq!(allowed.keys().collect::<Vec<_>>(), ["b"]);
    assert_eq!(allowed["b"].weight, 3);
    assert_eq!(
        reason(allowed.get("b")),
        "placement policy: in the EU (Deployment shop/web); running (Placement shop/web)"
    );
    assert_eq!(
        combine(&[(subject("ConfigMap shop/conf"), Read::Unrestricted)]),
        Allowed::clusters(None)
    );
}

#[test]
fn errors_of_the_placement_or_of_every_workload_deny_and_name_them() {
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
    // Every ManifestWorkReplicaSet has an error (one in each): nothing to
    // decide from, although a Namespace of one restricts nothing.
    let every = [
        (carried("Namespace shop", "a"), Read::Unrestricted),
        (
            carried("Deployment shop/a", "a"),
            Read::Errors(vec!["bad a".into()]),
        ),
        (
            carried("Deployment shop/b", "b"),
            Read::Errors(vec!["bad b".into()]),
        ),
        (subject("Placement shop/web"), clusters(&["x"], "running")),
    ];
    assert_eq!(
        combine(&every),
        Allowed::Denied(vec![
            "Deployment shop/a: bad a".into(),
            "Deployment shop/b: bad b".into()
        ])
    );
    // The Placement's own errors keep its decisions whatever its workloads.
    let own = [
        (
            carried("Deployment shop/a", "a"),
            clusters(&["x"], "in the EU"),
        ),
        (
            subject("Placement shop/web"),
            Read::Errors(vec!["bad placement".into()]),
        ),
    ];
    assert_eq!(
        combine(&own),
        Allowed::Denied(vec!["Placement shop/web: bad placement".into()])
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

/// A shared Placement: the ManifestWorkReplicaSet with an error is left out
/// whole (its Namespace too), the others decide, and the error is named
/// with its carrier.
#[test]
fn a_workload_with_errors_is_left_out_and_the_others_decide() {
    let answers = [
        (carried("Namespace shop", "vault"), Read::Unrestricted),
        (
            carried("Deployment shop/vault", "vault"),
            Read::Errors(vec!["no cluster satisfies".into()]),
        ),
        (
            carried("Deployment shop/web", "web"),
            clusters(&["eu-1", "eu-2"], "in the EU"),
        ),
        (
            subject("Placement shop/shared"),
            clusters(&["eu-1", "eu-2", "us-1"], "running"),
        ),
    ];
    let combined = combine(&answers);
    let (names, left_out) = decided(&combined);
    assert_eq!(names, ["eu-1", "eu-2"]);
    assert_eq!(
        left_out,
        ["ManifestWorkReplicaSet shop/vault: Deployment shop/vault: no cluster satisfies"]
    );
}

/// A workload carrying a requirement whose answer names no clusters (a kind
/// the policy does not place) is an error, never unrestricted; one without
/// requirements restricts nothing.
#[test]
fn a_requirement_the_policy_names_no_clusters_for_is_an_error() {
    let none = QueryOutcome::Defined(json!({"annotations": {}, "errors": []}));
    let mut job = json!({"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": "etl", "namespace": "shop"}});
    assert_eq!(read(&job, &none, keys()), Read::Unrestricted);
    job["metadata"]["annotations"] = json!({
        "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true"});
    let Read::Errors(errors) = read(&job, &none, keys()) else {
        panic!()
    };
    assert!(
        errors[0].contains("eu-jurisdiction-required")
            && errors[0].contains("names no clusters for a Job"),
        "{errors:?}"
    );
    let star = answer(&[("*", 1)], &[], &[]);
    assert!(matches!(read(&job, &star, keys()), Read::Errors(_)));
    // "false" requires nothing.
    job["metadata"]["annotations"] = json!({
        "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "false"});
    assert_eq!(read(&job, &none, keys()), Read::Unrestricted);
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
