use super::*;
use crate::replication::health::cluster_kind;
use serde_json::json;

fn ours() -> Option<&'static ClusterKind> {
    cluster_kind("placement-policy.io", "clusters")
}

fn cluster(phase: &str, pci: &str) -> Value {
    json!({"kind": "Cluster", "metadata": {"name": "eu-1", "resourceVersion": "7",
        "labels": {"placement-policy.io/pci-compliance-level": pci}},
        "spec": {"region": "europe-west1"},
        "status": {"phase": phase, "capacity": {"cpu": "64"}}})
}

#[test]
fn health_status_and_edits_are_told_apart() {
    let key = ObjectKey::new(None, "eu-1");
    let classify = |before: Option<&Value>, after: Option<&Value>| {
        classify(ours(), "clusters", &key, before, after)
    };
    let running = cluster("running", "2");
    assert_eq!(
        classify(Some(&running), Some(&cluster("offline", "2"))),
        Cause::Health
    );
    let mut capacity = running.clone();
    capacity["status"]["capacity"]["cpu"] = json!("32");
    capacity["metadata"]["resourceVersion"] = json!("8");
    assert_eq!(classify(Some(&running), Some(&capacity)), Cause::Status);
    // A label edit, also one made together with a phase change, is guarded.
    let relabelled = cluster("offline", "3");
    let Cause::Data { object, revision } = classify(Some(&running), Some(&relabelled)) else {
        panic!("an edit")
    };
    assert_eq!(object, "clusters/eu-1");
    assert_eq!(
        classify(
            Some(&cluster("running", "2")),
            Some(&cluster("running", "3"))
        ),
        Cause::Data {
            object,
            revision: revision.clone()
        },
        "the revision names what it changed to, not the status"
    );
    assert!(matches!(classify(None, Some(&running)), Cause::Data { .. }));
    assert_eq!(
        classify(Some(&running), None),
        Cause::Data {
            object: "clusters/eu-1".into(),
            revision: "deleted".into()
        }
    );
    // Any other type: status is status, the rest an edit.
    let rs =
        json!({"metadata": {"name": "rs"}, "spec": {"replicas": 1}, "status": {"replicas": 0}});
    let mut scaled = rs.clone();
    scaled["status"]["replicas"] = json!(1);
    assert_eq!(
        super::classify(None, "replicasets", &key, Some(&rs), Some(&scaled)),
        Cause::Status
    );
}

#[test]
fn a_taint_of_karmadas_clusters_is_health_not_an_edit() {
    let karmada = cluster_kind("cluster.karmada.io", "clusters");
    let key = ObjectKey::new(None, "member1");
    let ready = json!({"metadata": {"name": "member1"}, "spec": {"syncMode": "Push"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let mut tainted = ready.clone();
    tainted["spec"]["taints"] =
        json!([{"key": "cluster.karmada.io/not-ready", "effect": "NoSchedule"}]);
    assert_eq!(
        classify(karmada, "clusters", &key, Some(&ready), Some(&tainted)),
        Cause::Health
    );
    let mut pulled = ready.clone();
    pulled["spec"]["syncMode"] = json!("Pull");
    assert!(matches!(
        classify(karmada, "clusters", &key, Some(&ready), Some(&pulled)),
        Cause::Data { .. }
    ));
}
