//! Karmada's control plane: its API server (a [`ControlPlane`] with the
//! aggregation layer's front-proxy flags), Karmada's CRDs, and the four
//! components, each on ports of its own, without leader election.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::process::{Process, free_port, port_open, wait_for};
use crate::{ControlPlane, Identity, scratch_dir};

/// Karmada's own namespaces: its components' and the members' credentials.
const KARMADA_SYSTEM: &str = "karmada-system";
pub(super) const KARMADA_CLUSTER: &str = "karmada-cluster";

/// The name the aggregated API server's certificate must carry: kube-apiserver
/// checks its Service's DNS name, even for an ExternalName Service.
const AGGREGATED_APISERVER_DNS: &str = "karmada-aggregated-apiserver.karmada-system.svc";

/// The API server's CN when it proxies to aggregated API servers.
const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// The Karmada API server: etcd and kube-apiserver with the front-proxy
/// (aggregation layer) flags, and Karmada's CRDs and namespaces.
pub(super) fn start_apiserver() -> ControlPlane {
    let pki = scratch_dir("karmada-front-proxy");
    crate::pki::client_pki(&pki, "front-proxy", FRONT_PROXY_CLIENT);
    let file = |name: &str| pki.join(name).display().to_string();
    let plane = ControlPlane::start_with_args(&[
        format!(
            "--requestheader-client-ca-file={}",
            file("front-proxy-ca.crt")
        ),
        format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        format!("--proxy-client-cert-file={}", file("front-proxy.crt")),
        format!("--proxy-client-key-file={}", file("front-proxy.key")),
    ]);
    for namespace in [KARMADA_SYSTEM, KARMADA_CLUSTER] {
        plane.kubectl_ok(&["create", "namespace", namespace]);
    }
    plane
}

/// Karmada's components, killed on drop.
pub(super) struct Components {
    processes: Mutex<Vec<Process>>,
}

impl Components {
    /// The process id of component `name` (e.g. `karmada-scheduler`).
    pub(super) fn pid(&self, name: &str) -> Option<u32> {
        let processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        processes.iter().find(|p| p.name() == name)?.pid()
    }

    /// Panic with the log's tail when a component has exited.
    pub(super) fn check(&self) {
        let mut processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        for process in processes.iter_mut() {
            assert!(
                !process.has_exited(),
                "{} exited:\n{}",
                process.name(),
                process.log_tail(40)
            );
        }
    }
}

/// The client-side request rate of karmada-controller-manager and
/// karmada-scheduler (Karmada's default is 40).
pub const COMPONENT_QPS: u32 = 400;

/// Apply Karmada's CRDs, start the aggregated API server (and register its
/// APIService), the webhook (and register its configurations), the controller
/// manager (without applying Works to members unless `execution`) and the
/// scheduler.
pub(super) fn start_components(plane: &ControlPlane, assets: &Path, execution: bool) -> Components {
    apply_crds(plane, assets);
    let components = Components {
        processes: Mutex::new(Vec::new()),
    };
    let dir = plane.dir().join("karmada");
    std::fs::create_dir_all(&dir).expect("create the Karmada folder");
    let kubeconfig = plane.kubeconfig(Identity::Admin).display().to_string();
    let spawn = |name: &str, args: Vec<String>| {
        let process = Process::spawn(
            name,
            &assets.join(name),
            &args,
            &dir.join(format!("{name}.log")),
        )
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
        components
            .processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(process);
    };
    let wait_listening = |what: &str, port: u16| {
        wait_for(what, Duration::from_secs(120), || {
            components.check();
            port_open(port).then_some(())
        });
    };

    // The aggregated API server serves `cluster.karmada.io` (Cluster is not a
    // CRD), stored in the same etcd.
    let serving = serving_certificate(
        &dir,
        "aggregated-apiserver",
        &[AGGREGATED_APISERVER_DNS, "localhost", "127.0.0.1"],
    );
    let port = free_port();
    spawn(
        "karmada-aggregated-apiserver",
        vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            format!("--etcd-servers=http://127.0.0.1:{}", plane.etcd_port),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!(
                "--cert-dir={}",
                dir.join("aggregated-apiserver-certs").display()
            ),
            format!("--tls-cert-file={}", serving.cert.display()),
            format!("--tls-private-key-file={}", serving.key.display()),
            "--v=1".into(),
        ],
    );
    wait_listening("karmada-aggregated-apiserver to listen", port);
    register_apiservice(plane, assets, &serving, port);

    let serving = serving_certificate(&dir, "webhook", &["127.0.0.1", "localhost"]);
    let port = free_port();
    spawn(
        "karmada-webhook",
        vec![
            format!("--kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", serving.dir.display()),
            format!("--metrics-bind-address=127.0.0.1:{}", free_port()),
            format!("--health-probe-bind-address=127.0.0.1:{}", free_port()),
            // The failover tests taint a dead member NoExecute.
            "--allow-no-execute-taint-policy=true".into(),
            "--v=1".into(),
        ],
    );
    wait_listening("karmada-webhook to listen", port);
    register_webhooks(plane, assets, &serving, port);

    let mut controller_manager = vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--metrics-bind-address=127.0.0.1:{}", free_port()),
        format!("--health-probe-bind-address=127.0.0.1:{}", free_port()),
        "--leader-elect=false".into(),
        // Failover that moves workloads off a dead member.
        "--feature-gates=Failover=true".into(),
        "--enable-no-execute-taint-eviction=true".into(),
        // Test timings: a member's death is seen within seconds; members
        // without kubelets never report workloads Healthy, so eviction
        // tasks clear only at the graceful-eviction timeout.
        "--cluster-status-update-frequency=5s".into(),
        "--cluster-failure-threshold=10s".into(),
        "--cluster-success-threshold=10s".into(),
        "--graceful-eviction-timeout=1m".into(),
        // Its default client throttle (40 requests per second) paces a
        // thousand Deployments at about four a second, whatever schedules
        // them; raised so that the scheduler sets the pace.
        format!("--kube-api-qps={COMPONENT_QPS}"),
        format!("--kube-api-burst={}", 2 * COMPONENT_QPS),
        "--v=1".into(),
    ];
    if !execution {
        controller_manager.push("--controllers=*,-execution,-workStatus".into());
    }
    spawn("karmada-controller-manager", controller_manager);
    spawn(
        "karmada-scheduler",
        vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--metrics-bind-address=127.0.0.1:{}", free_port()),
            format!("--health-probe-bind-address=127.0.0.1:{}", free_port()),
            "--leader-elect=false".into(),
            // The controller manager's throttle, so that both schedulers
            // compared run unthrottled (placement-sync's client has none).
            format!("--kube-api-qps={COMPONENT_QPS}"),
            format!("--kube-api-burst={}", 2 * COMPONENT_QPS),
            "--v=1".into(),
        ],
    );
    components.check();
    components
}

/// Every CRD of `crds/` (Karmada's `charts/karmada/_crds/bases`), applied
/// server-side (they are too large for the last-applied annotation).
fn apply_crds(plane: &ControlPlane, assets: &Path) {
    let crds = assets.join("crds").display().to_string();
    plane.kubectl_ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--recursive",
        "-f",
        &crds,
    ]);
    plane.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=120s",
        "crd",
        "--all",
    ]);
}

/// A serving certificate for `names` from a CA of its own, as `tls.crt` and
/// `tls.key` (the names karmada-webhook reads from its `--cert-dir`).
struct Serving {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    ca_pem: String,
}

fn serving_certificate(parent: &Path, name: &str, names: &[&str]) -> Serving {
    let dir = parent.join(format!("{name}-tls"));
    std::fs::create_dir_all(&dir).expect("create the certificate folder");
    let ca = placement_certs::Ca::generate(&format!("karmada-{name}-ca")).expect("CA");
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let issued = ca.issue_serving(&names).expect("serving certificate");
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::write(&cert, &issued.cert_pem).expect("write tls.crt");
    std::fs::write(&key, &issued.key_pem).expect("write tls.key");
    Serving {
        dir,
        cert,
        key,
        ca_pem: ca.cert_pem().to_owned(),
    }
}

/// Karmada's YAML manifest `deploy/<file>` with `{{caBundle}}` filled in and
/// `edit` applied to its text, as JSON documents.
fn manifest(
    assets: &Path,
    file: &str,
    ca_pem: &str,
    edit: impl Fn(String) -> String,
) -> Vec<Value> {
    let path = assets.join("deploy").join(file);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    // `{{caBundle}}` is a template placeholder, not YAML: fill it in first.
    let text = edit(text.replace("{{caBundle}}", &placement_certs::ca_bundle(ca_pem)));
    crate::kubectl::yaml_documents(&text)
}

/// The APIService of `cluster.karmada.io` and its Service (an ExternalName to
/// this machine, on the aggregated API server's port); waits until the API
/// answers through the Karmada API server.
fn register_apiservice(plane: &ControlPlane, assets: &Path, serving: &Serving, port: u16) {
    let mut documents = manifest(
        assets,
        "karmada-aggregated-apiserver-apiservice.yaml",
        &serving.ca_pem,
        |text| text,
    );
    for doc in &mut documents {
        match doc["kind"].as_str() {
            Some("APIService") => doc["spec"]["service"]["port"] = Value::from(port),
            Some("Service") => doc["spec"]["externalName"] = Value::from("localhost"),
            _ => {}
        }
    }
    crate::kubectl::apply_documents(&plane.kubeconfig(Identity::Admin), documents);
    wait_for(
        "the cluster.karmada.io API to be served",
        Duration::from_secs(120),
        || {
            let out = plane.kubectl(&["get", "clusters.cluster.karmada.io"]);
            out.status.success().then_some(())
        },
    );
}

/// Karmada's webhook configurations, their URLs pointed at the local process.
fn register_webhooks(plane: &ControlPlane, assets: &Path, serving: &Serving, port: u16) {
    let documents = manifest(
        assets,
        "webhook-configuration.yaml",
        &serving.ca_pem,
        |text| {
            text.replace(
                "https://karmada-webhook.karmada-system.svc:443/",
                &format!("https://127.0.0.1:{port}/"),
            )
        },
    );
    for doc in &documents {
        for hook in doc["webhooks"].as_array().into_iter().flatten() {
            let url = hook["clientConfig"]["url"].as_str().unwrap_or_default();
            assert!(
                url.starts_with("https://127.0.0.1:"),
                "webhook-configuration.yaml has a URL the test bed does not rewrite: {url}"
            );
        }
    }
    crate::kubectl::apply_documents(&plane.kubeconfig(Identity::Admin), documents);
}
