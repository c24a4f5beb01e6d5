//! OCM's hub: a [`ControlPlane`] whose kube-apiserver trusts the client
//! certificates its kube-controller-manager signs (the agents' CSRs), OCM's
//! hub CRDs, and the hub controllers (registration with the ClusterProfile
//! gate, placement, work with ManifestWorkReplicaSet), each on ports of its
//! own, without leader election.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

use crate::process::{Process, free_port};
use crate::{ControlPlane, Identity, scratch_dir};

/// The hub controllers' namespace.
pub(super) const HUB_NAMESPACE: &str = "open-cluster-management-hub";

/// The CA whose certificates the hub's API server accepts as client
/// certificates and with which its kube-controller-manager signs CSRs.
pub(super) struct Signer {
    cert: PathBuf,
    key: PathBuf,
}

/// The hub's API server: etcd and kube-apiserver trusting the signer, with
/// OCM's hub CRDs and the hub controllers' namespace.
pub(super) fn start_apiserver(assets: &Path) -> (ControlPlane, Signer) {
    let dir = scratch_dir("ocm-signer");
    let ca = placement_certs::Ca::generate("ocm-hub-signer").expect("signer CA");
    let signer = Signer {
        cert: dir.join("signer.crt"),
        key: dir.join("signer.key"),
    };
    std::fs::write(&signer.cert, ca.cert_pem()).expect("write signer.crt");
    std::fs::write(&signer.key, ca.key_pem()).expect("write signer.key");
    let plane =
        ControlPlane::start_with_args(&[format!("--client-ca-file={}", signer.cert.display())]);
    plane.kubectl_ok(&["create", "namespace", HUB_NAMESPACE]);
    apply_crds(&plane, &hub_crds(assets));
    (plane, signer)
}

/// The hub controllers and the hub's kube-controller-manager, killed on drop.
pub(super) struct HubComponents {
    processes: Mutex<Vec<Process>>,
}

impl HubComponents {
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

/// kube-controller-manager (CSR signing, garbage collection of owned
/// objects, namespaces) and OCM's three hub controllers.
pub(super) fn start_components(
    plane: &ControlPlane,
    signer: &Signer,
    assets: &Path,
) -> HubComponents {
    let components = HubComponents {
        processes: Mutex::new(Vec::new()),
    };
    let dir = plane.dir().join("ocm");
    std::fs::create_dir_all(&dir).expect("create the OCM folder");
    let kubeconfig = plane.kubeconfig(Identity::Admin).display().to_string();
    let spawn = |name: &str, program: &Path, args: Vec<String>| {
        let process = Process::spawn(name, program, &args, &dir.join(format!("{name}.log")))
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        components
            .processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(process);
    };
    spawn(
        "kube-controller-manager",
        &crate::cluster::node_bin("kube-controller-manager"),
        vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()),
            "--controllers=csrsigning,csrcleaner,garbagecollector,namespace".into(),
            format!("--cluster-signing-cert-file={}", signer.cert.display()),
            format!("--cluster-signing-key-file={}", signer.key.display()),
            "--leader-elect=false".into(),
            "--v=1".into(),
        ],
    );
    // Each OCM controller: its own serving port, no leader election.
    let ocm = |command: &[&str], extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = command.iter().map(|a| (*a).to_owned()).collect();
        args.extend([
            format!("--kubeconfig={kubeconfig}"),
            format!("--namespace={HUB_NAMESPACE}"),
            "--disable-leader-election".into(),
            format!("--listen=127.0.0.1:{}", free_port()),
        ]);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    };
    spawn(
        "ocm-registration-controller",
        &assets.join("ocm-registration"),
        ocm(
            &["controller"],
            &["--feature-gates=ClusterProfile=true", "--v=2"],
        ),
    );
    // Its client unthrottled as Karmada's components are
    // ([`crate::karmada::COMPONENT_QPS`]), so that placement-policy and it
    // are compared deciding, not waiting for a client throttle.
    let qps = format!("--kube-api-qps={}", crate::karmada::COMPONENT_QPS);
    let burst = format!("--kube-api-burst={}", 2 * crate::karmada::COMPONENT_QPS);
    spawn(
        "ocm-placement-controller",
        &assets.join("ocm-placement"),
        ocm(&["controller"], &[&qps, &burst, "--v=2"]),
    );
    spawn(
        "ocm-work-manager",
        &assets.join("ocm-work"),
        ocm(
            &["manager"],
            &["--feature-gates=ManifestWorkReplicaSet=true", "--v=2"],
        ),
    );
    components.check();
    components
}

/// The hub's CRDs (`manifests/cluster-manager/hub/crds/`), as JSON. Two of
/// them are Go templates of the cluster-manager operator (the add-on API's
/// conversion webhook, `{{ .AddonAPIServiceCABundle }}` and its namespace):
/// their `spec.conversion` is dropped (the test bed serves one version of
/// each).
fn hub_crds(assets: &Path) -> Vec<Value> {
    let dir = assets.join("manifests/cluster-manager/hub/crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let templated = text.contains("{{");
        let text = without_template_fields(&text);
        for mut doc in crate::kubectl::yaml_documents(&text) {
            if templated && let Some(spec) = doc["spec"].as_object_mut() {
                spec.remove("conversion");
            }
            crds.push(doc);
        }
    }
    assert!(
        crds.iter()
            .any(|c| c["metadata"]["name"] == "placements.cluster.open-cluster-management.io"),
        "{} has no Placement CRD",
        dir.display()
    );
    crds
}

/// `text` with each Go template field (`{{ ... }}`) replaced by an empty
/// string, so that it parses as YAML.
fn without_template_fields(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        match rest[start..].find("}}") {
            Some(end) => {
                out.push_str("\"\"");
                rest = &rest[start + end + 2..];
            }
            None => {
                rest = &rest[start..];
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The CRDs of a managed cluster (`manifests/klusterlet/managed/*.crd.yaml`:
/// AppliedManifestWork, ClusterClaim, ClusterProperty; the other files are
/// the klusterlet operator's templates).
pub(super) fn managed_crds(assets: &Path) -> Vec<Value> {
    let dir = assets.join("manifests/klusterlet/managed");
    let mut crds: Vec<Value> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.to_string_lossy().ends_with(".crd.yaml"))
        .flat_map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            crate::kubectl::yaml_documents(&text)
        })
        .filter(|doc| doc["kind"] == "CustomResourceDefinition")
        .collect();
    crds.sort_by(|a, b| {
        a["metadata"]["name"]
            .to_string()
            .cmp(&b["metadata"]["name"].to_string())
    });
    crds
}

/// Apply CRDs server-side (they are too large for the last-applied
/// annotation) with the administrator's `kubeconfig`, and wait until each is
/// established.
pub(super) fn apply_crds_with(kubeconfig: &Path, crds: &[Value]) {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": crds});
    let out = crate::kubectl::kubectl_stdin(
        kubeconfig,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &list.to_string(),
    );
    assert!(
        out.status.success(),
        "apply OCM's CRDs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for crd in crds {
        let name = crd["metadata"]["name"].as_str().expect("a CRD's name");
        crate::kubectl::kubectl_ok(
            kubeconfig,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=120s",
                &format!("crd/{name}"),
            ],
        );
    }
}

fn apply_crds(plane: &ControlPlane, crds: &[Value]) {
    apply_crds_with(&plane.kubeconfig(Identity::Admin), crds);
}
