use super::*;
use crate::reconcile::ocm::placement::tests::placement;
use serde_json::json;

pub(crate) fn cluster(name: &str, labels: &[(&str, &str)]) -> ManagedCluster {
    let mut labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.insert(CLUSTER_SET_LABEL.to_owned(), "testbed".to_owned());
    ManagedCluster {
        name: name.to_owned(),
        labels,
        claims: [(
            "region.open-cluster-management.io".to_owned(),
            format!("{name}-region"),
        )]
        .into(),
        ..ManagedCluster::default()
    }
}

/// The bed's three clusters in the set `testbed`, bound to the namespace.
pub(crate) fn inventory() -> Inventory {
    let clusters = [
        cluster("ocm-eu-1", &[("placement-policy.io/jurisdiction", "eu")]),
        cluster("ocm-eu-2", &[("placement-policy.io/jurisdiction", "eu")]),
        cluster(
            "ocm-us-1",
            &[("placement-policy.io/jurisdiction", "non-eu")],
        ),
    ];
    Inventory {
        clusters: Arc::new(clusters.into_iter().map(|c| (c.name.clone(), c)).collect()),
        sets: Arc::new(
            [(
                "testbed".to_owned(),
                ClusterSet::Exclusive("testbed".to_owned()),
            )]
            .into(),
        ),
        bound: ["testbed".to_owned()].into(),
    }
}

/// The cluster `name` of `inventory`, to change.
fn edit<'a>(inventory: &'a mut Inventory, name: &str) -> &'a mut ManagedCluster {
    Arc::make_mut(&mut inventory.clusters)
        .get_mut(name)
        .expect("a cluster of the inventory")
}

fn now() -> k8s_openapi::jiff::Timestamp {
    "2026-11-26T10:00:00Z".parse().unwrap()
}

fn names(candidates: &Candidates) -> Vec<&str> {
    match candidates {
        Candidates::Clusters(c) => c.keys().map(String::as_str).collect(),
        Candidates::Unsatisfied(u) => panic!("unsatisfied: {u:?}"),
    }
}

fn select(spec: Value, inventory: &Inventory) -> Candidates {
    let (_, p) = placement(spec);
    candidates(&p, inventory, &BTreeSet::new(), now())
        .unwrap()
        .0
}

#[test]
fn predicates_are_ored_and_each_is_labels_and_claims() {
    let inv = inventory();
    assert_eq!(
        names(&select(json!({}), &inv)),
        ["ocm-eu-1", "ocm-eu-2", "ocm-us-1"]
    );
    let eu = json!({"predicates": [{"requiredClusterSelector": {"labelSelector": {
        "matchLabels": {"placement-policy.io/jurisdiction": "eu"}}}}]});
    assert_eq!(names(&select(eu, &inv)), ["ocm-eu-1", "ocm-eu-2"]);
    let either = json!({"predicates": [
        {"requiredClusterSelector": {"claimSelector": {"matchExpressions": [
            {"key": "region.open-cluster-management.io", "operator": "In", "values": ["ocm-us-1-region"]}]}}},
        {"requiredClusterSelector": {
            "labelSelector": {"matchExpressions": [{"key": "placement-policy.io/jurisdiction", "operator": "In", "values": ["eu"]}]},
            "claimSelector": {"matchExpressions": [
                {"key": "region.open-cluster-management.io", "operator": "NotIn", "values": ["ocm-eu-2-region"]}]}}}
    ]});
    assert_eq!(names(&select(either, &inv)), ["ocm-eu-1", "ocm-us-1"]);
}

#[test]
fn only_sets_bound_to_the_namespace_and_named_count() {
    let mut inv = inventory();
    Arc::make_mut(&mut inv.sets)
        .insert("global".to_owned(), ClusterSet::Labels(Selector::default()));
    Arc::make_mut(&mut inv.clusters).insert(
        "unset".to_owned(),
        ManagedCluster {
            name: "unset".to_owned(),
            ..ManagedCluster::default()
        },
    );
    assert_eq!(
        names(&select(json!({}), &inv)),
        ["ocm-eu-1", "ocm-eu-2", "ocm-us-1"]
    );
    inv.bound.insert("global".to_owned());
    assert_eq!(
        names(&select(json!({}), &inv)),
        ["ocm-eu-1", "ocm-eu-2", "ocm-us-1", "unset"]
    );
    assert_eq!(
        names(&select(json!({"clusterSets": ["testbed"]}), &inv)),
        ["ocm-eu-1", "ocm-eu-2", "ocm-us-1"]
    );
    let Candidates::Unsatisfied(none) = select(json!({"clusterSets": ["other"]}), &inv) else {
        panic!("no intersection")
    };
    assert_eq!(none.reason, "NoIntersection");
    inv.bound.clear();
    inv.bound.insert("missing".to_owned());
    let Candidates::Unsatisfied(none) = select(json!({}), &inv) else {
        panic!("no valid binding")
    };
    assert_eq!(none.reason, "NoManagedClusterSetBindings");
}

#[test]
fn clusters_being_deleted_are_no_candidates() {
    let mut inv = inventory();
    edit(&mut inv, "ocm-us-1").deleting = true;
    assert_eq!(names(&select(json!({}), &inv)), ["ocm-eu-1", "ocm-eu-2"]);
}

#[test]
fn taints_keep_clusters_off_unless_tolerated() {
    let mut inv = inventory();
    edit(&mut inv, "ocm-eu-1").taints.push(Taint {
        key: "cluster.open-cluster-management.io/unreachable".into(),
        effect: "NoSelect".into(),
        time_added: Some("2026-11-26T09:59:00Z".into()),
        ..Taint::default()
    });
    edit(&mut inv, "ocm-eu-2").taints.push(Taint {
        key: "maintenance".into(),
        effect: "PreferNoSelect".into(),
        ..Taint::default()
    });
    assert_eq!(names(&select(json!({}), &inv)), ["ocm-eu-2", "ocm-us-1"]);
    let tolerating = json!({"tolerations": [
        {"key": "cluster.open-cluster-management.io/unreachable", "operator": "Exists"}]});
    assert_eq!(
        names(&select(tolerating, &inv)),
        ["ocm-eu-1", "ocm-eu-2", "ocm-us-1"]
    );
    // For 120 s from the taint's time: one minute left, then decided again.
    let (_, p) = placement(json!({"tolerations": [
        {"key": "cluster.open-cluster-management.io/unreachable", "operator": "Exists",
         "tolerationSeconds": 120}]}));
    let (found, recheck) = candidates(&p, &inv, &BTreeSet::new(), now()).unwrap();
    assert_eq!(names(&found), ["ocm-eu-1", "ocm-eu-2", "ocm-us-1"]);
    assert_eq!(recheck, Some("2026-11-26T10:01:00Z".parse().unwrap()));
    let (_, p) = placement(json!({"tolerations": [
        {"key": "cluster.open-cluster-management.io/unreachable", "operator": "Exists",
         "tolerationSeconds": 30}]}));
    let (found, _) = candidates(&p, &inv, &BTreeSet::new(), now()).unwrap();
    assert_eq!(names(&found), ["ocm-eu-2", "ocm-us-1"]);
}

#[test]
fn no_select_if_new_keeps_only_new_placements_off() {
    let mut inv = inventory();
    edit(&mut inv, "ocm-us-1").taints.push(Taint {
        key: "draining".into(),
        effect: "NoSelectIfNew".into(),
        ..Taint::default()
    });
    let (_, p) = placement(json!({}));
    let (fresh, _) = candidates(&p, &inv, &BTreeSet::new(), now()).unwrap();
    assert_eq!(names(&fresh), ["ocm-eu-1", "ocm-eu-2"]);
    let decided: BTreeSet<String> = ["ocm-us-1".to_owned()].into();
    let (kept, _) = candidates(&p, &inv, &decided, now()).unwrap();
    assert_eq!(names(&kept), ["ocm-eu-1", "ocm-eu-2", "ocm-us-1"]);
}

#[test]
fn what_cannot_be_honoured_is_misconfigured() {
    let inv = inventory();
    for (spec, says) in [
        (
            json!({"predicates": [{"requiredClusterSelector": {"celSelector": {"celExpressions": ["true"]}}}]}),
            "celSelector is not supported",
        ),
        (
            json!({"predicates": [{"requiredClusterSelector": {"labelSelector": {"matchExpressions": [
                {"key": "a", "operator": "Near"}]}}}]}),
            "spec.predicates[0] labelSelector",
        ),
        (
            json!({"tolerations": [{"operator": "Equal", "value": "x"}]}),
            "If the key is empty, operator must be Exists.",
        ),
    ] {
        let (_, p) = placement(spec);
        let Err(Misconfigured(message)) = candidates(&p, &inv, &BTreeSet::new(), now()) else {
            panic!("misconfigured: {says}")
        };
        assert!(message.contains(says), "{message}");
    }
}

#[test]
fn the_fingerprint_ignores_heartbeats_and_sees_labels_and_availability() {
    let raw = json!({"metadata": {"name": "a", "labels": {"x": "1"}},
                     "status": {"conditions": [{"type": "ManagedClusterConditionAvailable", "status": "True",
                                                "lastTransitionTime": "t1"}],
                                "allocatable": {"cpu": "8"}}});
    let mut beat = raw.clone();
    beat["status"]["allocatable"]["cpu"] = json!("7");
    beat["status"]["conditions"][0]["lastTransitionTime"] = json!("t2");
    assert_eq!(cluster_fingerprint(&raw), cluster_fingerprint(&beat));
    let mut lost = raw.clone();
    lost["status"]["conditions"][0]["status"] = json!("Unknown");
    assert_ne!(cluster_fingerprint(&raw), cluster_fingerprint(&lost));
    let mut relabelled = raw.clone();
    relabelled["metadata"]["labels"]["x"] = json!("2");
    assert_ne!(cluster_fingerprint(&raw), cluster_fingerprint(&relabelled));
}

#[test]
fn sets_parse_as_the_hub_reads_them() {
    let exclusive = json!({"metadata": {"name": "testbed"},
        "spec": {"clusterSelector": {"selectorType": "ExclusiveClusterSetLabel"}}});
    let (name, set) = ClusterSet::parse(exclusive.to_string().as_bytes()).unwrap();
    assert_eq!(
        (name.as_str(), set),
        ("testbed", ClusterSet::Exclusive("testbed".into()))
    );
    let global = json!({"metadata": {"name": "global"},
        "spec": {"clusterSelector": {"selectorType": "LabelSelector", "labelSelector": {}}}});
    let (_, set) = ClusterSet::parse(global.to_string().as_bytes()).unwrap();
    assert!(set.contains(&ManagedCluster::default()));
}
