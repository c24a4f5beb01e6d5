//! Installing and operating placement-policy the way users do: `helm install`
//! of the chart with the project's own images in the test bed's real cluster,
//! then the faults of a working day (pods killed, OPA hung or restarted,
//! upgrades, certificate rotation, uninstall). One release at a time: the
//! cases run one after another on one cluster.

use placement_tests::kubectl::apply_example_clusters;
use placement_tests::{Cluster, POLICY_NAMESPACE, cluster, placed_clusters, repo_root, wait_for};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

mod faults;
mod install;

const RELEASE: &str = "placement-policy";

const NAMESPACE: &str = "placement-system";

const EU_PCI: [&str; 2] = ["gce-europe-west1", "gce-europe-west2"];

/// One case at a time (one release of the chart in the cluster), and none
/// beside the other cluster tests of this binary (the binary's one lock).
fn serial() -> MutexGuard<'static, ()> {
    placement_tests::serial()
}

/// The shared cluster with the project's images imported (once).
fn cluster() -> &'static Cluster {
    static IMPORTED: OnceLock<()> = OnceLock::new();
    let cluster = Cluster::shared();
    IMPORTED.get_or_init(|| {
        cluster.import_project_images();
        // The same images under a second tag, for the upgrade and rollout cases.
        let version = env!("CARGO_PKG_VERSION");
        for (from, to) in [
            (
                format!("localhost/placement-policy/placement-webhook:{version}"),
                format!("localhost/placement-policy/placement-webhook:{version}-next"),
            ),
            (
                format!("localhost/placement-policy/placement-sync:{version}"),
                format!("localhost/placement-policy/placement-sync:{version}-next"),
            ),
            (
                cluster::PAUSE_IMAGE.to_owned(),
                format!("{}-b", cluster::PAUSE_IMAGE),
            ),
        ] {
            let out = cluster.ctr(&["images", "tag", "--force", &from, &to]);
            assert!(
                out.status.success(),
                "tag {from}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    });
    cluster
}

/// A release installed with `values`, uninstalled (and waited for) on drop.
struct Release {
    cluster: &'static Cluster,
    /// From `helm install` to every pod Ready.
    ready_after: Duration,
}

impl Release {
    fn install(values: &[&str]) -> Release {
        let cluster = cluster();
        let mut args = vec![
            "install",
            RELEASE,
            "charts/placement-policy",
            "-n",
            NAMESPACE,
            "--create-namespace",
            "--wait",
            "--timeout=5m",
        ];
        for value in values {
            args.extend(["--set", value]);
        }
        let started = Instant::now();
        cluster.helm_ok(&args);
        // `--wait` waited for the Deployments; every pod is Ready (and there
        // is a webhook pod to check: every mode has one).
        assert!(
            !running_pods(cluster, "webhook").is_empty(),
            "no running webhook pod after helm install {values:?}"
        );
        for component in ["webhook", "remediator"] {
            for pod in running_pods(cluster, component) {
                let ready = cluster.kubectl_ok(&[
                    "get",
                    "pod",
                    &pod,
                    "-n",
                    NAMESPACE,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ]);
                assert_eq!(ready.trim(), "True", "{pod} is Ready");
                // ... without a crash on the way (e.g. replicas racing to
                // create the certificates).
                let restarts = cluster.kubectl_ok(&[
                    "get",
                    "pod",
                    &pod,
                    "-n",
                    NAMESPACE,
                    "-o",
                    "jsonpath={.status.containerStatuses[*].restartCount}",
                ]);
                assert!(
                    restarts.split_whitespace().all(|n| n == "0"),
                    "{pod} restarted: {restarts}"
                );
            }
        }
        let ready_after = started.elapsed();
        eprintln!("helm install {values:?}: every pod Ready after {ready_after:?}");
        apply_example_clusters(&cluster.kubeconfig());
        Release {
            cluster,
            ready_after,
        }
    }

    /// [`wait_for`], and on a timeout the sidecars' logs with the cluster's
    /// diagnostics (the pods, and their logs, go with the release).
    fn wait_for<T>(&self, what: &str, timeout: Duration, check: impl FnMut() -> Option<T>) -> T {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(what, timeout, check)
        })) {
            Ok(value) => value,
            Err(_) => panic!(
                "timed out after {timeout:?} waiting for {what}\n{}\n{}",
                self.remediator_logs(),
                self.cluster.diagnostics()
            ),
        }
    }

    /// The last 40 lines of each remediator sidecar's log, from the
    /// kubelet's log files (the API server cannot reach the node by name in
    /// the test bed).
    fn remediator_logs(&self) -> String {
        let mut logs = String::from("remediator sidecars:\n");
        let pods = self.cluster.dir().join("state/pod-logs");
        for pod in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            let name = pod.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{NAMESPACE}_{RELEASE}-remediator")) {
                let log = std::fs::read_to_string(pod.path().join("placement-sync/0.log"))
                    .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                logs.push_str(&format!("--- {name}\n"));
                logs.push_str(&lines[lines.len().saturating_sub(40)..].join("\n"));
                logs.push('\n');
            }
        }
        logs
    }

    fn policy_status(&self) -> String {
        self.cluster
            .kubectl(&[
                "get",
                "configmap",
                "placement",
                "-n",
                POLICY_NAMESPACE,
                "-o",
                "jsonpath={.metadata.annotations.placement-policy\\.io/policy-status}",
            ])
            .stdout
            .into_iter()
            .map(char::from)
            .collect()
    }

    fn wait_policy_ok(&self) {
        wait_for(
            "the policy ConfigMap's status to be ok",
            Duration::from_secs(120),
            || self.policy_status().contains("\"ok\"").then_some(()),
        );
    }

    fn pods(&self, component: &str) -> Vec<String> {
        running_pods(self.cluster, component)
    }

    /// The processes running `binary` in every pod of the release.
    fn processes(&self, binary: &str) -> Vec<u32> {
        ["webhook", "remediator"]
            .iter()
            .flat_map(|c| self.pods(c))
            .flat_map(|pod| self.cluster.pod_processes(NAMESPACE, &pod, binary))
            .collect()
    }

    /// Send `signal` (`SIGSTOP`, `SIGCONT`, `SIGKILL`) to `binary` in every pod
    /// of the release; returns how many processes got it.
    fn signal(&self, binary: &str, signal: i32) -> usize {
        ["webhook", "remediator"]
            .iter()
            .flat_map(|c| self.pods(c))
            .map(|pod| {
                self.cluster
                    .signal_pod_processes(NAMESPACE, &pod, binary, signal)
            })
            .sum()
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let out = self.cluster.helm(&[
            "uninstall",
            RELEASE,
            "-n",
            NAMESPACE,
            "--wait",
            "--timeout=3m",
        ]);
        if !out.status.success() {
            eprintln!("helm uninstall: {}", String::from_utf8_lossy(&out.stderr));
        }
        let _ = self.cluster.kubectl(&[
            "wait",
            "--for=delete",
            &format!("namespace/{POLICY_NAMESPACE}"),
            "--timeout=120s",
        ]);
        // Terminating pods (OPA outlives the webhook by its preStop sleep) are
        // gone before the next case installs.
        let _ = self.cluster.kubectl(&[
            "wait",
            "--for=delete",
            "pods",
            "--all",
            "-n",
            NAMESPACE,
            "--timeout=120s",
        ]);
    }
}

fn running_pods(cluster: &Cluster, component: &str) -> Vec<String> {
    let list = get_json(
        cluster,
        &[
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            &format!("app.kubernetes.io/component={component}"),
            "--field-selector=status.phase=Running",
        ],
    );
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|pod| pod["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// A namespace of one's own for a case's workloads, deleted (and waited
/// for) when the case ends: the cases share one cluster, and workloads left
/// by one count for the next (a Cluster going offline under 100 leftover
/// ReplicaSets is a change beyond the remediator's blast radius, held).
struct WorkloadNamespace {
    cluster: &'static Cluster,
    name: String,
}

impl std::ops::Deref for WorkloadNamespace {
    type Target = str;
    fn deref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for WorkloadNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for WorkloadNamespace {
    fn drop(&mut self) {
        let out = self.cluster.kubectl(&[
            "delete",
            "namespace",
            &self.name,
            "--wait=true",
            "--timeout=120s",
        ]);
        if !out.status.success() {
            eprintln!(
                "could not delete namespace {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

fn workload_namespace(cluster: &'static Cluster, prefix: &str) -> WorkloadNamespace {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let name = format!("{prefix}-{}", COUNTER.fetch_add(1, Ordering::Relaxed));
    let _ = cluster.kubectl(&["create", "namespace", &name]);
    WorkloadNamespace { cluster, name }
}

/// A ReplicaSet asking for EU clusters with PCI level 2 (the example's
/// annotations), running the pause image so its pods really run.
fn eu_replicaset(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": name},
            "annotations": {
                "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true",
                "policy.federation.alpha.kubernetes.io/pci-compliance-level": "2"
            }
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}
            }
        }
    })
}

/// What `kubectl create` answered.
#[derive(Debug)]
struct Created {
    ok: bool,
    object: Value,
    stderr: String,
}

fn create(cluster: &Cluster, object: &Value) -> Created {
    let out = cluster.kubectl_stdin(&["create", "-o", "json", "-f", "-"], &object.to_string());
    Created {
        ok: out.status.success(),
        object: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn eu_pci() -> Option<Vec<String>> {
    Some(EU_PCI.map(String::from).to_vec())
}

/// Creates placed ReplicaSets in a loop on another thread until stopped;
/// returns every failure.
struct CreateLoop {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<(u32, Vec<String>)>,
}

impl CreateLoop {
    fn start(cluster: &'static Cluster, namespace: &str) -> CreateLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let namespace = namespace.to_owned();
        let handle = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut failures = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let created = create(cluster, &eu_replicaset(&namespace, &format!("loop-{n}")));
                    if !created.ok {
                        failures.push(format!("create {n}: {}", created.stderr.trim()));
                    } else if placed_clusters(&created.object) != eu_pci() {
                        failures.push(format!(
                            "create {n}: not placed: {}",
                            created.object["metadata"]
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                (n, failures)
            }
        });
        CreateLoop { stop, handle }
    }

    /// Stop; (creates made, failures).
    fn finish(self) -> (u32, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("create loop")
    }
}

fn get_json(cluster: &Cluster, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    serde_json::from_str(&cluster.kubectl_ok(&all)).expect("kubectl JSON")
}
