//! A real Open Cluster Management hub (built from `../shared/peers/ocm`)
//! with three managed clusters registered by their own agents, driven as an
//! OCM user drives it; then placement-policy deciding the Placements that
//! opt in.
//!
//! Every test name starts with `ocm_`: where OCM's source is absent (and
//! `PLACEMENT_OCM_BIN` unset), `scripts/test` runs this binary with
//! `--skip ocm_` and says so; run anyway, the tests fail and say why.

use placement_tests::karmada::{MemberKind, PCI_LABEL, WORKLOAD_IMAGE};
use placement_tests::ocm::{
    CLAIM_REGION, CLUSTER_SET, DeliveryGuard, JURISDICTION_LABEL, MANAGED_CLUSTERS, REGION_LABEL,
    available, claim, condition_true,
};
use placement_tests::{Ocm, OpaServer, SidecarProcess, serial, unique_name, wait_for};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

mod changes;
mod decisions;
mod delivery;
mod hub;

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

/// Wait until Deployment `web` of `namespace` is on exactly `clusters` (read
/// from their API servers) and its pod runs in ocm-eu-1, the cluster whose
/// node runs pods.
fn wait_web_running_on(ocm: &Ocm, namespace: &str, clusters: &BTreeSet<String>) {
    wait_or_explain(
        &format!("the Deployment on exactly {clusters:?} (their API servers)"),
        Duration::from_secs(120),
        || (clusters_running(ocm, namespace, "web") == *clusters).then_some(()),
        || {
            format!(
                "running on {:?}\n{}",
                clusters_running(ocm, namespace, "web"),
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
                "get", "pods", "-n", namespace, "-l", "app=web", "-o", "json",
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
// placement-policy deciding the Placements that opt in
// ---------------------------------------------------------------------------

const EU_KEY: &str = "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required";

const PCI_KEY: &str = "policy.federation.alpha.kubernetes.io/pci-compliance-level";

const DISABLE: &str = "cluster.open-cluster-management.io/experimental-scheduling-disable";

const SCHEDULER: &str = "placement-policy.io/scheduler-name";

/// OPA and placement-sync deciding the Placements that name `name`, with the
/// shipped policy in a policy namespace of their own; with the delivery
/// guard (the webhook registered with the hub for ManifestWorks and
/// ManifestWorkReplicaSets) when started [`Decider::guarded`].
struct Decider {
    name: String,
    policy_namespace: String,
    /// Unregistered (then stopped) before OPA stops.
    guard: Option<DeliveryGuard>,
    /// Kept running while the decider is.
    _opa: OpaServer,
    sync: Option<SidecarProcess>,
}

impl Decider {
    fn start(ocm: &Ocm, extra: &[&str]) -> Decider {
        Decider::named(ocm, &unique_name("pp-decider"), extra)
    }

    /// Deciding the Placements that name `name` (the examples' name the
    /// default, `placement-policy`; the tests run one at a time).
    fn named(ocm: &Ocm, name: &str, extra: &[&str]) -> Decider {
        Decider::with(ocm, name, extra, false)
    }

    /// A decider and the delivery guard, as `scripts/testbed up --ocm` runs
    /// them.
    fn guarded(ocm: &Ocm, name: &str) -> Decider {
        Decider::with(ocm, name, &[], true)
    }

    fn with(ocm: &Ocm, name: &str, extra: &[&str], guarded: bool) -> Decider {
        let name = name.to_owned();
        let policy_namespace = unique_name("ocm-policy");
        ocm.create_policy_namespace(&policy_namespace);
        placement_tests::kubectl::create_shipped_policy_configmap(
            &ocm.hub_kubeconfig(),
            &policy_namespace,
        );
        let opa = OpaServer::start();
        let mut args = vec![format!("--scheduler-name={name}")];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let sync = ocm.start_placement_sync(&opa, &policy_namespace, &args);
        let guard = guarded.then(|| {
            ocm.start_delivery_guard(&opa, &policy_namespace, &unique_name("pp-delivery"))
        });
        Decider {
            name,
            policy_namespace,
            guard,
            _opa: opa,
            sync: Some(sync),
        }
    }

    fn log_tail(&self) -> String {
        let mut text = self
            .sync
            .as_ref()
            .map(SidecarProcess::log_tail)
            .unwrap_or_default();
        if let Some(guard) = &self.guard {
            let log = guard.webhook().log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            text.push_str("\nplacement-webhook:\n");
            for line in tail.into_iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

impl Drop for Decider {
    fn drop(&mut self) {
        self.guard.take();
        if let Some(sync) = self.sync.take() {
            sync.stop();
        }
    }
}

/// A Placement of the bed's cluster set, opted in to `decider` when given
/// (OCM's scheduler disabled for it, the decider named), with `spec` added.
fn placement(namespace: &str, name: &str, decider: Option<&Decider>, spec: Value) -> Value {
    let mut placement = json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1",
        "kind": "Placement",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterSets": [CLUSTER_SET]},
    });
    if let Some(decider) = decider {
        placement["metadata"]["annotations"] = json!({DISABLE: "true", SCHEDULER: decider.name});
    }
    if let (Some(target), Some(extra)) = (placement["spec"].as_object_mut(), spec.as_object()) {
        target.extend(extra.clone());
    }
    placement
}

/// The Placement `namespace/name` as stored.
fn get_placement(ocm: &Ocm, namespace: &str, name: &str) -> Value {
    let text = ocm.kubectl_ok(&["get", "placement", name, "-n", namespace, "-o", "json"]);
    serde_json::from_str(&text).expect("Placement JSON")
}

/// The Placement's condition `type_`, if it has it.
fn placement_condition(ocm: &Ocm, namespace: &str, name: &str, type_: &str) -> Option<Value> {
    get_placement(ocm, namespace, name)["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// The EU, PCI level 2 Deployment `web` delivered to the clusters of
/// Placement `placement` by a ManifestWorkReplicaSet.
fn eu_pci2_web(namespace: &str, placement: &str) -> Value {
    let web = deployment(namespace, "web", 1, json!({EU_KEY: "true", PCI_KEY: "2"}));
    replica_set(namespace, "web", placement, &[&web])
}

/// Wait until the decisions of `namespace/placement` are `want`; the state of
/// the bed and the decider's log when they never are.
fn wait_decided(
    ocm: &Ocm,
    decider: &Decider,
    namespace: &str,
    placement: &str,
    want: &BTreeSet<String>,
) {
    wait_or_explain(
        &format!("the decisions of {placement} to be {want:?}"),
        Duration::from_secs(120),
        || (decided(ocm, namespace, placement) == *want).then_some(()),
        || {
            format!(
                "decisions: {:?}\nPlacement: {}\n{}\nplacement-sync:\n{}",
                decisions(ocm, namespace, placement),
                get_placement(ocm, namespace, placement)["status"],
                ocm.diagnostics(),
                decider.log_tail()
            )
        },
    );
}

/// A `kubectl get --watch` of one PlacementDecision (or, with no `name`, of
/// every one in `namespace`): every version of its decided clusters, in order.
struct DecisionWatch {
    child: std::process::Child,
    reader: std::thread::JoinHandle<Vec<BTreeSet<String>>>,
}

impl DecisionWatch {
    fn start(ocm: &Ocm, namespace: &str, name: Option<&str>) -> DecisionWatch {
        let mut child = std::process::Command::new("kubectl")
            .args([
                "--kubeconfig",
                &ocm.hub_kubeconfig().display().to_string(),
                "get",
                "placementdecision",
            ])
            .args(name)
            .args(["-n", namespace, "--watch", "-o", "json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run kubectl get --watch");
        let stdout = child.stdout.take().expect("kubectl's stdout");
        let reader = std::thread::spawn(move || {
            serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout))
                .into_iter::<Value>()
                .map_while(Result::ok)
                .map(|object| {
                    object["status"]["decisions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|d| d["clusterName"].as_str().map(str::to_owned))
                        .collect()
                })
                .collect()
        });
        // The watch has begun once it printed the current version; a moment
        // is enough on loopback (the assertions on its first version say if
        // it was not).
        std::thread::sleep(Duration::from_secs(1));
        DecisionWatch { child, reader }
    }

    fn stop(mut self) -> Vec<BTreeSet<String>> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reader.join().expect("the watch reader")
    }
}
