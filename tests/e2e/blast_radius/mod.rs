//! A policy set is whole or not in force, and one edit that would re-place
//! most workloads is held until confirmed: a set that lost a module is
//! refused (its status names the missing package) and strips no placement;
//! queries never see half a set; a large re-placement by an edit is reported
//! on the policy ConfigMap and applied only once an administrator confirms
//! it (one held occurrence per confirmation), while an outage re-places what
//! it moves at once, beside a held edit too, unless it looks like a
//! partition. Packages have owners: a tenant's module or data ConfigMap
//! writing the shipped packages or the replicated clusters is refused.

use placement_tests::control_plane::POLICY_NAMESPACE;
use placement_tests::{
    ControlPlane, OpaServer, SidecarProcess, placed_clusters, unique_name, wait_for,
};
use serde_json::{Value, json};
use std::time::Duration;

mod held;
mod policy_set;
mod pool;

const CLUSTERS: &str = "placement-policy.io/v1alpha1/clusters";

const HELD: &str = "placement-policy.io/remediation-held";

const CONFIRM: &str = "placement-policy.io/confirm-remediation";

/// The decision package and its rules in two modules, as the shipped policy
/// is: every running cluster, evenly.
const DECISION: &str = r#"package io.k8s.federation.admission

import data.test.rules

annotations := {"federation.kubernetes.io/replica-set-preferences": rules.preferences} if rules.loaded

errors := set() if rules.loaded
"#;

const RULES: &str = r#"package test.rules

loaded := true

running contains name if {
	some name, cluster in data.kubernetes.clusters
	cluster.status.phase == "running"
}

preferences := json.marshal({"clusters": {name: {"weight": 1} | some name in running}})
"#;

fn apply(plane: &ControlPlane, manifest: &Value) {
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn cluster(plane: &ControlPlane, name: &str, phase: &str) {
    apply(
        plane,
        &json!({"apiVersion": "placement-policy.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name}, "spec": {"address": "https://10.0.0.1", "region": "europe-west1"}}),
    );
    plane.kubectl_ok(&[
        "patch",
        &format!("clusters.placement-policy.io/{name}"),
        "--subresource=status",
        "--type=merge",
        "-p",
        &json!({"status": {"phase": phase}}).to_string(),
    ]);
}

fn policy(plane: &ControlPlane, modules: &[(&str, &str)]) {
    let data: serde_json::Map<String, Value> = modules
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
        .collect();
    // Replace, so that a removed key is removed.
    let manifest = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "placement", "namespace": POLICY_NAMESPACE}, "data": data});
    let out = plane.kubectl_stdin(&["replace", "-f", "-"], &manifest.to_string());
    if !out.status.success() {
        apply(plane, &manifest);
    }
}

fn placements(plane: &ControlPlane, ns: &str) -> Vec<Option<Vec<String>>> {
    let list: Value =
        serde_json::from_str(&plane.kubectl_ok(&["get", "rs", "-n", ns, "-o", "json"])).unwrap();
    let items = list["items"].as_array().unwrap();
    // Checks that all are placed must not pass on none.
    assert!(!items.is_empty(), "no ReplicaSet in {ns}");
    items.iter().map(placed_clusters).collect()
}

/// The rules without cluster `b`: an edit that moves every workload.
fn rules_without_b() -> String {
    RULES.replace(
        "cluster.status.phase == \"running\"",
        "cluster.status.phase == \"running\"\n\tname != \"b\"",
    )
}

fn annotation_of(plane: &ControlPlane, ns: &str, cm: &str, key: &str) -> String {
    plane.kubectl_ok(&[
        "get",
        "cm",
        cm,
        "-n",
        ns,
        "-o",
        &format!(
            "jsonpath={{.metadata.annotations.{}}}",
            key.replace('.', "\\.")
        ),
    ])
}

/// The held change reported on the policy ConfigMap, if any.
fn held_report(plane: &ControlPlane) -> Option<Value> {
    serde_json::from_str(&annotation_of(plane, POLICY_NAMESPACE, "placement", HELD)).ok()
}

fn replicaset(plane: &ControlPlane, ns: &str, name: &str) {
    apply(
        plane,
        &json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": "x"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "x"}},
                "template": {"metadata": {"labels": {"app": "x"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}),
    );
}

/// The bed of the guard's tests: a runtime for their async parts, a control
/// plane of the test's own, a namespace `prefix-...` for its workloads, the
/// Clusters `clusters` running and the placement policy loaded.
fn guarded_bed(prefix: &str, clusters: &[&str]) -> (tokio::runtime::Runtime, ControlPlane, String) {
    placement_tests::install_crypto();
    let runtime = placement_tests::current_thread_runtime();
    let plane = ControlPlane::start();
    let ns = unique_name(prefix);
    plane.create_namespace(&ns);
    for name in clusters {
        cluster(&plane, name, "running");
    }
    policy(
        &plane,
        &[("decision.rego", DECISION), ("rules.rego", RULES)],
    );
    (runtime, plane, ns)
}

fn wait_placed_on(plane: &ControlPlane, ns: &str, clusters: &[&str], sidecar: &SidecarProcess) {
    let want = Some(clusters.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>());
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            &format!("every ReplicaSet placed on {clusters:?}"),
            Duration::from_secs(60),
            || {
                placements(plane, ns)
                    .iter()
                    .all(|p| *p == want)
                    .then_some(())
            },
        )
    })) {
        Ok(()) => {}
        Err(_) => panic!(
            "not every ReplicaSet placed on {clusters:?}: {:?}\nreport: {:?}\n{}",
            placements(plane, ns),
            held_report(plane),
            sidecar.log_tail()
        ),
    }
}
