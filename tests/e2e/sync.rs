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

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use placement_tests::control_plane::POLICY_NAMESPACE;
use placement_tests::{ControlPlane, Identity, OpaServer, WebhookProcess, unique_name};
use policy_client::engine::{PolicyEngine, QueryOutcome};
use serde_json::{Value, json};

use placement_tests::PREFS;
const OWNED: &str = "placement-policy.io/policy-owned";
const STATUS: &str = "placement-policy.io/policy-status";
const CLUSTERS: &str = "placement-policy.io/v1alpha1/clusters";

// One test at a time, each on its own runtime: each starts a control plane.
use placement_tests::run_serially as run;

// ---------------------------------------------------------------------------
// The sidecar process
// ---------------------------------------------------------------------------

use placement_tests::SidecarProcess as Sidecar;

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

fn names_in(plane: &ControlPlane, resource: &str, namespace: &str) -> BTreeSet<String> {
    let list = get_json(plane, &[resource, "-n", namespace]);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

fn keys_of(doc: &Option<Value>) -> BTreeSet<String> {
    doc.as_ref()
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Cases 1 and 2: replication follows the API server, across its restart
// ---------------------------------------------------------------------------

#[test]
fn replication_follows_the_apiserver_across_restarts() {
    run(replication_follows_the_apiserver_across_restarts_body());
}

async fn replication_follows_the_apiserver_across_restarts_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let client = opa_client(&opa);
    let ns = unique_name("sync-repl");
    plane.create_namespace(&ns);
    apply(&plane, &replicaset(&ns, "before-start", &[]));

    let sidecar = Sidecar::start(
        &plane,
        &opa,
        &[
            "--replicate=apps/v1/replicasets",
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=off",
        ],
    );
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let ctx = || sidecar.log_tail();

    // The first list is in OPA, with managedFields stripped and the type filled in.
    let path = format!("kubernetes/replicasets/{ns}/before-start");
    let doc = eventually(
        "the listed ReplicaSet in OPA",
        Duration::from_secs(10),
        ctx,
        || opa_data(&client, &path),
    )
    .await;
    assert_eq!(doc["kind"], "ReplicaSet");
    assert_eq!(doc["apiVersion"], "apps/v1");
    assert_eq!(doc["metadata"]["name"], "before-start");
    assert!(doc["metadata"].get("managedFields").is_none(), "{doc}");

    // Create, update, delete: OPA follows within seconds.
    apply(&plane, &replicaset(&ns, "live", &[]));
    cluster(&plane, "sync-repl-eu", "europe-west1", "running");
    let live = format!("kubernetes/replicasets/{ns}/live");
    eventually(
        "created ReplicaSet in OPA",
        Duration::from_secs(10),
        ctx,
        || opa_data(&client, &live),
    )
    .await;
    let eu = eventually(
        "created Cluster in OPA",
        Duration::from_secs(10),
        ctx,
        || opa_data(&client, "kubernetes/clusters/sync-repl-eu"),
    )
    .await;
    assert_eq!(eu["spec"]["region"], "europe-west1");

    plane.kubectl_ok(&["label", "replicaset", "-n", &ns, "live", "tier=gold"]);
    eventually("updated label in OPA", Duration::from_secs(10), ctx, || {
        let client = &client;
        let live = &live;
        async move {
            let doc = opa_data(client, live).await?;
            (doc["metadata"]["labels"]["tier"] == "gold").then_some(())
        }
    })
    .await;
    set_phase(&plane, "sync-repl-eu", "offline");
    eventually("status change in OPA", Duration::from_secs(10), ctx, || {
        let client = &client;
        async move {
            let doc = opa_data(client, "kubernetes/clusters/sync-repl-eu").await?;
            (doc["status"]["phase"] == "offline").then_some(())
        }
    })
    .await;

    plane.kubectl_ok(&["delete", "replicaset", "-n", &ns, "live", "--wait=true"]);
    eventually(
        "deleted ReplicaSet gone from OPA",
        Duration::from_secs(10),
        ctx,
        || {
            let client = &client;
            let live = &live;
            async move { opa_data(client, live).await.is_none().then_some(()) }
        },
    )
    .await;

    // Case 2: objects change around an API server restart; afterwards OPA's data
    // equals the API server's state, deletions included.
    for name in ["keep", "delete-before", "delete-after"] {
        apply(&plane, &replicaset(&ns, name, &[]));
    }
    let ns_path = format!("kubernetes/replicasets/{ns}");
    eventually(
        "three more ReplicaSets in OPA",
        Duration::from_secs(10),
        ctx,
        || {
            let client = &client;
            let ns_path = &ns_path;
            async move { (keys_of(&opa_data(client, ns_path).await).len() == 4).then_some(()) }
        },
    )
    .await;
    plane.kubectl_ok(&[
        "delete",
        "replicaset",
        "-n",
        &ns,
        "delete-before",
        "--wait=false",
    ]);
    plane.restart_apiserver(|| std::thread::sleep(Duration::from_secs(2)));
    plane.kubectl_ok(&[
        "delete",
        "replicaset",
        "-n",
        &ns,
        "delete-after",
        "--wait=true",
    ]);
    apply(&plane, &replicaset(&ns, "after-restart", &[]));
    plane.kubectl_ok(&[
        "delete",
        "clusters.placement-policy.io",
        "sync-repl-eu",
        "--wait=true",
    ]);

    let expected = names_in(&plane, "replicasets", &ns);
    assert_eq!(expected, set(&["after-restart", "before-start", "keep"]));
    eventually(
        "OPA equals the API server after its restart",
        Duration::from_secs(30),
        ctx,
        || {
            let client = &client;
            let ns_path = &ns_path;
            let expected = &expected;
            async move {
                let replicasets = keys_of(&opa_data(client, ns_path).await);
                let clusters = keys_of(&opa_data(client, "kubernetes/clusters").await);
                (&replicasets == expected && clusters.is_empty()).then_some(())
            }
        },
    )
    .await;

    // A sidecar restart while objects change: the first full write of each type
    // replaces what the previous sidecar left in OPA.
    sidecar.stop();
    plane.kubectl_ok(&["delete", "replicaset", "-n", &ns, "keep", "--wait=true"]);
    apply(&plane, &replicaset(&ns, "while-away", &[]));
    let sidecar = Sidecar::start(
        &plane,
        &opa,
        &[
            "--replicate=apps/v1/replicasets",
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=off",
        ],
    );
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let replicasets = keys_of(&opa_data(&client, &ns_path).await);
    assert_eq!(
        replicasets,
        set(&["after-restart", "before-start", "while-away"])
    );
    let count = sidecar
        .metric("placement_sync_replicated_objects{resource=\"replicasets\"}")
        .await;
    assert!(count.is_some_and(|c| c >= 3.0), "{count:?}");
    sidecar.stop();
}

// ---------------------------------------------------------------------------
// Case 3: OPA restarts; the sidecar reloads policies and data by itself
// ---------------------------------------------------------------------------

#[test]
fn a_fresh_opa_gets_policies_and_data_back_without_a_sidecar_restart() {
    run(a_fresh_opa_gets_policies_and_data_back_without_a_sidecar_restart_body());
}

async fn a_fresh_opa_gets_policies_and_data_back_without_a_sidecar_restart_body() {
    let plane = ControlPlane::start();
    let mut opa = OpaServer::start();
    let client = opa_client(&opa);
    cluster(&plane, "eu-a", "europe-west1", "running");
    cluster(&plane, "eu-b", "europe-west2", "running");
    cluster(&plane, "us-c", "us-east1", "offline");
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running"]))],
    );

    let sidecar = Sidecar::start(
        &plane,
        &opa,
        &[
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=off",
        ],
    );
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let ctx = || sidecar.log_tail();

    let input = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "probe", "namespace": "default"}
    });
    let expected = json!({PREFS: prefs_value(&["eu-a", "eu-b"])});
    let decide = |client: &policy_client::opa::Opa| {
        let client = client.clone();
        let input = input.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            match client
                .query("io/k8s/federation/admission", &input, deadline)
                .await
            {
                Ok(QueryOutcome::Defined(v)) => Some(v["annotations"].clone()),
                _ => None,
            }
        }
    };
    assert_eq!(decide(&client).await, Some(expected.clone()));

    // A fresh OPA: nothing in it.
    opa.restart();
    let started = Instant::now();
    // Until the sidecar has reloaded, the decision is undefined (the webhook then
    // fails closed); the first decision OPA gives is already the correct one,
    // because the data goes in before the policies.
    let mut undefined_seen = 0;
    let first = loop {
        match decide(&client).await {
            Some(decision) => break decision,
            None => undefined_seen += 1,
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no decision 30s after the OPA restart\n{}",
            ctx()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(first, expected, "first decision after the restart");
    let recovered = started.elapsed();
    sidecar.wait_ready(Duration::from_secs(30)).await;
    eprintln!(
        "OPA restart recovered (3 clusters, 1 policy) in {recovered:?}; {undefined_seen} undefined answers before"
    );

    let ids: Vec<String> = client
        .policies()
        .await
        .expect("policies")
        .into_keys()
        .collect();
    assert!(
        ids.contains(&format!("{POLICY_NAMESPACE}/placement/placement.rego")),
        "{ids:?}"
    );
    assert_eq!(
        keys_of(&opa_data(&client, "kubernetes/clusters").await),
        set(&["eu-a", "eu-b", "us-c"])
    );
    let restarts = sidecar.metric("placement_sync_engine_restarts_total").await;
    assert!(restarts.is_some_and(|r| r >= 1.0), "{restarts:?}");
    assert_eq!(sidecar.metric("placement_sync_synced").await, Some(1.0));

    // Later changes reach the new OPA as usual.
    set_phase(&plane, "us-c", "running");
    eventually(
        "the new OPA follows changes",
        Duration::from_secs(10),
        ctx,
        || {
            let decide = &decide;
            let client = &client;
            async move {
                (decide(client).await
                    == Some(json!({PREFS: prefs_value(&["eu-a", "eu-b", "us-c"])})))
                .then_some(())
            }
        },
    )
    .await;

    // While OPA is down the sidecar is not ready.
    opa.kill();
    eventually(
        "readyz 503 while OPA is down",
        Duration::from_secs(10),
        ctx,
        || {
            let sidecar = &sidecar;
            async move { (sidecar.get("/readyz").await.0 == 503).then_some(()) }
        },
    )
    .await;
    opa.restart();
    sidecar.wait_ready(Duration::from_secs(30)).await;
    assert!(decide(&client).await.is_some());
    sidecar.stop();
}

/// Case 3 through the real webhook, registered with the API server: decisions are
/// right again after an OPA restart without restarting the sidecar, and while
/// nothing has loaded the fresh OPA the webhook fails closed (a policy ConfigMap
/// exists).
#[test]
fn admission_through_the_webhook_recovers_after_an_opa_restart() {
    run(admission_through_the_webhook_recovers_after_an_opa_restart_body());
}

async fn admission_through_the_webhook_recovers_after_an_opa_restart_body() {
    let plane = ControlPlane::start();
    let mut opa = OpaServer::start();
    cluster(&plane, "eu-a", "europe-west1", "running");
    cluster(&plane, "eu-b", "europe-west2", "running");
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running"]))],
    );
    let ns = unique_name("sync-admit");
    plane.create_namespace(&ns);
    let sync_args = [
        format!("--replicate-cluster={CLUSTERS}"),
        "--remediation=off".to_owned(),
    ];
    let sync_args: Vec<&str> = sync_args.iter().map(String::as_str).collect();
    let sidecar = Sidecar::start(&plane, &opa, &sync_args);
    sidecar.wait_ready(Duration::from_secs(60)).await;

    let webhook = WebhookProcess::start(&[
        format!("--opa-url={}", opa.url()),
        format!("--opa-token-file={}", opa.token_file().display()),
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Webhook).display()
        ),
        format!("--policy-namespace={POLICY_NAMESPACE}"),
        "--engine-deadline=5s".to_owned(),
        "--engine-timeout=1s".to_owned(),
    ]);
    plane.register_webhook(
        &ns,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        POLICY_NAMESPACE,
    );
    let create = |name: &str| {
        plane.kubectl_stdin(
            &["create", "-n", &ns, "-f", "-"],
            &replicaset(&ns, name, &[]),
        )
    };
    let stored = |name: &str| get_json(&plane, &["replicaset", "-n", &ns, name]);
    let want = set(&["eu-a", "eu-b"]);
    placement_tests::wait_for(
        "the API server to call the webhook",
        Duration::from_secs(30),
        || {
            let out = plane.kubectl_stdin(
                &[
                    "create",
                    "-n",
                    &ns,
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                &replicaset(&ns, "probe", &[]),
            );
            String::from_utf8_lossy(&out.stdout)
                .contains(PREFS)
                .then_some(())
        },
    );
    let out = create("before");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(placed_clusters(&stored("before")), Some(want.clone()));

    // A fresh OPA: the sidecar reloads it; admission is right again.
    opa.restart();
    eventually(
        "the sidecar to notice the OPA restart",
        Duration::from_secs(30),
        || sidecar.log_tail(),
        || {
            let sidecar = &sidecar;
            async move {
                let restarts = sidecar.metric("placement_sync_engine_restarts_total").await;
                restarts.is_some_and(|r| r >= 1.0).then_some(())
            }
        },
    )
    .await;
    sidecar.wait_ready(Duration::from_secs(30)).await;
    let out = create("after-restart");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        webhook.log()
    );
    assert_eq!(
        placed_clusters(&stored("after-restart")),
        Some(want.clone())
    );

    // Nothing loads the next fresh OPA (sidecar stopped): the webhook fails closed.
    sidecar.stop();
    opa.restart();
    let out = create("unsynced");
    assert!(!out.status.success(), "admitted while OPA was not in sync");
    assert!(
        plane
            .kubectl(&["get", "replicaset", "-n", &ns, "unsynced"])
            .status
            .code()
            != Some(0)
    );
    // The sidecar comes back and loads it: admitted and placed.
    let sidecar = Sidecar::start(&plane, &opa, &sync_args);
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let out = create("unsynced");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        webhook.log()
    );
    assert_eq!(placed_clusters(&stored("unsynced")), Some(want));
    sidecar.stop();
}

// ---------------------------------------------------------------------------
// Case 4: a policy ConfigMap with a syntax error
// ---------------------------------------------------------------------------

#[test]
fn policy_compile_errors_are_reported_and_the_last_good_version_stays() {
    run(policy_compile_errors_are_reported_and_the_last_good_version_stays_body());
}

async fn policy_compile_errors_are_reported_and_the_last_good_version_stays_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let client = opa_client(&opa);
    let sidecar = Sidecar::start(&plane, &opa, &["--remediation=off"]);
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let ctx = || sidecar.log_tail();

    let version = |v: &str| {
        format!(
            "package io.k8s.federation.admission\n\nannotations[\"example.com/policy-version\"] := \"{v}\"\n\nerrors := []\n"
        )
    };
    let decided_version = |client: &policy_client::opa::Opa| {
        let client = client.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            match client
                .query(
                    "io/k8s/federation/admission",
                    &json!({"kind": "ReplicaSet"}),
                    deadline,
                )
                .await
            {
                Ok(QueryOutcome::Defined(v)) => v["annotations"]["example.com/policy-version"]
                    .as_str()
                    .map(str::to_owned),
                _ => None,
            }
        }
    };
    let status_of = |plane: &ControlPlane| {
        let cm = get_json(plane, &["configmap", "-n", POLICY_NAMESPACE, "placement"]);
        annotation(&cm, STATUS).and_then(|s| serde_json::from_str::<Value>(&s).ok())
    };

    policy_configmap(&plane, "placement", &[("main.rego", &version("1"))]);
    policy_configmap(
        &plane,
        "helpers",
        &[("helpers.rego", "package helpers\n\nanswer := 42\n")],
    );
    eventually("version 1 in force", Duration::from_secs(15), ctx, || {
        let decided_version = &decided_version;
        let client = &client;
        async move { (decided_version(client).await.as_deref() == Some("1")).then_some(()) }
    })
    .await;
    eventually("status ok", Duration::from_secs(15), ctx, || {
        let status_of = &status_of;
        let plane = &plane;
        async move { (status_of(plane) == Some(json!({"status": "ok"}))).then_some(()) }
    })
    .await;

    // A syntax error: the annotation carries OPA's compile error with its location.
    policy_configmap(
        &plane,
        "placement",
        &[(
            "main.rego",
            "package io.k8s.federation.admission\n\nannotations[\"x\"] := \n",
        )],
    );
    let status = eventually("error status", Duration::from_secs(15), ctx, || {
        let status_of = &status_of;
        let plane = &plane;
        async move { status_of(plane).filter(|s| s["status"] == "error") }
    })
    .await;
    let error = &status["errors"][0];
    assert_eq!(
        error["file"],
        format!("{POLICY_NAMESPACE}/placement/main.rego"),
        "{status}"
    );
    assert!(error["row"].as_u64().is_some_and(|r| r >= 3), "{status}");
    assert!(error["col"].is_u64(), "{status}");
    assert_eq!(error["code"], "rego_parse_error", "{status}");
    assert!(!error["message"].as_str().unwrap_or_default().is_empty());
    // The previous good version keeps working, and so does the other ConfigMap.
    assert_eq!(decided_version(&client).await.as_deref(), Some("1"));
    assert_eq!(opa_data(&client, "helpers/answer").await, Some(json!(42)));
    eventually(
        "policies_failed metric",
        Duration::from_secs(5),
        ctx,
        || {
            let sidecar = &sidecar;
            async move {
                (sidecar.metric("placement_sync_policies_failed").await == Some(1.0)).then_some(())
            }
        },
    )
    .await;
    let helpers = get_json(&plane, &["configmap", "-n", POLICY_NAMESPACE, "helpers"]);
    assert_eq!(
        annotation(&helpers, STATUS).as_deref(),
        Some(r#"{"status":"ok"}"#)
    );

    // Fixing it clears the error and loads the fix.
    policy_configmap(&plane, "placement", &[("main.rego", &version("2"))]);
    eventually("status ok again", Duration::from_secs(15), ctx, || {
        let status_of = &status_of;
        let plane = &plane;
        async move { (status_of(plane) == Some(json!({"status": "ok"}))).then_some(()) }
    })
    .await;
    assert_eq!(decided_version(&client).await.as_deref(), Some("2"));
    assert_eq!(
        sidecar.metric("placement_sync_policies_failed").await,
        Some(0.0)
    );

    // The status write does not loop: the ConfigMap settles.
    let rv = |plane: &ControlPlane| {
        get_json(plane, &["configmap", "-n", POLICY_NAMESPACE, "placement"])["metadata"]["resourceVersion"].clone()
    };
    let before = rv(&plane);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        rv(&plane),
        before,
        "status annotation rewritten without a change"
    );

    // Deleting a ConfigMap unloads its modules.
    plane.kubectl_ok(&[
        "delete",
        "configmap",
        "-n",
        POLICY_NAMESPACE,
        "helpers",
        "--wait=true",
    ]);
    eventually(
        "helpers module removed",
        Duration::from_secs(15),
        ctx,
        || {
            let client = &client;
            async move {
                let ids = client.policies().await.ok()?;
                (!ids.keys().any(|id| id.ends_with("/helpers/helpers.rego"))).then_some(())
            }
        },
    )
    .await;
    sidecar.stop();
}

// ---------------------------------------------------------------------------
// Cases 5 and 6: remediation after policy and data changes
// ---------------------------------------------------------------------------

#[test]
fn remediation_keeps_workloads_placed_and_report_mode_only_reports() {
    run(remediation_keeps_workloads_placed_and_report_mode_only_reports_body());
}

async fn remediation_keeps_workloads_placed_and_report_mode_only_reports_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let ns = unique_name("sync-remediate");
    plane.create_namespace(&ns);
    cluster(&plane, "a", "europe-west1", "running");
    cluster(&plane, "b", "europe-west2", "running");
    cluster(&plane, "p", "europe-west3", "pending");
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running"]))],
    );
    let developer_request = r#"{"clusters":{"a":{"weight":5},"b":{"weight":1}}}"#;
    // Created while nothing places them (no webhook here): unannotated, stale.
    apply(&plane, &replicaset(&ns, "free", &[]));
    apply(
        &plane,
        &replicaset(&ns, "requested", &[(PREFS, developer_request)]),
    );

    let sidecar = remediator(
        &plane,
        &opa,
        &["--remediation=auto", "--remediation-rate=50"],
    )
    .await;
    let ctx = || sidecar.log_tail();
    let rs = |name: &str| get_json(&plane, &["replicaset", "-n", &ns, name]);
    let placed = |name: &'static str, want: &'static [&'static str]| {
        let rs = &rs;
        async move { (placed_clusters(&rs(name)) == Some(set(want))).then_some(()) }
    };

    eventually("free placed on a, b", Duration::from_secs(30), ctx, || {
        placed("free", &["a", "b"])
    })
    .await;
    eventually(
        "requested placed on a, b",
        Duration::from_secs(30),
        ctx,
        || placed("requested", &["a", "b"]),
    )
    .await;
    // The developer's request is recorded, not lost under the policy's value.
    let requested = rs("requested");
    assert_eq!(
        annotation(&requested, PREFS).as_deref(),
        Some(prefs_value(&["a", "b"]).as_str())
    );
    let owned: Value =
        serde_json::from_str(&annotation(&requested, OWNED).expect("ownership record")).unwrap();
    assert_eq!(owned["owned"][PREFS]["requested"], developer_request);

    // Case 5: editing the policy ConfigMap (pending clusters become eligible)
    // re-annotates the affected workloads; the request still narrows "requested".
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running", "pending"]))],
    );
    eventually("free gains p", Duration::from_secs(30), ctx, || {
        placed("free", &["a", "b", "p"])
    })
    .await;
    assert_eq!(placed_clusters(&rs("requested")), Some(set(&["a", "b"])));

    // A cluster going offline leaves every workload's preferences.
    set_phase(&plane, "b", "offline");
    eventually("free leaves b", Duration::from_secs(30), ctx, || {
        placed("free", &["a", "p"])
    })
    .await;
    eventually("requested leaves b", Duration::from_secs(30), ctx, || {
        placed("requested", &["a"])
    })
    .await;

    // Case 6: back online, "requested" gets b back: the policy's input was the
    // developer's request all along, not the policy's own earlier output.
    set_phase(&plane, "b", "running");
    eventually(
        "requested gets b back",
        Duration::from_secs(30),
        ctx,
        || placed("requested", &["a", "b"]),
    )
    .await;
    eventually("free gets b back", Duration::from_secs(30), ctx, || {
        placed("free", &["a", "b", "p"])
    })
    .await;
    let owned: Value =
        serde_json::from_str(&annotation(&rs("requested"), OWNED).expect("ownership record"))
            .unwrap();
    assert_eq!(owned["owned"][PREFS]["requested"], developer_request);

    // Converged: no patch loop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = (
        rs("free")["metadata"]["resourceVersion"].clone(),
        rs("requested")["metadata"]["resourceVersion"].clone(),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = (
        rs("free")["metadata"]["resourceVersion"].clone(),
        rs("requested")["metadata"]["resourceVersion"].clone(),
    );
    assert_eq!(before, after, "remediated objects kept changing\n{}", ctx());
    let patches = sidecar
        .metric("placement_sync_remediation_patches_total{result=\"ok\"}")
        .await;
    assert!(patches.is_some_and(|p| p >= 6.0), "{patches:?}");
    assert_eq!(sidecar.metric("placement_sync_leader").await, Some(1.0));
    let events = get_json(&plane, &["events.events.k8s.io", "-n", &ns]);
    assert!(
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["reason"] == "PlacementRemediated"),
        "{events}"
    );
    sidecar.stop();

    // Report mode: nothing is patched, an Event names each stale object.
    let sidecar = remediator(&plane, &opa, &["--remediation=report"]).await;
    let ctx = || sidecar.log_tail();
    let free_before = rs("free");
    let requested_before = rs("requested");
    set_phase(&plane, "a", "offline");
    eventually(
        "two stale objects reported",
        Duration::from_secs(30),
        ctx,
        || {
            let sidecar = &sidecar;
            async move {
                (sidecar
                    .metric("placement_sync_remediation_stale_objects")
                    .await
                    == Some(2.0))
                .then_some(())
            }
        },
    )
    .await;
    let stale_events = eventually(
        "PlacementStale events",
        Duration::from_secs(15),
        ctx,
        || {
            let plane = &plane;
            let ns = &ns;
            async move {
                let events = get_json(plane, &["events.events.k8s.io", "-n", ns]);
                let stale: Vec<Value> = events["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|e| e["reason"] == "PlacementStale")
                    .cloned()
                    .collect();
                let named: BTreeSet<String> = stale
                    .iter()
                    .filter_map(|e| e["regarding"]["name"].as_str().map(str::to_owned))
                    .collect();
                (named == set(&["free", "requested"])).then_some(stale)
            }
        },
    )
    .await;
    // Each Event (one at least per object, by the wait) is a Warning that says
    // which annotation is stale.
    for event in &stale_events {
        assert_eq!(event["type"], "Warning", "{event}");
        let note = event["note"].as_str().unwrap_or_default();
        assert!(
            note.contains("placement is stale") && note.contains(PREFS),
            "the Event names the stale annotation: {event}"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rs("free")["metadata"]["resourceVersion"],
        free_before["metadata"]["resourceVersion"],
        "report mode patched"
    );
    assert_eq!(
        rs("requested")["metadata"]["resourceVersion"],
        requested_before["metadata"]["resourceVersion"],
        "report mode patched"
    );
    let log = log_of(sidecar.log_path());
    assert!(
        !log.contains("remediated placement"),
        "report mode patched:\n{log}"
    );
    sidecar.stop();
}

#[test]
fn status_churn_of_a_type_no_policy_reads_triggers_no_remediation() {
    run(status_churn_of_a_type_no_policy_reads_triggers_no_remediation_body());
}

/// ReplicaSets are replicated and remediated, the policy reads only
/// `data.kubernetes.clusters`: ReplicaSet status updates reach OPA and cost no
/// remediation pass (no decision query per workload); a Cluster going offline
/// still re-places.
async fn status_churn_of_a_type_no_policy_reads_triggers_no_remediation_body() {
    // With OPA's authorization policy, loaded from a file as token-protected
    // OPAs run: the sidecar did not load that module, yet reads its source
    // (it reads no replicated data) instead of assuming it reads everything.
    let (plane, opa, ns) = two_running_clusters("sync-churn");
    apply(&plane, &replicaset(&ns, "web", &[]));
    let sidecar = remediator(
        &plane,
        &opa,
        &["--replicate=apps/v1/replicasets", "--remediation=auto"],
    )
    .await;
    let ctx = || sidecar.log_tail();
    let rs = || get_json(&plane, &["replicaset", "-n", &ns, "web"]);
    eventually(
        "web placed on a, b",
        Duration::from_secs(30),
        ctx,
        || async { (placed_clusters(&rs()) == Some(set(&["a", "b"]))).then_some(()) },
    )
    .await;
    const PASSES: &str = "placement_sync_remediation_passes_total";
    // Settled: no pass for a while (debounce is 200ms in the harness).
    let (before, _) = sidecar
        .remediation_at_rest(Duration::from_secs(2), AT_REST_WITHIN)
        .await;

    let client = opa_client(&opa);
    for generation in 1..=30 {
        plane.kubectl_ok(&[
            "patch",
            "replicaset",
            "web",
            "-n",
            &ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(r#"{{"status":{{"replicas":0,"observedGeneration":{generation}}}}}"#),
        ]);
    }
    let path = format!("kubernetes/replicasets/{ns}/web/status/observedGeneration");
    eventually(
        "the last status update replicated",
        Duration::from_secs(30),
        ctx,
        || {
            let (client, path) = (&client, &path);
            async move { (opa_data(client, path).await == Some(json!(30))).then_some(()) }
        },
    )
    .await;
    // Twice the debounce and more: a pass would have started by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        sidecar.metric(PASSES).await,
        Some(before),
        "status updates of an unread type started remediation passes\n{}",
        sidecar.log_tail()
    );

    set_phase(&plane, "b", "offline");
    eventually("web leaves b", Duration::from_secs(30), ctx, || async {
        (placed_clusters(&rs()) == Some(set(&["a"]))).then_some(())
    })
    .await;
    assert!(sidecar.metric(PASSES).await > Some(before));
}

/// Ten ReplicaSets created unplaced in a namespace of their own, two running
/// Clusters `a` and `b`, the placement policy, and a remediating sidecar that
/// has placed all ten on `a, b`.
struct RemediatedWorkloads {
    plane: ControlPlane,
    _opa: OpaServer,
    ns: String,
    names: Vec<String>,
    sidecar: Sidecar,
}

impl RemediatedWorkloads {
    async fn start(prefix: &str) -> RemediatedWorkloads {
        let (plane, opa, ns) = two_running_clusters(prefix);
        let names: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
        for name in &names {
            apply(&plane, &replicaset(&ns, name, &[]));
        }
        let sidecar = Sidecar::start(
            &plane,
            &opa,
            &[
                &format!("--replicate-cluster={CLUSTERS}"),
                "--remediation=auto",
                "--remediate=apps/v1/replicasets",
            ],
        );
        sidecar.wait_ready(Duration::from_secs(60)).await;
        let bed = RemediatedWorkloads {
            plane,
            _opa: opa,
            ns,
            names,
            sidecar,
        };
        for name in &bed.names {
            eventually(
                "placed on a, b",
                Duration::from_secs(30),
                || bed.sidecar.log_tail(),
                || async { bed.is_placed(name).then_some(()) },
            )
            .await;
        }
        bed
    }

    /// A marker: `w0` asks for clusters `a, b` and `marker` (no such
    /// cluster), an edit of its developer view later in the ReplicaSets' one
    /// watch than every change before it. Once the remediator has re-placed
    /// `w0` on `a, b` (its one decision query) it has seen those changes too.
    /// Returns the remediator's decision queries, at rest after that.
    async fn marker_seen(&self, marker: &str) -> f64 {
        self.plane.kubectl_ok(&[
            "annotate",
            "replicaset",
            "w0",
            "-n",
            &self.ns,
            "--overwrite",
            &format!("{PREFS}={}", prefs_value(&["a", "b", marker])),
        ]);
        eventually(
            "w0 re-placed on a, b after the marker",
            Duration::from_secs(30),
            || self.sidecar.log_tail(),
            || async { self.is_placed("w0").then_some(()) },
        )
        .await;
        remediation_at_rest(&self.sidecar).await.1
    }

    /// Whether ReplicaSet `name` is placed on exactly `a, b`.
    fn is_placed(&self, name: &str) -> bool {
        let rs = get_json(&self.plane, &["replicaset", "-n", &self.ns, name]);
        placed_clusters(&rs) == Some(set(&["a", "b"]))
    }
}

#[test]
fn a_starting_remediator_passes_over_every_workload_once() {
    run(a_starting_remediator_passes_over_every_workload_once_body());
}

/// At its start the remediator loads the policy, replicates the Clusters,
/// becomes ready and leads: each of these signals a pass over everything, and
/// one pass covers them all. (Each used to cost a pass of its own after the
/// first: with 10,000 workloads, three passes and 30,000 decision queries.)
async fn a_starting_remediator_passes_over_every_workload_once_body() {
    let bed = RemediatedWorkloads::start("sync-start").await;
    let (names, sidecar) = (&bed.names, &bed.sidecar);
    // Past the debounce and a pass's length: a second pass would have begun.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (passes, queries) = remediation_at_rest(sidecar).await;
    assert_eq!(
        (passes, queries),
        (1.0, names.len() as f64),
        "(passes, decision queries) after the start\n{}",
        sidecar.log_tail()
    );
}

/// How long a remediator may take to come to rest before the test fails.
const AT_REST_WITHIN: Duration = Duration::from_secs(60);

/// The remediator's `(passes, decision queries)`, sampled between passes (two
/// equal samples 300 ms apart), so that no pass is counted half.
async fn remediation_at_rest(sidecar: &Sidecar) -> (f64, f64) {
    sidecar
        .remediation_at_rest(Duration::from_millis(300), AT_REST_WITHIN)
        .await
}

#[test]
fn a_created_or_edited_workload_is_evaluated_alone() {
    run(a_created_or_edited_workload_is_evaluated_alone_body());
}

/// A workload created where no webhook placed it is placed by the remediator
/// with one decision query, not a pass over every workload; an edit of its
/// developer view costs one query too; its status updates and the
/// remediator's own PATCH cost none.
async fn a_created_or_edited_workload_is_evaluated_alone_body() {
    let bed = RemediatedWorkloads::start("sync-created").await;
    let (plane, ns, sidecar) = (&bed.plane, &bed.ns, &bed.sidecar);
    let ctx = || sidecar.log_tail();
    let (_, before) = remediation_at_rest(sidecar).await;

    // Created, not applied: no annotation at all (as a controller creates).
    let out = plane.kubectl_stdin(&["create", "-f", "-"], &replicaset(ns, "late", &[]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        "late placed on a, b",
        Duration::from_secs(30),
        ctx,
        || async { bed.is_placed("late").then_some(()) },
    )
    .await;
    // The marker's query shows that the echo of the remediator's PATCH has
    // been seen.
    let created = bed.marker_seen("echo").await;
    assert_eq!(
        created - before,
        2.0,
        "the created workload was evaluated alone, once (and the marker once)\n{}",
        sidecar.log_tail()
    );

    for generation in 1..=10 {
        plane.kubectl_ok(&[
            "patch",
            "replicaset",
            "late",
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(r#"{{"status":{{"replicas":0,"observedGeneration":{generation}}}}}"#),
        ]);
    }
    // The marker's query shows that the status updates have been seen.
    let status_updated = bed.marker_seen("status").await;
    assert_eq!(
        status_updated - created,
        1.0,
        "status updates cost decision queries (the marker one)\n{}",
        sidecar.log_tail()
    );

    plane.kubectl_ok(&["label", "replicaset", "late", "-n", ns, "tier=web"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while remediation_at_rest(sidecar).await.1 == status_updated && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, edited) = remediation_at_rest(sidecar).await;
    assert_eq!(
        edited - status_updated,
        1.0,
        "the label edit cost one query\n{}",
        sidecar.log_tail()
    );
}

#[test]
fn a_failing_workload_is_retried_alone() {
    run(a_failing_workload_is_retried_alone_body());
}

/// One workload whose decision cannot be applied (an invalid annotation key)
/// is retried with backoff, and each retry asks the decision for that one
/// workload only, not for all of them.
async fn a_failing_workload_is_retried_alone_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start_with(false, false);
    let ns = unique_name("sync-retry");
    plane.create_namespace(&ns);
    cluster(&plane, "a", "europe-west1", "running");
    let policy = format!(
        "{}\nannotations[\"not a/valid/key\"] := \"x\" if input.metadata.name == \"broken\"\n",
        placement_policy(&["running"])
    );
    policy_configmap(&plane, "placement", &[("placement.rego", &policy)]);
    let names: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
    for name in &names {
        apply(&plane, &replicaset(&ns, name, &[]));
    }
    apply(&plane, &replicaset(&ns, "broken", &[]));
    let sidecar = remediator(&plane, &opa, &["--remediation=auto"]).await;
    let ctx = || sidecar.log_tail();
    for name in &names {
        eventually("placed on a", Duration::from_secs(30), ctx, || async {
            let rs = get_json(&plane, &["replicaset", "-n", &ns, name]);
            (placed_clusters(&rs) == Some(set(&["a"]))).then_some(())
        })
        .await;
    }
    let quiet = || remediation_at_rest(&sidecar);
    let (passes_before, queries_before) = quiet().await;
    // Retries back off (1 s doubling to 60 s, advanced by the first passes
    // too): wait for the next one.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (passes_after, queries_after) = loop {
        let now = quiet().await;
        if now.0 > passes_before {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the failing workload is not retried\n{}",
            sidecar.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        queries_after - queries_before,
        passes_after - passes_before,
        "each retry queried the failing workload alone\n{}",
        sidecar.log_tail()
    );
    let broken = get_json(&plane, &["replicaset", "-n", &ns, "broken"]);
    assert!(annotation(&broken, PREFS).is_none(), "{broken}");
}

#[test]
fn only_the_types_the_policies_read_are_written() {
    run(only_the_types_the_policies_read_are_written_body());
}

/// `--replicate-only-read-types`: Clusters and ReplicaSets are replicated,
/// the placement policy reads only the Clusters, so OPA holds no ReplicaSets.
/// A policy that starts reading ReplicaSets never sees them missing (it is
/// loaded only once they are written), and when it goes they are deleted from
/// OPA again. The ReplicaSets' one watch is shared with the remediator, whose
/// object selector it then applies itself: the replicator still sees both.
async fn only_the_types_the_policies_read_are_written_body() {
    let (plane, opa, ns) = two_running_clusters("sync-reads");
    apply(&plane, &replicaset(&ns, "web", &[]));
    plane.kubectl_ok(&["label", "replicaset", "web", "-n", &ns, "tier=web"]);
    apply(&plane, &replicaset(&ns, "batch", &[]));
    let sidecar = remediator(
        &plane,
        &opa,
        &[
            "--replicate=apps/v1/replicasets",
            "--replicate-only-read-types",
            "--remediation=auto",
            "--scope-object-selector=tier in (web, api)",
        ],
    )
    .await;
    let ctx = || sidecar.log_tail();
    let client = opa_client(&opa);
    eventually(
        "web placed on a, b",
        Duration::from_secs(30),
        ctx,
        || async {
            let rs = get_json(&plane, &["replicaset", "-n", &ns, "web"]);
            (placed_clusters(&rs) == Some(set(&["a", "b"]))).then_some(())
        },
    )
    .await;
    assert_eq!(
        keys_of(&opa_data(&client, "kubernetes/clusters").await),
        set(&["a", "b"])
    );
    assert_eq!(
        opa_data(&client, "kubernetes/replicasets").await,
        None,
        "no policy reads ReplicaSets, yet OPA holds them"
    );
    let batch = get_json(&plane, &["replicaset", "-n", &ns, "batch"]);
    assert_eq!(
        placed_clusters(&batch),
        None,
        "batch is outside the object selector, yet it was placed"
    );

    // Watch what a policy counting ReplicaSets answers, from before it exists.
    let census = "placement/census/replicasets";
    let seen = std::sync::Arc::new(Mutex::new(Vec::<Value>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (client, seen, stop) = (opa_client(&opa), seen.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(v) = opa_data(&client, census).await {
                    seen.lock().unwrap().push(v);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    policy_configmap(
        &plane,
        "census",
        &[(
            "census.rego",
            "package placement.census\n\nreplicasets := count([1 | data.kubernetes.replicasets[_][_]])\n",
        )],
    );
    eventually(
        "the census module answering",
        Duration::from_secs(30),
        ctx,
        || async { (!seen.lock().unwrap().is_empty()).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poller.await.unwrap();
    let answers = seen.lock().unwrap().clone();
    let wrong: Vec<&Value> = answers.iter().filter(|v| **v != json!(2)).collect();
    assert!(
        wrong.is_empty(),
        "the census policy saw ReplicaSets missing: {wrong:?} among {} answers\n{}",
        answers.len(),
        sidecar.log_tail()
    );
    assert_eq!(
        keys_of(&opa_data(&client, &format!("kubernetes/replicasets/{ns}")).await),
        set(&["batch", "web"])
    );

    plane.kubectl_ok(&["delete", "configmap", "census", "-n", POLICY_NAMESPACE]);
    eventually(
        "ReplicaSets deleted from OPA once no policy reads them",
        Duration::from_secs(30),
        ctx,
        || async {
            opa_data(&client, "kubernetes/replicasets")
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        keys_of(&opa_data(&client, "kubernetes/clusters").await),
        set(&["a", "b"])
    );
}

/// In the remediator, a decision with errors never removes
/// or replaces a placement, also when the policy gives annotations beside its
/// errors (a request in conflict with the policy: a requested cluster is no longer allowed, the
/// rest of the request still is). The workload whose developer asked for the
/// cluster that went offline keeps its placement and gets a Warning Event
/// naming the error; the one the policy placed by itself is re-placed.
#[test]
fn a_conflict_keeps_the_placement_and_tells_the_developer() {
    run(a_conflict_keeps_the_placement_and_tells_the_developer_body());
}

async fn a_conflict_keeps_the_placement_and_tells_the_developer_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let ns = unique_name("sync-conflict");
    plane.create_namespace(&ns);
    cluster(&plane, "a", "europe-west1", "running");
    cluster(&plane, "b", "europe-west2", "running");
    // The conflict rule: a requested cluster that is not allowed is an
    // error, and the decision still carries the allowed part of the request.
    let policy = placement_policy(&["running"]).replace(
        "errors := []",
        r#"errors contains msg if {
	invalid := requested - allowed
	count(invalid) > 0
	msg := sprintf("requested clusters that are not allowed: %v", [sort(invalid)])
}"#,
    );
    policy_configmap(&plane, "placement", &[("placement.rego", &policy)]);
    apply(&plane, &replicaset(&ns, "free", &[]));
    apply(
        &plane,
        &replicaset(
            &ns,
            "requested",
            &[(PREFS, r#"{"clusters":{"a":{"weight":5},"b":{"weight":1}}}"#)],
        ),
    );
    let sidecar = remediator(&plane, &opa, &["--remediation=auto"]).await;
    let ctx = || sidecar.log_tail();
    let rs = |name: &str| get_json(&plane, &["replicaset", "-n", &ns, name]);
    for name in ["free", "requested"] {
        eventually(
            &format!("{name} placed on a, b"),
            Duration::from_secs(30),
            ctx,
            || {
                let placed = placed_clusters(&rs(name)) == Some(set(&["a", "b"]));
                async move { placed.then_some(()) }
            },
        )
        .await;
    }
    let before = rs("requested");

    set_phase(&plane, "b", "offline");
    eventually("free leaves b", Duration::from_secs(30), ctx, || {
        let placed = placed_clusters(&rs("free")) == Some(set(&["a"]));
        async move { placed.then_some(()) }
    })
    .await;
    let note = eventually(
        "a PlacementRejected Event for requested",
        Duration::from_secs(30),
        ctx,
        || {
            let events = get_json(&plane, &["events.events.k8s.io", "-n", &ns]);
            let note = events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| {
                    e["reason"] == "PlacementRejected" && e["regarding"]["name"] == "requested"
                })
                .and_then(|e| e["note"].as_str().map(str::to_owned));
            async move { note }
        },
    )
    .await;
    assert!(
        note.contains("requested clusters that are not allowed") && note.contains("b"),
        "{note}"
    );
    // A pass later, the placement and its record are exactly as they were.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rs("requested");
    for key in [PREFS, OWNED] {
        assert_eq!(
            annotation(&after, key),
            annotation(&before, key),
            "{key} kept\n{}",
            ctx()
        );
    }
    sidecar.stop();
}

/// A CREATE review of ReplicaSet `name` in `namespace` with `annotations`.
fn replicaset_review(namespace: &str, name: &str, annotations: &[(&str, &str)]) -> Vec<u8> {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{name}"),
            "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
            "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "developer"},
            "object": {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "c", "image": format!("registry.invalid/{name}:1")}]}}}
            },
            "dryRun": true
        }
    })
    .to_string()
    .into_bytes()
}

/// The clusters the webhook's answer to `review` places on (from its patch).
async fn clusters_answered(webhook: &WebhookProcess, review: Vec<u8>) -> BTreeSet<String> {
    let (status, body) = webhook.post("/mutate", review).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("AdmissionReview JSON");
    assert_eq!(answer["response"]["allowed"], json!(true), "{body}");
    let patch = answer["response"]["patch"]
        .as_str()
        .unwrap_or_else(|| panic!("no patch in {body}"));
    let patch: Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::STANDARD, patch)
            .expect("base64 patch"),
    )
    .expect("JSON patch");
    let prefs = patch
        .as_array()
        .expect("patch operations")
        .iter()
        .find_map(|op| {
            let path = op["path"].as_str()?;
            if path.ends_with(&PREFS.replace('/', "~1")) {
                op["value"].as_str().map(str::to_owned)
            } else {
                op["value"][PREFS].as_str().map(str::to_owned)
            }
        })
        .unwrap_or_else(|| panic!("no placement in {patch}"));
    let prefs: Value = serde_json::from_str(&prefs).expect("preferences JSON");
    prefs["clusters"]
        .as_object()
        .expect("clusters")
        .keys()
        .cloned()
        .collect()
}

/// With OPA, the webhook remembers decisions only while placement-sync (OPA's
/// writer) announces each write first: a data change, a policy change and a
/// read input path each change the very next answer once OPA holds them;
/// identical reviews are answered from memory; with the sidecar gone the
/// memory is off and a write that bypassed it is seen at once.
#[test]
fn opa_decisions_are_remembered_only_while_every_write_is_announced() {
    run(opa_decisions_are_remembered_only_while_every_write_is_announced_body());
}

async fn opa_decisions_are_remembered_only_while_every_write_is_announced_body() {
    let (plane, opa, ns) = two_running_clusters("remember");
    let clusters = format!("--replicate-cluster={CLUSTERS}");
    let sidecar = Sidecar::start(&plane, &opa, &[&clusters, "--remediation=off"]);
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let webhook_args = |extra: Option<String>| {
        let mut args = vec![
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!(
                "--kubeconfig={}",
                plane.kubeconfig(Identity::Webhook).display()
            ),
            format!("--policy-namespace={POLICY_NAMESPACE}"),
        ];
        args.extend(extra);
        args
    };
    let webhook = WebhookProcess::start(&webhook_args(Some(format!(
        "--engine-revisions-url=http://127.0.0.1:{}/engine/revisions",
        sidecar.port
    ))));
    let hits = || webhook.metric("placement_webhook_decision_cache_hits_total");
    let enabled = || webhook.metric("placement_webhook_decision_cache_enabled");
    eventually(
        "the webhook to follow the sidecar's revisions",
        Duration::from_secs(30),
        || webhook.log(),
        || async { (enabled().await == 1.0).then_some(()) },
    )
    .await;
    let review =
        |name: &str, annotations: &[(&str, &str)]| replicaset_review(&ns, name, annotations);

    assert_eq!(
        clusters_answered(&webhook, review("one", &[])).await,
        set(&["a", "b"])
    );
    let before = hits().await;
    // Differs only in what the policy never reads (name, uid, image).
    assert_eq!(
        clusters_answered(&webhook, review("two", &[])).await,
        set(&["a", "b"])
    );
    assert_eq!(
        hits().await,
        before + 1.0,
        "an identical decision is remembered"
    );
    // A read input path: the developer's request.
    // (Weighted otherwise than the policy says, so that the answer patches it.)
    let only_a = json!({"clusters": {"a": {"weight": 5}}}).to_string();
    assert_eq!(
        clusters_answered(&webhook, review("three", &[(PREFS, &only_a)])).await,
        set(&["a"])
    );

    // Data: once OPA holds cluster b offline, the next answer says so.
    let client = opa_client(&opa);
    set_phase(&plane, "b", "offline");
    eventually(
        "OPA to hold cluster b offline",
        Duration::from_secs(30),
        || sidecar.log_tail(),
        || {
            let client = &client;
            async move {
                let b = opa_data(client, "kubernetes/clusters/b").await?;
                (b["status"]["phase"] == "offline").then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        clusters_answered(&webhook, review("four", &[])).await,
        set(&["a"])
    );

    // Policy: once OPA holds the policy that allows offline clusters too.
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running", "offline"]))],
    );
    eventually(
        "OPA to hold the new policy",
        Duration::from_secs(30),
        || sidecar.log_tail(),
        || {
            let client = &client;
            async move {
                let modules = client.policies().await.ok()?;
                modules
                    .values()
                    .any(|source| source.contains("\"offline\""))
                    .then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        clusters_answered(&webhook, review("five", &[])).await,
        set(&["a", "b"])
    );
    let remembered = hits().await;
    assert_eq!(
        clusters_answered(&webhook, review("six", &[])).await,
        set(&["a", "b"])
    );
    assert_eq!(hits().await, remembered + 1.0);

    // The writer gone: the lease runs out and nothing is remembered, so a
    // write that bypassed it (nothing announced) is seen at once.
    sidecar.stop();
    eventually(
        "the decision memory to turn off",
        Duration::from_secs(30),
        || webhook.log(),
        || async { (enabled().await == 0.0).then_some(()) },
    )
    .await;
    client
        .put_data("kubernetes/clusters/a/status/phase", &json!("maintenance"))
        .await
        .expect("a write to OPA");
    let unremembered = hits().await;
    assert_eq!(
        clusters_answered(&webhook, review("seven", &[])).await,
        set(&["b"])
    );
    assert_eq!(
        clusters_answered(&webhook, review("eight", &[])).await,
        set(&["b"])
    );
    assert_eq!(
        hits().await,
        unremembered,
        "nothing remembered without the writer"
    );

    // Without the revisions endpoint, OPA's decisions are never remembered.
    let plain = WebhookProcess::start(&webhook_args(None));
    for name in ["nine", "ten"] {
        assert_eq!(
            clusters_answered(&plain, review(name, &[])).await,
            set(&["b"])
        );
    }
    let page = plain.metrics().await;
    assert!(
        !page.contains("placement_webhook_decision_cache_hits_total"),
        "{page}"
    );
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
