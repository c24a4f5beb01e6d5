//! Karmada's member clusters and their Push registration: a Secret with the
//! member's `token` and `caBundle`, and a `Cluster` with `syncMode: Push`,
//! `apiEndpoint` and `secretRef` (what `karmadactl join` writes).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use serde_json::json;

use super::control_plane::KARMADA_CLUSTER;
use crate::{Cluster, ControlPlane, Identity, cluster::PAUSE_IMAGE};

/// The image Karmada tests give their workloads: the sandbox (`pause`) image,
/// tagged under this name in `member-eu-1`'s containerd (no registry is
/// reachable; a tag other than `latest` is never pulled when present).
pub const WORKLOAD_IMAGE: &str = "localhost/placement-testbed/workload:1";

/// The label of a member's PCI compliance level (the same as on our Cluster CRD).
pub const PCI_LABEL: &str = "placement-policy.io/pci-compliance-level";

/// What a member is and how it is registered.
#[derive(Debug, Clone, Copy)]
pub struct MemberSpec {
    pub name: &'static str,
    pub region: &'static str,
    /// Value of [`PCI_LABEL`].
    pub pci_level: &'static str,
    pub kind: MemberKind,
}

#[derive(Debug, Clone, Copy)]
pub enum MemberKind {
    /// The single-node cluster: kubelet, containerd, controllers; pods run.
    Node,
    /// etcd and kube-apiserver with one Node object of this allocatable CPU
    /// and memory (so Karmada's resource summary has something to add up);
    /// nothing runs.
    Plain {
        cpu: &'static str,
        memory: &'static str,
    },
    /// A member of a large bed (`--members N`): its own `Cluster` object,
    /// region and labels, and an API server shared with every other light
    /// member (one Node of 64 CPUs and 256 GiB allocatable);
    /// nothing runs, and Karmada does not execute Works in a bed that has
    /// light members (see [`crate::karmada::Karmada::start_with`]).
    Light,
}

/// The allocatable CPU and memory of the light members' one Node: what
/// Karmada's resource summary reports for each light member.
const LIGHT_HOST_CPU: &str = "64";
const LIGHT_HOST_MEMORY: &str = "256Gi";

enum Server {
    Node(Box<Cluster>),
    Plain(Box<ControlPlane>),
    /// The API server every light member shares.
    Light(Arc<ControlPlane>),
}

/// One member cluster.
pub struct Member {
    spec: MemberSpec,
    server: Server,
}

/// The API server the light members share, with its one Node.
pub(super) fn start_light_host() -> Arc<ControlPlane> {
    let plane = ControlPlane::start();
    create_node(&plane, "light-host-node", LIGHT_HOST_CPU, LIGHT_HOST_MEMORY);
    Arc::new(plane)
}

impl Member {
    /// A light member on `host` ([`start_light_host`]).
    pub(super) fn light(spec: MemberSpec, host: Arc<ControlPlane>) -> Member {
        Member {
            spec,
            server: Server::Light(host),
        }
    }

    /// A member with a server of its own (not [`MemberKind::Light`]).
    pub(crate) fn start(spec: MemberSpec) -> Member {
        let server = match spec.kind {
            MemberKind::Node => {
                let cluster = Cluster::start();
                let out = cluster.ctr(&["images", "tag", "--force", PAUSE_IMAGE, WORKLOAD_IMAGE]);
                assert!(
                    out.status.success(),
                    "tag {PAUSE_IMAGE} as {WORKLOAD_IMAGE}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                Server::Node(Box::new(cluster))
            }
            MemberKind::Plain { cpu, memory } => {
                let plane = ControlPlane::start();
                create_node(&plane, &format!("{}-node", spec.name), cpu, memory);
                Server::Plain(Box::new(plane))
            }
            MemberKind::Light => panic!("{} is a light member: Member::light", spec.name),
        };
        Member { spec, server }
    }

    pub fn name(&self) -> &'static str {
        self.spec.name
    }

    pub fn spec(&self) -> MemberSpec {
        self.spec
    }

    /// The single-node cluster behind `member-eu-1` (its pods, containerd).
    pub fn cluster(&self) -> Option<&Cluster> {
        match &self.server {
            Server::Node(cluster) => Some(cluster),
            Server::Plain(_) | Server::Light(_) => None,
        }
    }

    /// The member's own API server (as Karmada reaches it).
    pub fn server_url(&self) -> String {
        match &self.server {
            Server::Node(cluster) => cluster.server_url(),
            Server::Plain(plane) => plane.server_url(),
            Server::Light(plane) => plane.server_url(),
        }
    }

    /// The administrator's kubeconfig of the member's own API server.
    pub fn kubeconfig(&self) -> PathBuf {
        match &self.server {
            Server::Node(cluster) => cluster.kubeconfig(),
            Server::Plain(plane) => plane.kubeconfig(Identity::Admin),
            Server::Light(plane) => plane.kubeconfig(Identity::Admin),
        }
    }

    /// Where the member's logs are.
    pub fn dir(&self) -> &Path {
        match &self.server {
            Server::Node(cluster) => cluster.dir(),
            Server::Plain(plane) => plane.dir(),
            Server::Light(plane) => plane.dir(),
        }
    }

    /// The administrator's kube client of the member (bound to the calling
    /// test's runtime).
    pub async fn client(&self) -> kube::Client {
        crate::control_plane::kube_client(&self.kubeconfig()).await
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        crate::kubectl::kubectl(&self.kubeconfig(), args)
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        crate::kubectl::kubectl_ok(&self.kubeconfig(), args)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        crate::kubectl::kubectl_stdin(&self.kubeconfig(), args, stdin)
    }

    /// Kill the member's kube-apiserver (its etcd, and on `member-eu-1` its
    /// node and pods, keep running): Karmada loses the member (on a light
    /// member: every light member).
    pub fn stop_apiserver(&self) {
        match &self.server {
            Server::Node(cluster) => cluster.stop_apiserver(),
            Server::Plain(plane) => plane.stop_apiserver(),
            Server::Light(plane) => plane.stop_apiserver(),
        }
    }

    /// Start the member's kube-apiserver again; waits until it is ready.
    pub fn start_apiserver(&self) {
        match &self.server {
            Server::Node(cluster) => cluster.start_apiserver(),
            Server::Plain(plane) => plane.start_apiserver(),
            Server::Light(plane) => plane.start_apiserver(),
        }
    }

    /// The member's credentials (the administrator's token and the API
    /// server's CA) and its Cluster object, in the Karmada API server.
    pub(super) fn register(&self, karmada: &ControlPlane) {
        crate::kubectl::apply_documents(
            &karmada.kubeconfig(Identity::Admin),
            self.registration().to_vec(),
        );
    }

    /// The Secret and the Cluster [`Member::register`] writes.
    pub(super) fn registration(&self) -> [serde_json::Value; 2] {
        let (token, ca_file) = match &self.server {
            Server::Node(cluster) => (cluster.admin_token(), cluster.ca_file()),
            Server::Plain(plane) => (plane.token(Identity::Admin), plane.ca_file()),
            Server::Light(plane) => (plane.token(Identity::Admin), plane.ca_file()),
        };
        let ca = std::fs::read_to_string(&ca_file)
            .unwrap_or_else(|e| panic!("read {}: {e}", ca_file.display()));
        let name = self.spec.name;
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": KARMADA_CLUSTER},
            "stringData": {"token": token, "caBundle": ca},
        });
        let cluster = json!({
            "apiVersion": "cluster.karmada.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name, "labels": {PCI_LABEL: self.spec.pci_level}},
            "spec": {
                "syncMode": "Push",
                "apiEndpoint": self.server_url(),
                "secretRef": {"namespace": KARMADA_CLUSTER, "name": name},
                "region": self.spec.region,
                "zones": [format!("{}-b", self.spec.region)],
            },
        });
        [secret, cluster]
    }
}

/// A Node object that is Ready with `cpu` and `memory` allocatable. Nothing
/// runs on it, and nothing (no node controller) ever marks it otherwise.
fn create_node(plane: &ControlPlane, name: &str, cpu: &str, memory: &str) {
    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    });
    let out = plane.kubectl_stdin(&["create", "-f", "-"], &node.to_string());
    assert!(
        out.status.success(),
        "create node {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let resources = json!({"cpu": cpu, "memory": memory, "pods": "110"});
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": "TestBed",
            "message": "a Node object of the test bed; nothing runs on it",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }],
    }});
    plane.kubectl_ok(&[
        "patch",
        &format!("node/{name}"),
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
}

/// Whether a Karmada `Cluster` reports `Ready=True`.
pub fn cluster_ready(cluster: &serde_json::Value) -> bool {
    cluster["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}
