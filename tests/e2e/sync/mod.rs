//! End-to-end tests of the sync sidecar (`placement-sync`, run as its binary)
//! against the real test bed: etcd, kube-apiserver and OPA on loopback.
//!
//! The sidecar talks to the API server as its own service account (RBAC from
//! `deploy/rbac.yaml`) and to OPA with OPA's bearer token. Each test has its own
//! control plane and OPA (Cluster objects are cluster-scoped and the remediator
//! patches every workload, so tests must not share them), and the tests run one
//! at a time: the machine has two cores.
//!
//! Build the binaries first: `cargo build --bins` (scripts/test does it).

use placement_tests::PREFS;
use placement_tests::control_plane::POLICY_NAMESPACE;
use placement_tests::{ControlPlane, Identity, OpaServer, WebhookProcess, unique_name};
use policy_client::engine::{PolicyEngine, QueryOutcome};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};
// One test at a time, each on its own runtime: each starts a control plane.
use placement_tests::run_serially as run;
// ---------------------------------------------------------------------------
// The sidecar process
// ---------------------------------------------------------------------------

use placement_tests::SidecarProcess as Sidecar;

mod remediation;
mod restarts;
mod writes;

const OWNED: &str = "placement-policy.io/policy-owned";

const CLUSTERS: &str = "placement-policy.io/v1alpha1/clusters";

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn opa_client(opa: &OpaServer) -> policy_client::opa::Opa {
    opa.client()
}

/// The document at `path` in OPA, `None` when undefined.
async fn opa_data(opa: &policy_client::opa::Opa, path: &str) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    match opa.query(path, &json!({}), deadline).await {
        Ok(QueryOutcome::Defined(v)) => Some(v),
        _ => None,
    }
}

/// Poll `check` until it returns `Some`, or panic with `what` and `context()`.
async fn eventually<T, F, Fut>(
    what: &str,
    timeout: Duration,
    context: impl Fn() -> String,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn apply(plane: &ControlPlane, manifest: &str) {
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], manifest);
    assert!(
        out.status.success(),
        "kubectl apply failed: {}\n{manifest}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn get_json(plane: &ControlPlane, args: &[&str]) -> Value {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&plane.kubectl_ok(&full)).expect("kubectl JSON")
}

fn replicaset(namespace: &str, name: &str, annotations: &[(&str, &str)]) -> String {
    let mut text = format!(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels:\n    app: {name}\n"
    );
    if !annotations.is_empty() {
        text.push_str("  annotations:\n");
        for (k, v) in annotations {
            text.push_str(&format!("    {k}: '{v}'\n"));
        }
    }
    text.push_str(&format!(
        "spec:\n  replicas: 0\n  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      containers:\n      - name: app\n        image: registry.invalid/app:1\n"
    ));
    text
}

/// Create a Cluster and set its phase through the status subresource.
fn cluster(plane: &ControlPlane, name: &str, region: &str, phase: &str) {
    apply(
        plane,
        &format!(
            "apiVersion: placement-policy.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  address: https://{name}.invalid\n  region: {region}\n"
        ),
    );
    set_phase(plane, name, phase);
}

fn set_phase(plane: &ControlPlane, name: &str, phase: &str) {
    let patch = format!(r#"{{"status":{{"phase":"{phase}"}}}}"#);
    plane.kubectl_ok(&[
        "patch",
        "clusters.placement-policy.io",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ]);
}

/// A policy ConfigMap with one module per `(key, source)`.
fn policy_configmap(plane: &ControlPlane, name: &str, modules: &[(&str, &str)]) {
    let data: serde_json::Map<String, Value> = modules
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
        .collect();
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": POLICY_NAMESPACE},
        "data": data,
    });
    apply(plane, &manifest.to_string());
}

/// A control plane and OPA, a namespace of its own (`prefix-...`), running
/// Clusters `a` and `b`, and the placement policy of running clusters.
fn two_running_clusters(prefix: &str) -> (ControlPlane, OpaServer, String) {
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let ns = unique_name(prefix);
    plane.create_namespace(&ns);
    cluster(&plane, "a", "europe-west1", "running");
    cluster(&plane, "b", "europe-west2", "running");
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running"]))],
    );
    (plane, opa, ns)
}

/// A sidecar replicating the Clusters and keeping ReplicaSets placed as
/// `extra` says (`--remediation=...` and more), once it is ready.
async fn remediator(plane: &ControlPlane, opa: &OpaServer, extra: &[&str]) -> Sidecar {
    let clusters = format!("--replicate-cluster={CLUSTERS}");
    let mut args = vec![clusters.as_str(), "--remediate=apps/v1/replicasets"];
    args.extend_from_slice(extra);
    let sidecar = Sidecar::start(plane, opa, &args);
    sidecar.wait_ready(Duration::from_secs(60)).await;
    sidecar
}

/// Test placement policy: the allowed clusters are those whose phase is in
/// `phases`; a developer's request (`replica-set-preferences`) narrows the
/// selection to the requested allowed clusters; every selected cluster gets
/// weight 1.
fn placement_policy(phases: &[&str]) -> String {
    let phases = phases
        .iter()
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"package io.k8s.federation.admission

allowed contains name if {{
	some name, cluster in data.kubernetes.clusters
	cluster.status.phase in {{{phases}}}
}}

requested contains name if {{
	raw := input.metadata.annotations["{PREFS}"]
	some name, _ in json.unmarshal(raw).clusters
}}

selected := requested & allowed if count(requested) > 0

selected := allowed if count(requested) == 0

annotations["{PREFS}"] := json.marshal({{"clusters": {{name: {{"weight": 1}} | some name in selected}}}}) if {{
	input.kind in {{"ReplicaSet", "Deployment"}}
}}

errors := []
"#
    )
}

fn prefs_value(clusters: &[&str]) -> String {
    let map: serde_json::Map<String, Value> = clusters
        .iter()
        .map(|c| ((*c).to_owned(), json!({"weight": 1})))
        .collect();
    json!({"clusters": map}).to_string()
}

fn annotation(object: &Value, key: &str) -> Option<String> {
    object["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_owned)
}

/// The clusters named by an object's `replica-set-preferences`.
fn placed_clusters(object: &Value) -> Option<BTreeSet<String>> {
    placement_tests::placed_clusters(object).map(|clusters| clusters.into_iter().collect())
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn keys_of(doc: &Option<Value>) -> BTreeSet<String> {
    doc.as_ref()
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// A bad flag is named once, with what to do: not "invalid configuration"
/// followed by a second "configuration:".
#[test]
fn a_bad_flag_is_named_once_with_what_to_do() {
    let out = std::process::Command::new(placement_tests::project_bin("placement-sync"))
        .args(["--decision=", "--opa-url=http://127.0.0.1:1"])
        .output()
        .expect("run placement-sync");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("invalid configuration: --decision must not be empty")
            && stderr.contains("placement-sync --help")
            && stderr.matches("configuration:").count() == 1,
        "{stderr}"
    );
}
