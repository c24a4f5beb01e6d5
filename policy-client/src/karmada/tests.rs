use super::*;
use crate::decision::Decision;

fn set(names: &[&str]) -> Bound {
    Bound::Clusters(names.iter().map(|n| (*n).to_owned()).collect())
}

const EU: [&str; 2] = ["member-eu-1", "member-eu-2"];

#[test]
fn names_are_intersected_with_the_allowed_set() {
    let placement = json!({
        "clusterAffinity": {"clusterNames": ["member-eu-2", "member-us-1"],
                            "labelSelector": {"matchLabels": {"tier": "gold"}}},
        "replicaScheduling": {"replicaSchedulingType": "Divided"},
        "spreadConstraints": [{"spreadByField": "region", "maxGroups": 2, "minGroups": 2}]
    });
    let narrowed = narrow(&placement, &set(&EU));
    assert_eq!(
        narrowed,
        json!({
            "clusterAffinity": {"clusterNames": ["member-eu-2"],
                                "labelSelector": {"matchLabels": {"tier": "gold"}}},
            "replicaScheduling": {"replicaSchedulingType": "Divided"},
            "spreadConstraints": [{"spreadByField": "region", "maxGroups": 2, "minGroups": 2}]
        }),
        "only the names change"
    );
}

#[test]
fn no_names_means_the_allowed_set_and_none_allowed_selects_nothing() {
    let narrowed = narrow(&json!({"replicaScheduling": {}}), &set(&EU));
    assert_eq!(
        narrowed["clusterAffinity"]["clusterNames"],
        json!(["member-eu-1", "member-eu-2"])
    );
    let with_exclude = narrow(
        &json!({"clusterAffinity": {"exclude": ["member-eu-1"]}}),
        &set(&EU),
    );
    assert_eq!(
        with_exclude["clusterAffinity"],
        json!({"exclude": ["member-eu-1"], "clusterNames": ["member-eu-1", "member-eu-2"]}),
        "the user's exclusions stay"
    );
    for placement in [
        json!({}),
        json!({"clusterAffinity": {"clusterNames": ["member-us-1"]}}),
    ] {
        assert_eq!(
            narrow(&placement, &set(&[]))["clusterAffinity"]["clusterNames"],
            json!([NO_CLUSTER]),
            "{placement}"
        );
    }
    assert_eq!(
        narrow(
            &json!({"clusterAffinity": {"clusterNames": ["member-us-1"]}}),
            &set(&EU)
        )["clusterAffinity"]["clusterNames"],
        json!([NO_CLUSTER]),
        "an empty intersection is no cluster, never any cluster"
    );
}

#[test]
fn every_affinity_term_and_overflow_is_narrowed() {
    let placement = json!({"clusterAffinities": [
        {"affinityName": "primary", "clusterNames": ["member-us-1"]},
        {"affinityName": "backup", "clusterNames": ["member-eu-1"],
         "overflowAffinities": [{"affinityName": "burst"}]}
    ]});
    let narrowed = narrow(&placement, &set(&EU));
    assert_eq!(
        narrowed,
        json!({"clusterAffinities": [
            {"affinityName": "primary", "clusterNames": [NO_CLUSTER]},
            {"affinityName": "backup", "clusterNames": ["member-eu-1"],
             "overflowAffinities": [{"affinityName": "burst",
                                     "clusterNames": ["member-eu-1", "member-eu-2"]}]}
        ]})
    );
    assert!(
        narrowed.get("clusterAffinity").is_none(),
        "no second kind of affinity"
    );
}

#[test]
fn narrowing_is_idempotent_and_twice_is_the_intersection() {
    let placements = [
        json!({}),
        json!({"clusterAffinity": {"clusterNames": ["member-eu-2", "member-us-1", "member-eu-1"]}}),
        json!({"clusterAffinities": [{"affinityName": "a", "clusterNames": ["member-us-1"]},
                                     {"affinityName": "b"}]}),
    ];
    for placement in &placements {
        let once = narrow(placement, &set(&EU));
        assert_eq!(narrow(&once, &set(&EU)), once, "{placement}");
        assert_eq!(
            narrow(&once, &set(&["member-eu-2"])),
            narrow(placement, &set(&["member-eu-2"])),
            "{placement}"
        );
    }
    assert_eq!(narrow(&placements[1], &Bound::Any), placements[1]);
}

#[test]
fn the_bound_comes_from_the_policys_preferences() {
    let decision = |prefs: Value| Decision {
        annotations: [(PREFERENCES_ANNOTATION.to_owned(), prefs.to_string())].into(),
        ..Decision::default()
    };
    assert_eq!(
        bound(&decision(
            json!({"clusters": {"member-eu-1": {"weight": 1}, "member-eu-2": {}}})
        ))
        .unwrap(),
        set(&EU)
    );
    assert_eq!(bound(&decision(json!({"clusters": {}}))).unwrap(), set(&[]));
    assert_eq!(
        bound(&decision(json!({"clusters": {"*": {"weight": 1}}}))).unwrap(),
        Bound::Any
    );
    assert_eq!(bound(&Decision::default()).unwrap(), Bound::Any);
    assert!(matches!(
        bound(&decision(json!({"weights": 1}))),
        Err(BoundError::Unreadable(_))
    ));
    assert_eq!(
        bound(&decision(json!({"clusters": {"Bad/Name": {}}}))),
        Err(BoundError::InvalidName("Bad/Name".to_owned()))
    );
}

#[test]
fn the_record_round_trips_and_a_stored_binding_keeps_its_bound() {
    for b in [set(&EU), set(&[]), Bound::Any] {
        assert_eq!(Bound::from_record(&b.record()), Some(b.clone()));
    }
    assert_eq!(set(&EU).record(), "member-eu-1,member-eu-2");
    assert_eq!(Bound::from_record("a,placement-policy.io/x"), None);
    let recorded = json!({"metadata": {"annotations": {ALLOWED_CLUSTERS_ANNOTATION: "member-eu-1"}},
                          "spec": {"clusters": [{"name": "member-us-1"}]}});
    assert_eq!(stored_bound(&recorded), set(&["member-eu-1"]));
    let unrecorded = json!({"spec": {"clusters": [{"name": "member-us-1", "replicas": 2}]}});
    assert_eq!(
        stored_bound(&unrecorded),
        set(&["member-us-1"]),
        "where it runs now"
    );
    assert_eq!(stored_bound(&json!({})), set(&[]));
}

#[test]
fn a_guarded_binding_carries_the_narrowed_placement_and_the_record() {
    let binding = json!({"metadata": {"name": "web-deployment"},
                         "spec": {"placement": {"clusterAffinity": {"clusterNames": ["member-us-1"]}},
                                  "clusters": [{"name": "member-us-1"}]}});
    let requested = json!({"clusterAffinity": {"clusterNames": ["member-eu-1", "member-us-1"]}});
    let guarded = guarded(&binding, &requested, &set(&EU));
    assert_eq!(
        guarded["spec"]["placement"],
        json!({"clusterAffinity": {"clusterNames": ["member-eu-1"]}})
    );
    assert_eq!(
        guarded["metadata"]["annotations"][ALLOWED_CLUSTERS_ANNOTATION],
        "member-eu-1,member-eu-2"
    );
    assert_eq!(guarded["spec"]["clusters"], binding["spec"]["clusters"]);
}

#[test]
fn the_policy_sees_the_bindings_spec_but_not_its_placement() {
    let raw = json!({"apiVersion": "work.karmada.io/v1alpha2", "kind": "ResourceBinding",
                     "metadata": {"name": "web", "namespace": "shop", "uid": "u", "generation": 3,
                                  "annotations": {ALLOWED_CLUSTERS_ANNOTATION: "a"}},
                     "spec": {"replicas": 6, "placement": {}, "clusters": [],
                              "gracefulEvictionTasks": []},
                     "status": {"aggregatedStatus": []}});
    assert_eq!(
        binding_view(&raw),
        json!({"apiVersion": "work.karmada.io/v1alpha2", "kind": "ResourceBinding",
               "metadata": {"name": "web", "namespace": "shop"},
               "spec": {"replicas": 6, "gracefulEvictionTasks": []}})
    );
}

#[test]
fn the_propagation_policy_is_found_by_the_detectors_annotations() {
    let pp = json!({"metadata": {"annotations": {
        "propagationpolicy.karmada.io/namespace": "shop",
        "propagationpolicy.karmada.io/name": "web"}}});
    assert_eq!(
        propagation_policy(&pp),
        Some((Some("shop".to_owned()), "web".to_owned()))
    );
    let cpp =
        json!({"metadata": {"annotations": {"clusterpropagationpolicy.karmada.io/name": "all"}}});
    assert_eq!(propagation_policy(&cpp), Some((None, "all".to_owned())));
    assert_eq!(propagation_policy(&json!({})), None);
}
