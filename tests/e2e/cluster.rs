//! The product as users run it: the project's own images in a real single-node
//! cluster (kubelet, containerd, controllers, kube-proxy), installed from
//! `deploy/`, reached by the API server through its Service.

use std::time::Duration;

use placement_tests::kubectl::{apply_example_clusters, create_shipped_policy_configmap};
use placement_tests::{Cluster, POLICY_NAMESPACE, placed_clusters, repo_root, wait_for};

/// Where the shipped policy places the EU/PCI example.
const EU_PCI: [&str; 2] = ["gce-europe-west1", "gce-europe-west2"];

fn installed() -> &'static Cluster {
    let cluster = Cluster::shared();
    cluster.import_project_images();
    cluster.install_deploy();
    apply_example_clusters(&cluster.kubeconfig());
    create_shipped_policy_configmap(&cluster.kubeconfig(), POLICY_NAMESPACE);
    // The sidecar reports the load on the ConfigMap once OPA has it.
    wait_for(
        "the policy ConfigMap's status to be ok",
        Duration::from_secs(120),
        || {
            let status = cluster.kubectl_ok(&[
                "get",
                "configmap",
                "placement",
                "-n",
                POLICY_NAMESPACE,
                "-o",
                "jsonpath={.metadata.annotations.placement-policy\\.io/policy-status}",
            ]);
            status.contains("\"ok\"").then_some(())
        },
    );
    cluster
}

#[test]
fn deploy_places_replicasets_created_by_users_and_by_the_deployment_controller() {
    let cluster = installed();

    // A user's `kubectl create` returns the object with its placement.
    let example = repo_root().join("examples/replicaset-eu-pci.yaml");
    let created = cluster.kubectl_ok(&["create", "-f", &example.display().to_string(), "-o", "json"]);
    let created: serde_json::Value = serde_json::from_str(&created).expect("created object JSON");
    assert_eq!(
        placed_clusters(&created),
        Some(EU_PCI.map(String::from).to_vec()),
        "kubectl create returned {created}\n{}",
        cluster.diagnostics()
    );

    // The Deployment controller creates the ReplicaSet; the webhook places it.
    let deployment = r#"{
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web-eu",
            "namespace": "default",
            "annotations": {
                "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true",
                "policy.federation.alpha.kubernetes.io/pci-compliance-level": "2"
            }
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web-eu"}},
            "template": {
                "metadata": {"labels": {"app": "web-eu"}},
                "spec": {"containers": [{
                    "name": "web",
                    "image": "registry.k8s.io/pause:3.10",
                    "imagePullPolicy": "IfNotPresent"
                }]}
            }
        }
    }"#;
    let out = cluster.kubectl_stdin(&["create", "-f", "-"], deployment);
    assert!(
        out.status.success(),
        "create the Deployment: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replicaset = wait_for(
        "the Deployment controller to create a ReplicaSet",
        Duration::from_secs(60),
        || {
            let list = cluster.kubectl_ok(&[
                "get", "replicasets", "-n", "default", "-l", "app=web-eu", "-o", "json",
            ]);
            let list: serde_json::Value = serde_json::from_str(&list).expect("list JSON");
            list["items"].as_array()?.first().cloned()
        },
    );
    assert_eq!(
        replicaset["metadata"]["ownerReferences"][0]["kind"], "Deployment",
        "{replicaset}"
    );
    assert_eq!(
        placed_clusters(&replicaset),
        Some(EU_PCI.map(String::from).to_vec()),
        "the controller's ReplicaSet: {replicaset}\n{}",
        cluster.diagnostics()
    );
    // The controller's own writes (status, scale) keep going through the webhook.
    cluster.kubectl_ok(&[
        "rollout",
        "status",
        "deployment/web-eu",
        "-n",
        "default",
        "--timeout=120s",
    ]);
}
