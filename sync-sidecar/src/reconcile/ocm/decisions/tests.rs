use serde_json::{Value, json};

use std::collections::{BTreeMap, BTreeSet};

use super::grouping::{groups, objects};
use super::model::*;
use super::*;
use crate::reconcile::ocm::clusters::tests::inventory;
use crate::reconcile::ocm::clusters::{ManagedCluster, candidates};
use crate::reconcile::ocm::placement::Placement;
use crate::reconcile::ocm::placement::tests::placement;
use crate::reconcile::ocm::policy::Allowed;
use crate::reconcile::ocm::policy::{Allowance, Read, Subject, combine};

const NOW: &str = "2026-11-26T10:00:00Z";

fn allowed(names: &[&str]) -> Allowed {
    let clusters = names
        .iter()
        .map(|n| {
            (
                (*n).to_owned(),
                Allowance {
                    weight: 1,
                    reason: Some("in the EU (eu-jurisdiction-required)".into()),
                },
            )
        })
        .collect();
    combine(&[(
        Subject::workload(
            "Deployment shop/web".into(),
            "ManifestWorkReplicaSet shop/web".into(),
        ),
        Read::Clusters(clusters),
    )])
}

fn outcome(spec: Value, allowed: &Allowed, current: &[&str]) -> (Placement, Outcome) {
    let (_, p) = placement(spec);
    let current: BTreeSet<String> = current.iter().map(|c| (*c).to_owned()).collect();
    let found = candidates(&p, &inventory(), &current, NOW.parse().unwrap()).map(|(c, _)| c);
    let outcome = choose(&p, found, allowed, &current);
    (p, outcome)
}

fn names(outcome: &Outcome) -> Vec<&str> {
    match outcome {
        Outcome::Decided { chosen, .. } => chosen.iter().map(|d| d.cluster_name.as_str()).collect(),
        other => panic!("{other:?}"),
    }
}

fn by_name() -> BTreeMap<String, ManagedCluster> {
    (*inventory().clusters).clone()
}

fn stored(name: &str, group: &str, index: &str, clusters: &[&str]) -> Existing {
    Existing {
        name: name.to_owned(),
        labels: [
            (PLACEMENT_LABEL.to_owned(), "web".to_owned()),
            (GROUP_NAME_LABEL.to_owned(), group.to_owned()),
            (GROUP_INDEX_LABEL.to_owned(), index.to_owned()),
        ]
        .into(),
        decisions: clusters
            .iter()
            .map(|c| ClusterDecision {
                cluster_name: (*c).to_owned(),
                reason:
                    "placement policy: in the EU (eu-jurisdiction-required) (Deployment shop/web)"
                        .into(),
            })
            .collect(),
    }
}

#[test]
fn the_policy_narrows_the_candidates_and_reasons_are_its_words() {
    let (_, o) = outcome(json!({}), &allowed(&["ocm-eu-1", "ocm-eu-2"]), &[]);
    assert_eq!(names(&o), ["ocm-eu-1", "ocm-eu-2"]);
    let Outcome::Decided { chosen, .. } = &o else {
        panic!()
    };
    assert_eq!(
        chosen[0].reason,
        "placement policy: in the EU (eu-jurisdiction-required) (Deployment shop/web)"
    );
    let (_, o) = outcome(json!({}), &Allowed::clusters(None), &[]);
    assert_eq!(names(&o), ["ocm-eu-1", "ocm-eu-2", "ocm-us-1"]);
}

#[test]
fn number_of_clusters_keeps_what_it_has_then_the_weight_then_the_name() {
    let eu = allowed(&["ocm-eu-1", "ocm-eu-2"]);
    let (_, o) = outcome(json!({"numberOfClusters": 1}), &eu, &[]);
    assert_eq!(names(&o), ["ocm-eu-1"]);
    let (_, o) = outcome(json!({"numberOfClusters": 1}), &eu, &["ocm-eu-2"]);
    assert_eq!(names(&o), ["ocm-eu-2"], "steady");
    let (_, o) = outcome(json!({"numberOfClusters": 3}), &eu, &[]);
    let Outcome::Decided { unscheduled, .. } = o else {
        panic!()
    };
    assert_eq!(unscheduled, 1);
    let mut heavy = allowed(&["ocm-eu-1", "ocm-eu-2"]);
    if let Allowed::Clusters {
        allowed: Some(c), ..
    } = &mut heavy
    {
        c.get_mut("ocm-eu-2").unwrap().weight = 5;
    }
    let (_, o) = outcome(json!({"numberOfClusters": 1}), &heavy, &[]);
    assert_eq!(names(&o), ["ocm-eu-2"], "by weight");
}

#[test]
fn a_new_placement_gets_its_decision_objects_and_status() {
    let (p, o) = outcome(json!({}), &allowed(&["ocm-eu-1", "ocm-eu-2"]), &[]);
    let write = plan(&p, &o, &[], &by_name(), NOW);
    assert_eq!(write.create.len(), 1);
    let object = &write.create[0];
    assert_eq!(object["metadata"]["name"], "web-decision-1");
    assert_eq!(object["metadata"]["labels"][PLACEMENT_LABEL], "web");
    assert_eq!(object["metadata"]["labels"][GROUP_INDEX_LABEL], "0");
    assert_eq!(object["metadata"]["labels"][GROUP_NAME_LABEL], "");
    assert_eq!(
        object["metadata"]["ownerReferences"][0]["kind"],
        "Placement"
    );
    assert_eq!(object["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(write.status[0].0, "web-decision-1");
    assert_eq!(
        write.status[0].1["status"]["decisions"][1]["clusterName"],
        "ocm-eu-2"
    );
    let status = &write.placement_status.as_ref().unwrap()["status"];
    assert_eq!(status["numberOfSelectedClusters"], 2);
    assert_eq!(
        status["decisionGroups"],
        json!([{"decisionGroupIndex": 0, "decisionGroupName": "", "decisions": ["web-decision-1"], "clusterCount": 2}])
    );
    assert_eq!(status["conditions"][0]["type"], SATISFIED);
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(status["conditions"][0]["lastTransitionTime"], NOW);
    assert_eq!(status["conditions"][1]["type"], MISCONFIGURED);
    assert_eq!(status["conditions"][1]["status"], "False");
    assert!(write.removes.is_empty() && !write.interim);
    assert_eq!(write.events[0].1, "DecisionUpdate");
}

#[test]
fn nothing_is_written_when_nothing_changes() {
    let (p, o) = outcome(json!({}), &allowed(&["ocm-eu-1", "ocm-eu-2"]), &[]);
    let existing = [stored("web-decision-1", "", "0", &["ocm-eu-1", "ocm-eu-2"])];
    let first = plan(&p, &o, &existing, &by_name(), NOW);
    assert!(!first.changes_decisions(), "{first:?}");
    // The Placement as it is once its status is written.
    let (mut raw, _) = placement(json!({}));
    raw["status"] = first.placement_status.unwrap()["status"].clone();
    let placed = Placement::parse(raw.to_string().as_bytes()).unwrap();
    let again = plan(&placed, &o, &existing, &by_name(), "2026-11-26T11:00:00Z");
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn a_cluster_is_added_before_one_is_removed() {
    // numberOfClusters 1 on ocm-eu-1, which the policy no longer allows.
    let (p, o) = outcome(
        json!({"numberOfClusters": 1}),
        &allowed(&["ocm-eu-2"]),
        &["ocm-eu-1"],
    );
    let existing = [stored("web-decision-1", "", "0", &["ocm-eu-1"])];
    let first = plan(&p, &o, &existing, &by_name(), NOW);
    assert!(first.interim && !first.removes.is_empty());
    let written: Vec<&str> = first.status[0].1["status"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["clusterName"].as_str().unwrap())
        .collect();
    assert_eq!(written, ["ocm-eu-1", "ocm-eu-2"], "both first");
    assert!(
        first.placement_status.is_none(),
        "the status waits for the removal"
    );
    // Once both are stored, the removal.
    let both = [stored("web-decision-1", "", "0", &["ocm-eu-1", "ocm-eu-2"])];
    let (p, o) = outcome(
        json!({"numberOfClusters": 1}),
        &allowed(&["ocm-eu-2"]),
        &["ocm-eu-1", "ocm-eu-2"],
    );
    let second = plan(&p, &o, &both, &by_name(), NOW);
    assert!(!second.interim && !second.removes.is_empty());
    assert_eq!(
        second.status[0].1["status"]["decisions"],
        json!([{"clusterName": "ocm-eu-2", "reason": "placement policy: in the EU (eu-jurisdiction-required) (Deployment shop/web)"}])
    );
    assert_eq!(
        second.placement_status.unwrap()["status"]["numberOfSelectedClusters"],
        1
    );
}

#[test]
fn errors_and_misconfiguration_keep_the_decisions_and_say_why() {
    let denied = Allowed::Denied(vec![
        "Deployment shop/web: no cluster satisfies the placement requirements".into(),
    ]);
    let (p, o) = outcome(json!({}), &denied, &["ocm-eu-1"]);
    let existing = [stored("web-decision-1", "", "0", &["ocm-eu-1"])];
    let write = plan(&p, &o, &existing, &by_name(), NOW);
    assert!(!write.changes_decisions());
    let status = &write.placement_status.unwrap()["status"];
    assert_eq!(status["conditions"][0]["reason"], "PolicyDenied");
    assert!(
        status["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("keeps its 1 decisions until the policy gives a valid one: Deployment shop/web: no cluster"),
        "{status}"
    );
    assert!(status.get("numberOfSelectedClusters").is_none());
    assert_eq!(write.events[0].1, "PolicyDenied");

    let (p, o) = outcome(
        json!({"predicates": [{"requiredClusterSelector": {"celSelector": {"celExpressions": ["true"]}}}]}),
        &allowed(&["ocm-eu-1"]),
        &["ocm-eu-1"],
    );
    let write = plan(&p, &o, &existing, &by_name(), NOW);
    assert!(!write.changes_decisions());
    let status = &write.placement_status.unwrap()["status"];
    assert_eq!(status["conditions"][1]["type"], MISCONFIGURED);
    assert_eq!(status["conditions"][1]["status"], "True");
    assert_eq!(write.events[0].1, "Misconfigured");
}

/// A shared Placement with a workload left out for its errors: decided from
/// the others (its decisions change), and `PlacementSatisfied=False`,
/// `PolicyDenied`, with a Warning Event, names what was left out and why.
#[test]
fn workloads_left_out_are_named_while_the_others_decide() {
    let Allowed::Clusters { allowed, .. } = allowed(&["ocm-eu-1", "ocm-eu-2"]) else {
        panic!()
    };
    let partly = Allowed::Clusters {
        allowed,
        left_out: vec![
            "ManifestWorkReplicaSet shop/vault: Deployment shop/vault: no cluster satisfies the placement requirements".into(),
        ],
    };
    let (p, o) = outcome(json!({}), &partly, &["ocm-eu-1", "ocm-eu-2", "ocm-us-1"]);
    assert_eq!(names(&o), ["ocm-eu-1", "ocm-eu-2"]);
    let existing = [stored(
        "web-decision-1",
        "",
        "0",
        &["ocm-eu-1", "ocm-eu-2", "ocm-us-1"],
    )];
    let write = plan(&p, &o, &existing, &by_name(), NOW);
    assert!(write.changes_decisions());
    assert_eq!(write.removes, BTreeSet::from(["ocm-us-1".to_owned()]));
    let status = &write.placement_status.unwrap()["status"];
    let satisfied = &status["conditions"][0];
    assert_eq!(satisfied["type"], SATISFIED);
    assert_eq!(satisfied["status"], "False");
    assert_eq!(satisfied["reason"], "PolicyDenied");
    let message = satisfied["message"].as_str().unwrap();
    assert!(
        message.contains("left out")
            && message
                .contains("ManifestWorkReplicaSet shop/vault: Deployment shop/vault: no cluster"),
        "{message}"
    );
    assert_eq!(status["numberOfSelectedClusters"], 2);
    let reasons: Vec<&str> = write.events.iter().map(|e| e.1).collect();
    assert_eq!(reasons, ["PolicyDenied", "DecisionUpdate"]);
}

#[test]
fn nothing_selected_empties_the_decisions_as_upstream_does() {
    let (_, p) = placement(json!({"clusterSets": ["elsewhere"]}));
    let found =
        candidates(&p, &inventory(), &BTreeSet::new(), NOW.parse().unwrap()).map(|(c, _)| c);
    let o = choose(&p, found, &allowed(&["ocm-eu-1"]), &BTreeSet::new());
    let existing = [stored("web-decision-1", "", "0", &["ocm-eu-1"])];
    let write = plan(&p, &o, &existing, &by_name(), NOW);
    assert_eq!(write.status[0].1["status"]["decisions"], json!([]));
    let status = &write.placement_status.unwrap()["status"];
    assert_eq!(status["conditions"][0]["reason"], "NoIntersection");
    assert_eq!(status["numberOfSelectedClusters"], 0);
}

#[test]
fn ranking_fields_are_named_in_the_misconfigured_condition() {
    let (p, o) = outcome(
        json!({"spreadPolicy": {"spreadConstraints": [{"topologyKey": "region", "topologyKeyType": "Label"}]}}),
        &allowed(&["ocm-eu-1"]),
        &[],
    );
    let write = plan(&p, &o, &[], &by_name(), NOW);
    let status = &write.placement_status.unwrap()["status"];
    assert_eq!(status["conditions"][1]["status"], "True");
    assert_eq!(status["conditions"][1]["reason"], "NotHonoured");
    assert!(
        status["conditions"][1]["message"]
            .as_str()
            .unwrap()
            .contains("spec.spreadPolicy.spreadConstraints")
    );
    assert_eq!(write.create.len(), 1, "decided all the same");
}

#[test]
fn decision_groups_follow_ocm() {
    let spec = json!({"decisionStrategy": {"groupStrategy": {
        "clustersPerDecisionGroup": 1,
        "decisionGroups": [{"groupName": "canary", "groupClusterSelector": {"labelSelector": {
            "matchLabels": {"placement-policy.io/jurisdiction": "non-eu"}}}}],
    }}});
    let (p, o) = outcome(spec, &Allowed::clusters(None), &[]);
    let write = plan(&p, &o, &[], &by_name(), NOW);
    let labels: Vec<(String, String, String)> = write
        .create
        .iter()
        .map(|c| {
            let l = &c["metadata"]["labels"];
            (
                c["metadata"]["name"].as_str().unwrap().to_owned(),
                l[GROUP_NAME_LABEL].as_str().unwrap().to_owned(),
                l[GROUP_INDEX_LABEL].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        labels,
        [
            ("web-decision-1".into(), "canary".into(), "0".into()),
            ("web-decision-2".into(), "".into(), "1".into()),
            ("web-decision-3".into(), "".into(), "2".into()),
        ]
    );
    let groups = &write.placement_status.unwrap()["status"]["decisionGroups"];
    assert_eq!(groups[0]["decisionGroupName"], "canary");
    assert_eq!(groups[0]["clusterCount"], 1);
    assert_eq!(groups[2]["decisions"], json!(["web-decision-3"]));
    // A percentage of the selected clusters.
    let (p, o) = outcome(
        json!({"decisionStrategy": {"groupStrategy": {"clustersPerDecisionGroup": "50%"}}}),
        &Allowed::clusters(None),
        &[],
    );
    let write = plan(&p, &o, &[], &by_name(), NOW);
    assert_eq!(write.create.len(), 2, "ceil(1.5) = 2 per group");
    let (p, o) = outcome(
        json!({"decisionStrategy": {"groupStrategy": {"clustersPerDecisionGroup": "half"}}}),
        &Allowed::clusters(None),
        &[],
    );
    let write = plan(&p, &o, &[], &by_name(), NOW);
    assert!(write.create.is_empty());
    assert_eq!(write.events[0].1, "Misconfigured");
}

#[test]
fn at_most_a_hundred_decisions_per_object() {
    let (_, p) = placement(json!({}));
    let chosen: Vec<ClusterDecision> = (0..250)
        .map(|i| ClusterDecision {
            cluster_name: format!("c{i:03}"),
            reason: String::new(),
        })
        .collect();
    let groups = groups(&p, &chosen, &BTreeMap::new()).unwrap();
    let (objects, status) = objects(&p, &groups);
    assert_eq!(
        objects
            .iter()
            .map(|o| o.decisions.len())
            .collect::<Vec<_>>(),
        [100, 100, 50]
    );
    assert_eq!(objects[2].name, "web-decision-3");
    assert_eq!(status[0]["clusterCount"], 250);
    assert_eq!(
        status[0]["decisions"],
        json!(["web-decision-1", "web-decision-2", "web-decision-3"])
    );
}
