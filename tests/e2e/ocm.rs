//! A real Open Cluster Management hub (built from `../shared/peers/ocm`)
//! with three managed clusters registered by their own agents, driven as an
//! OCM user drives it; then placement-policy deciding the Placements that
//! opt in.
//!
//! Every test name starts with `ocm_`: where OCM's source is absent (and
//! `PLACEMENT_OCM_BIN` unset), `scripts/test` runs this binary with
//! `--skip ocm_` and says so; run anyway, the tests fail and say why.

use std::collections::BTreeSet;
use std::time::Duration;

use placement_tests::karmada::{MemberKind, PCI_LABEL, WORKLOAD_IMAGE};
use placement_tests::ocm::{
    CLAIM_REGION, CLUSTER_SET, JURISDICTION_LABEL, MANAGED_CLUSTERS, REGION_LABEL, available,
    claim, condition_true,
};
use placement_tests::{Ocm, serial, unique_name, wait_for};
use serde_json::{Value, json};

/// [`wait_for`], failing with `context()` (the state of the bed) added.
fn wait_or_explain<T>(
    what: &str,
    timeout: Duration,
    check: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(what, timeout, check)
    })) {
        Ok(value) => value,
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}\n{}",
            context()
        ),
    }
}

/// Create `objects` on the hub as a user does (`kubectl create -f -`).
fn create(ocm: &Ocm, objects: &[&Value]) {
    for object in objects {
        let out = ocm.kubectl_stdin(&["create", "-f", "-"], &object.to_string());
        assert!(
            out.status.success(),
            "create {} {}: {}",
            object["kind"],
            object["metadata"]["name"],
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A namespace of the hub for one test, with the bed's cluster set bound.
fn namespace(ocm: &Ocm, prefix: &str) -> String {
    let namespace = unique_name(prefix);
    ocm.bind_cluster_set(&namespace);
    namespace
}

/// A Deployment of `replicas` pods of the workload image, with `annotations`.
fn deployment(namespace: &str, name: &str, replicas: u32, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": WORKLOAD_IMAGE}]}
            }
        }
    })
}

/// A ManifestWorkReplicaSet in `namespace` delivering the namespace itself
/// (OCM creates none on the managed clusters) and `manifests` to the
/// clusters of Placement `placement`.
fn replica_set(namespace: &str, name: &str, placement: &str, manifests: &[&Value]) -> Value {
    let mut manifests: Vec<Value> = manifests.iter().map(|m| (*m).clone()).collect();
    manifests.insert(
        0,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
    );
    json!({
        "apiVersion": "work.open-cluster-management.io/v1alpha1",
        "kind": "ManifestWorkReplicaSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "placementRefs": [{"name": placement}],
            "manifestWorkTemplate": {"workload": {"manifests": manifests}},
        }
    })
}

/// The clusters whose own API servers have Deployment `namespace/name`.
fn clusters_running(ocm: &Ocm, namespace: &str, name: &str) -> BTreeSet<String> {
    ocm.clusters()
        .iter()
        .filter(|cluster| {
            cluster
                .kubectl(&["get", "deployment", name, "-n", namespace])
                .status
                .success()
        })
        .map(|cluster| cluster.name().to_owned())
        .collect()
}

/// The clusters named by the PlacementDecisions of `namespace/placement`
/// (found by the label every OCM consumer reads).
fn decided(ocm: &Ocm, namespace: &str, placement: &str) -> BTreeSet<String> {
    decisions(ocm, namespace, placement)
        .iter()
        .flat_map(|d| {
            d["status"]["decisions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|d| d["clusterName"].as_str().map(str::to_owned))
        .filter(|name| !name.is_empty())
        .collect()
}

fn decisions(ocm: &Ocm, namespace: &str, placement: &str) -> Vec<Value> {
    let selector = format!("cluster.open-cluster-management.io/placement={placement}");
    let text = ocm.kubectl_ok(&[
        "get",
        "placementdecisions",
        "-n",
        namespace,
        "-l",
        &selector,
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_str(&text).expect("PlacementDecision list JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|n| (*n).to_owned()).collect()
}

// ---------------------------------------------------------------------------
// The test bed itself, with OCM's own placement controller
// ---------------------------------------------------------------------------

/// The three clusters joined the hub through their own agents (CSR signed by
/// the hub's kube-controller-manager), are available, carry the bed's labels
/// and their agent-reported region claim; ClusterProfiles of them exist in
/// a namespace the cluster set is bound to, with the claim as a property.
#[test]
fn ocm_registers_the_three_clusters_with_agents_labels_claims_and_profiles() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let clusters = ocm.managed_clusters();
    let found: BTreeSet<&str> = clusters
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        found,
        ["ocm-eu-1", "ocm-eu-2", "ocm-us-1"].into_iter().collect()
    );
    for spec in MANAGED_CLUSTERS {
        let cluster = clusters
            .iter()
            .find(|c| c["metadata"]["name"] == spec.name)
            .expect("registered");
        assert!(condition_true(cluster, "ManagedClusterJoined"), "{cluster}");
        assert!(available(cluster), "{cluster}");
        assert_eq!(cluster["spec"]["hubAcceptsClient"], true, "{cluster}");
        let labels = &cluster["metadata"]["labels"];
        assert_eq!(labels[PCI_LABEL], spec.pci_level, "{cluster}");
        assert_eq!(labels[REGION_LABEL], spec.region, "{cluster}");
        let jurisdiction = if spec.region.starts_with("europe-") {
            "eu"
        } else {
            "non-eu"
        };
        assert_eq!(labels[JURISDICTION_LABEL], jurisdiction, "{cluster}");
        assert_eq!(
            labels["cluster.open-cluster-management.io/clusterset"], CLUSTER_SET,
            "{cluster}"
        );
        assert_eq!(claim(cluster, CLAIM_REGION), Some(spec.region), "{cluster}");
        // The agent reports what the cluster's nodes have.
        if let MemberKind::Plain { cpu, .. } = spec.kind {
            assert_eq!(cluster["status"]["allocatable"]["cpu"], cpu, "{cluster}");
        }
        // The agent's certificate came from a CSR the hub signed.
        assert_eq!(
            cluster["spec"]["managedClusterClientConfigs"][0]["url"],
            ocm.cluster(spec.name).server_url(),
            "{cluster}"
        );
    }

    let namespace = namespace(ocm, "ocm-profiles");
    let profiles = wait_or_explain(
        "a ClusterProfile of each cluster in a bound namespace",
        Duration::from_secs(60),
        || {
            let text = ocm.kubectl_ok(&["get", "clusterprofiles", "-n", &namespace, "-o", "json"]);
            let list: Value = serde_json::from_str(&text).expect("ClusterProfile list JSON");
            let items = list["items"].as_array().cloned().unwrap_or_default();
            (items.len() == MANAGED_CLUSTERS.len()).then_some(items)
        },
        || ocm.diagnostics(),
    );
    for spec in MANAGED_CLUSTERS {
        let profile = profiles
            .iter()
            .find(|p| p["metadata"]["name"] == spec.name)
            .unwrap_or_else(|| panic!("no ClusterProfile {}: {profiles:?}", spec.name));
        let properties = profile["status"]["properties"].as_array();
        assert!(
            properties
                .into_iter()
                .flatten()
                .any(|p| { p["name"] == CLAIM_REGION && p["value"] == spec.region }),
            "{profile}"
        );
    }
}

/// OCM's own placement controller decides a Placement by a label predicate
/// (jurisdiction `eu`); ManifestWorkReplicaSet delivers a Deployment to
/// exactly the decided clusters (their own API servers have it, the US
/// cluster's does not), and its pods run in `ocm-eu-1`.
#[test]
fn ocm_places_a_deployment_by_label_predicates_with_its_own_scheduler() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let namespace = namespace(ocm, "ocm-native");
    let placement = json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1",
        "kind": "Placement",
        "metadata": {"name": "eu", "namespace": namespace},
        "spec": {
            "clusterSets": [CLUSTER_SET],
            "predicates": [{"requiredClusterSelector": {"labelSelector": {
                "matchLabels": {JURISDICTION_LABEL: "eu"}
            }}}],
        }
    });
    let web = deployment(&namespace, "web", 1, json!({}));
    let set = replica_set(&namespace, "web", "eu", &[&web]);
    create(ocm, &[&placement, &set]);

    let eu = names(&["ocm-eu-1", "ocm-eu-2"]);
    wait_or_explain(
        "OCM's scheduler to decide the EU clusters",
        Duration::from_secs(60),
        || (decided(ocm, &namespace, "eu") == eu).then_some(()),
        || {
            format!(
                "{:?}\n{}",
                decisions(ocm, &namespace, "eu"),
                ocm.diagnostics()
            )
        },
    );
    wait_or_explain(
        "the Deployment on exactly the EU clusters' API servers",
        Duration::from_secs(120),
        || (clusters_running(ocm, &namespace, "web") == eu).then_some(()),
        || {
            format!(
                "running on {:?}\n{}",
                clusters_running(ocm, &namespace, "web"),
                ocm.diagnostics()
            )
        },
    );
    let eu1 = ocm.cluster("ocm-eu-1");
    wait_or_explain(
        "the Deployment's pod to run in ocm-eu-1",
        Duration::from_secs(180),
        || {
            let text = eu1.kubectl_ok(&[
                "get", "pods", "-n", &namespace, "-l", "app=web", "-o", "json",
            ]);
            let pods: Value = serde_json::from_str(&text).expect("pod list JSON");
            pods["items"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|pod| pod["status"]["phase"] == "Running")
                .then_some(())
        },
        || eu1.cluster().expect("ocm-eu-1 has a node").diagnostics(),
    );
}
