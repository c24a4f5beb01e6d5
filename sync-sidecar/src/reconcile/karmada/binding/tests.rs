use policy_client::engine::QueryOutcome;
use policy_client::karmada::PREFERENCES_ANNOTATION;
use policy_client::ownership_keys::OwnershipKeys;
use serde_json::json;

use std::collections::BTreeMap;

use serde_json::Value;

use super::model::*;
use super::*;
use crate::config::writers::KarmadaSettings;

fn keys() -> &'static OwnershipKeys {
    static KEYS: std::sync::OnceLock<OwnershipKeys> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| OwnershipKeys::ephemeral().unwrap())
}

fn binding(spec: Value, status: Value) -> (Value, Binding) {
    let mut spec = spec;
    let defaults = json!({
        "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop",
                     "name": "web", "uid": "a"},
        "schedulerName": "placement-policy",
        "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided",
                                            "replicaDivisionPreference": "Weighted"}},
    });
    for (k, v) in defaults.as_object().unwrap() {
        if spec.get(k).is_none() {
            spec[k] = v.clone();
        }
    }
    let raw = json!({
        "apiVersion": "work.karmada.io/v1alpha2",
        "kind": "ResourceBinding",
        "metadata": {"name": "web-deployment", "namespace": "shop", "generation": 2,
                     "resourceVersion": "10"},
        "spec": spec,
        "status": status,
    });
    let parsed = Binding::parse(raw.to_string().as_bytes()).unwrap();
    (raw, parsed)
}

fn decision(prefs: Value, errors: &[&str]) -> QueryOutcome {
    QueryOutcome::Defined(json!({
        "annotations": {PREFERENCES_ANNOTATION: prefs},
        "errors": errors,
    }))
}

fn template() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "web", "namespace": "shop", "uid": "a"}})
}

fn targets(pairs: &[(&str, i32)]) -> Vec<TargetCluster> {
    pairs
        .iter()
        .map(|(n, r)| TargetCluster {
            name: n.to_string(),
            replicas: *r,
        })
        .collect()
}

fn scheduled(pairs: &[(&str, i32)]) -> Placement {
    Placement::Clusters {
        clusters: targets(pairs),
        affinity: None,
    }
}

const EU: &str =
    r#"{"clusters":{"member-eu-1":{"weight":1},"member-eu-2":{"weight":1}},"rebalance":true}"#;

#[test]
fn the_policys_weights_divide_the_replicas() {
    let (_, b) = binding(json!({"replicas": 6}), json!({}));
    let placed = placement(&b, &template(), &decision(json!(EU), &[]), keys(), None);
    assert_eq!(
        placed,
        Some(scheduled(&[("member-eu-1", 3), ("member-eu-2", 3)]))
    );
}

#[test]
fn duplicated_and_non_workloads_follow_karmada() {
    let (_, dup) = binding(
        json!({"replicas": 4, "placement": {"replicaScheduling": {"replicaSchedulingType": "Duplicated"}}}),
        json!({}),
    );
    assert_eq!(
        placement(&dup, &template(), &decision(json!(EU), &[]), keys(), None),
        Some(scheduled(&[("member-eu-1", 4), ("member-eu-2", 4)]))
    );
    let (_, config) = binding(json!({"placement": {}}), json!({}));
    assert_eq!(
        placement(
            &config,
            &template(),
            &decision(json!(EU), &[]),
            keys(),
            None
        ),
        Some(scheduled(&[("member-eu-1", 0), ("member-eu-2", 0)]))
    );
}

#[test]
fn errors_fail_the_schedule_and_keep_the_clusters() {
    let (_, b) = binding(
        json!({"replicas": 6, "clusters": [{"name": "member-eu-1", "replicas": 6}]}),
        json!({}),
    );
    let failed = placement(
        &b,
        &template(),
        &decision(
            json!(EU),
            &["no cluster satisfies the placement requirements"],
        ),
        keys(),
        None,
    )
    .unwrap();
    assert_eq!(
        failed,
        Placement::Failed {
            reason: Reason::NoClusterFit,
            message: "no cluster satisfies the placement requirements".into()
        }
    );
    let write = plan(&b, &failed, "2026-11-25T10:00:00Z");
    assert_eq!(write.spec, None, "the clusters stay");
    let status = write.status.unwrap();
    let condition = &status["status"]["conditions"][0];
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "NoClusterFit");
    assert!(
        status["status"]
            .get("schedulerObservedGeneration")
            .is_none()
    );
    assert_eq!(write.event.unwrap().1, "ScheduleBindingFailed");
}

#[test]
fn undefined_writes_nothing_and_bad_shapes_are_scheduler_errors() {
    let (_, b) = binding(json!({"replicas": 1}), json!({}));
    assert_eq!(
        placement(&b, &template(), &QueryOutcome::Undefined, keys(), None),
        None
    );
    let bad = placement(
        &b,
        &template(),
        &decision(json!("not json"), &[]),
        keys(),
        None,
    );
    assert!(matches!(
        bad,
        Some(Placement::Failed {
            reason: Reason::SchedulerError,
            ..
        })
    ));
    let none = QueryOutcome::Defined(json!({"annotations": {}, "errors": []}));
    assert!(matches!(
        placement(&b, &template(), &none, keys(), None),
        Some(Placement::Failed {
            reason: Reason::NoClusterFit,
            ..
        })
    ));
    let star = decision(json!({"clusters": {"*": {"weight": 1}}}), &[]);
    assert!(matches!(
        placement(&b, &template(), &star, keys(), None),
        Some(Placement::Failed {
            reason: Reason::SchedulerError,
            ..
        })
    ));
    let known: BTreeMap<String, Value> = [("member-eu-1".to_owned(), json!({}))].into();
    let Some(Placement::Failed { message, .. }) = placement(
        &b,
        &template(),
        &decision(json!(EU), &[]),
        keys(),
        Some(&known),
    ) else {
        panic!("an unknown cluster fails")
    };
    assert!(message.contains("member-eu-2"), "{message}");
}

#[test]
fn clusters_being_evicted_from_are_left_out() {
    let (_, b) = binding(
        json!({"replicas": 6, "gracefulEvictionTasks": [{"fromCluster": "member-eu-2",
               "reason": "TaintUntolerated", "producer": "TaintManager"}]}),
        json!({}),
    );
    assert_eq!(
        placement(&b, &template(), &decision(json!(EU), &[]), keys(), None),
        Some(scheduled(&[("member-eu-1", 6)]))
    );
}

/// A failed member's bindings are told apart before they are evaluated:
/// those on it, and those Karmada's taint manager is evicting from it.
#[test]
fn a_binding_on_or_evicted_from_a_member_touches_it() {
    let failed = std::collections::BTreeSet::from(["member-us-1".to_owned()]);
    let on = |spec: Value| binding(spec, json!({})).1.touches(&failed);
    assert!(on(
        json!({"clusters": [{"name": "member-us-1", "replicas": 2}]})
    ));
    assert!(on(
        json!({"clusters": [{"name": "member-eu-1", "replicas": 2}],
                      "gracefulEvictionTasks": [{"fromCluster": "member-us-1"}]})
    ));
    assert!(!on(
        json!({"clusters": [{"name": "member-eu-1", "replicas": 2}]})
    ));
    assert!(!on(json!({})));
}

#[test]
fn a_new_placement_writes_spec_status_and_an_event() {
    let (raw, b) = binding(json!({"replicas": 6}), json!({}));
    let placed = scheduled(&[("member-eu-1", 3), ("member-eu-2", 3)]);
    let write = plan(&b, &placed, "2026-11-25T10:00:00Z");
    assert!(write.moves);
    let spec = write.spec.unwrap();
    assert_eq!(
        spec["spec"]["clusters"],
        json!([{"name": "member-eu-1", "replicas": 3}, {"name": "member-eu-2", "replicas": 3}])
    );
    let applied: Value = serde_json::from_str(
        spec["metadata"]["annotations"][APPLIED_PLACEMENT_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(applied, raw["spec"]["placement"]);
    let status = write.status.unwrap();
    assert_eq!(status["status"]["schedulerObservedGeneration"], 2);
    assert_eq!(
        status["status"]["lastScheduledTime"],
        "2026-11-25T10:00:00Z"
    );
    assert_eq!(status["status"]["conditions"][0]["reason"], "Success");
    let (normal, reason, note) = write.event.unwrap();
    assert!(normal);
    assert_eq!(reason, "ScheduleBindingSucceed");
    assert!(
        note.ends_with("Result: {member-eu-1:3, member-eu-2:3}"),
        "{note}"
    );
}

#[test]
fn nothing_is_written_when_nothing_changes() {
    let placement_json = json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
                                "replicaDivisionPreference": "Weighted"}});
    let (_, b) = binding(
        json!({"replicas": 6, "clusters": [{"name": "member-eu-2", "replicas": 3},
                                           {"name": "member-eu-1", "replicas": 3}]}),
        json!({"schedulerObservedGeneration": 2, "lastScheduledTime": "2026-11-25T09:00:00Z",
               "conditions": [{"type": "Scheduled", "status": "True", "reason": "Success",
                               "message": SUCCESS_MESSAGE,
                               "lastTransitionTime": "2026-11-25T09:00:00Z"}]}),
    );
    let mut b = b;
    b.metadata.annotations.insert(
        APPLIED_PLACEMENT_ANNOTATION.to_owned(),
        placement_json.to_string(),
    );
    let placed = scheduled(&[("member-eu-1", 3), ("member-eu-2", 3)]);
    let write = plan(&b, &placed, "2026-11-25T10:00:00Z");
    assert!(write.is_empty(), "{write:?}");
    // Another placement (a new PropagationPolicy) with the same clusters:
    // the annotation is written, no replica moves.
    let mut handed = b.clone();
    handed.spec.placement = Some(json!({"clusterAffinity": {"clusterNames": ["member-eu-1"]}}));
    let write = plan(&handed, &placed, "2026-11-25T10:00:00Z");
    assert!(write.spec.is_some() && !write.moves, "{write:?}");
    // A scale (the generation moves) is scheduled again.
    b.metadata.generation = 3;
    let write = plan(&b, &placed, "2026-11-25T10:00:00Z");
    assert!(write.spec.is_none());
    let status = write.status.unwrap();
    assert_eq!(status["status"]["schedulerObservedGeneration"], 3);
    // The condition keeps its transition time while it stays True.
    assert_eq!(
        status["status"]["conditions"][0]["lastTransitionTime"],
        "2026-11-25T09:00:00Z"
    );
    // So is an explicit reschedule.
    b.metadata.generation = 2;
    b.spec.reschedule_triggered_at = Some("2026-11-25T09:30:00Z".into());
    assert!(plan(&b, &placed, "2026-11-25T10:00:00Z").status.is_some());
}

/// The Karmada Clusters of the test bed, as replicated.
fn members() -> BTreeMap<String, Value> {
    [
        ("member-eu-1", "europe-west1", json!([])),
        ("member-eu-2", "europe-west2", json!([])),
        (
            "member-us-1",
            "us-central1",
            json!([{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]),
        ),
    ]
    .into_iter()
    .map(|(name, region, taints)| {
        (
            name.to_owned(),
            json!({"metadata": {"name": name, "labels": {"region": region}},
                   "spec": {"region": region, "taints": taints}}),
        )
    })
    .collect()
}

/// Scheduled under the shipped policy's answer for an EU workload (both
/// EU members, even weights) with the user's `placement`.
fn schedule_eu(replicas: i32, placement: Value, status: Value) -> Placement {
    let (_, b) = binding(
        json!({"replicas": replicas, "placement": placement}),
        status,
    );
    placement_of(&b, &decision(json!(EU), &[]))
}

fn placement_of(b: &Binding, outcome: &QueryOutcome) -> Placement {
    placement(b, &template(), outcome, keys(), Some(&members())).unwrap()
}

const DIVIDED: &str = "Divided";

fn divided(extra: Value) -> Value {
    let mut p = json!({"replicaScheduling": {"replicaSchedulingType": DIVIDED,
                                             "replicaDivisionPreference": "Weighted"}});
    for (k, v) in extra.as_object().unwrap() {
        p[k] = v.clone();
    }
    p
}

#[test]
fn the_users_cluster_names_select_within_what_the_policy_allows() {
    assert_eq!(
        schedule_eu(
            4,
            divided(json!({"clusterAffinity": {"clusterNames": ["member-eu-2"]}})),
            json!({})
        ),
        scheduled(&[("member-eu-2", 4)])
    );
    assert_eq!(
        schedule_eu(
            3,
            divided(json!({"clusterAffinity": {"clusterNames": ["member-eu-2", "member-us-1"]}})),
            json!({})
        ),
        scheduled(&[("member-eu-2", 3)]),
        "a cluster the policy forbids is never chosen"
    );
    let Placement::Failed { reason, message } = schedule_eu(
        3,
        divided(json!({"clusterAffinity": {"clusterNames": ["member-us-1"]}})),
        json!({}),
    ) else {
        panic!("nothing allowed fits")
    };
    assert_eq!(reason, Reason::NoClusterFit);
    assert!(message.contains("member-eu-1, member-eu-2"), "{message}");
    assert_eq!(
        schedule_eu(
            2,
            divided(json!({"clusterAffinity": {"exclude": ["member-eu-1"],
                "fieldSelector": {"matchExpressions": [{"key": "region", "operator": "In",
                    "values": ["europe-west1", "europe-west2"]}]}}})),
            json!({})
        ),
        scheduled(&[("member-eu-2", 2)])
    );
}

#[test]
fn static_weights_replace_the_policys_even_weights_unless_the_policy_weighs() {
    let weighted = divided(json!({"replicaScheduling": {
        "replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
        "weightPreference": {"staticWeightList": [
            {"targetCluster": {"clusterNames": ["member-eu-1"]}, "weight": 2},
            {"targetCluster": {"clusterNames": ["member-eu-2"]}, "weight": 1}]}}}));
    assert_eq!(
        schedule_eu(6, weighted.clone(), json!({})),
        scheduled(&[("member-eu-1", 4), ("member-eu-2", 2)])
    );
    let (_, b) = binding(json!({"replicas": 6, "placement": weighted}), json!({}));
    let policy_weighs = QueryOutcome::Defined(json!({
        "annotations": {PREFERENCES_ANNOTATION:
            r#"{"clusters":{"member-eu-1":{"weight":1000},"member-eu-2":{"weight":5000}}}"#},
        "errors": [],
        "policy_weights": true,
    }));
    assert_eq!(
        placement_of(&b, &policy_weighs),
        scheduled(&[("member-eu-1", 1), ("member-eu-2", 5)]),
        "a policy that weighs on purpose wins"
    );
}

#[test]
fn the_first_affinity_term_with_an_allowed_cluster_is_chosen_and_observed() {
    let terms = divided(json!({"clusterAffinities": [
        {"affinityName": "primary", "clusterNames": ["member-us-1"]},
        {"affinityName": "backup", "clusterNames": ["member-eu-1"]}]}));
    let placed = schedule_eu(2, terms.clone(), json!({}));
    assert_eq!(
        placed,
        Placement::Clusters {
            clusters: targets(&[("member-eu-1", 2)]),
            affinity: Some("backup".to_owned())
        }
    );
    let (_, b) = binding(
        json!({"replicas": 2, "placement": terms.clone()}),
        json!({}),
    );
    let write = plan(&b, &placed, "2026-11-25T10:00:00Z");
    assert_eq!(
        write.status.unwrap()["status"]["schedulerObservingAffinityName"],
        "backup"
    );
    // karmada-scheduler goes on from the observed term.
    let both = divided(json!({"clusterAffinities": [
        {"affinityName": "primary", "clusterNames": ["member-eu-2"]},
        {"affinityName": "backup", "clusterNames": ["member-eu-1"]}]}));
    assert_eq!(
        schedule_eu(
            2,
            both.clone(),
            json!({"schedulerObservingAffinityName": "backup"})
        ),
        Placement::Clusters {
            clusters: targets(&[("member-eu-1", 2)]),
            affinity: Some("backup".to_owned())
        }
    );
    assert_eq!(
        schedule_eu(2, both, json!({})),
        Placement::Clusters {
            clusters: targets(&[("member-eu-2", 2)]),
            affinity: Some("primary".to_owned())
        }
    );
    let none = divided(json!({"clusterAffinities": [
        {"affinityName": "primary", "clusterNames": ["member-us-1"]}]}));
    assert!(matches!(
        schedule_eu(2, none, json!({})),
        Placement::Failed {
            reason: Reason::NoClusterFit,
            ..
        }
    ));
}

#[test]
fn untolerated_taints_keep_new_replicas_off_a_cluster() {
    // A policy that allows every member, the tainted one too.
    let all = QueryOutcome::Defined(json!({
        "annotations": {PREFERENCES_ANNOTATION: r#"{"clusters":{"member-eu-1":{"weight":1},"member-us-1":{"weight":1}}}"#},
        "errors": [],
    }));
    let (_, b) = binding(
        json!({"replicas": 2, "placement": divided(json!({}))}),
        json!({}),
    );
    assert_eq!(placement_of(&b, &all), scheduled(&[("member-eu-1", 2)]));
    let tolerated = divided(json!({"clusterTolerations": [{"key": "gpu", "operator": "Exists"}]}));
    let (_, b) = binding(json!({"replicas": 2, "placement": tolerated}), json!({}));
    assert_eq!(
        placement_of(&b, &all),
        scheduled(&[("member-eu-1", 1), ("member-us-1", 1)])
    );
    let (_, on_it) = binding(
        json!({"replicas": 2, "placement": divided(json!({})),
               "clusters": [{"name": "member-us-1", "replicas": 2}]}),
        json!({}),
    );
    assert_eq!(
        placement_of(&on_it, &all),
        scheduled(&[("member-eu-1", 1), ("member-us-1", 1)]),
        "a cluster the binding is on stays a candidate"
    );
}

#[test]
fn what_the_scheduler_does_not_implement_is_named_never_dropped() {
    for (extra, field) in [
        (
            json!({"spreadConstraints": [{"spreadByField": "region", "maxGroups": 2}]}),
            "spreadConstraints",
        ),
        (
            json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
                "replicaDivisionPreference": "Weighted",
                "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}),
            "dynamicWeight",
        ),
        (
            json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
                "replicaDivisionPreference": "Aggregated"}}),
            "Aggregated",
        ),
        (
            json!({"clusterAffinities": [{"affinityName": "a",
                "overflowAffinities": [{"affinityName": "b"}]}]}),
            "overflowAffinities",
        ),
    ] {
        let Placement::Failed { reason, message } =
            schedule_eu(2, divided(extra.clone()), json!({}))
        else {
            panic!("{extra} was scheduled")
        };
        assert_eq!(reason, Reason::SchedulerError);
        assert!(message.contains(field), "{message}");
        assert!(message.contains("guardrail"), "{message}");
    }
}

#[test]
fn only_the_bindings_settings_ask_for_are_acted_on() {
    let settings = |schedule, guard| KarmadaSettings {
        scheduler_name: "placement-policy".to_owned(),
        schedule,
        guard,
        reschedule_grace: std::time::Duration::from_secs(15),
    };
    let (_, ours) = binding(json!({}), json!({}));
    let (_, theirs) = binding(json!({"schedulerName": "default-scheduler"}), json!({}));
    assert_eq!(ours.mode(&settings(true, false)), Some(Mode::Schedule));
    assert_eq!(ours.mode(&settings(false, true)), None);
    assert_eq!(theirs.mode(&settings(true, false)), None);
    assert_eq!(theirs.mode(&settings(false, true)), Some(Mode::Guard));
    let (_, suspended) = binding(json!({"suspension": {"scheduling": true}}), json!({}));
    assert_eq!(suspended.mode(&settings(true, true)), None);
}
