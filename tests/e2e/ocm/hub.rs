//! The hub itself: its three clusters registered with their agents, and a
//! Deployment placed by OCM's own scheduler.

use super::*;

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
    wait_web_running_on(ocm, &namespace, &eu);
}
