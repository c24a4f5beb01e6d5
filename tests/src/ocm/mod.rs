//! A real Open Cluster Management hub with three managed clusters registered
//! by their own agents:
//!
//! | cluster | what it is | region (claim and label) | jurisdiction | `placement-policy.io/pci-compliance-level` |
//! |---|---|---|---|---|
//! | `ocm-eu-1` | the single-node [`Cluster`](crate::Cluster): its pods run | europe-west1 | eu | 2 |
//! | `ocm-eu-2` | etcd + kube-apiserver, one Node object | europe-west2 | eu | 3 |
//! | `ocm-us-1` | etcd + kube-apiserver, one Node object | us-central1 | non-eu | 3 |
//!
//! The hub is a [`ControlPlane`] (`Deref`) whose kube-apiserver trusts the
//! client certificates its kube-controller-manager signs, with OCM's hub
//! CRDs and controllers: registration (ClusterProfile gate on), placement,
//! and work (ManifestWorkReplicaSet gate on). Each managed cluster runs the
//! registration agent and the work agent; the bed approves their CSRs and
//! accepts them, labels them, and puts all three in the ManagedClusterSet
//! [`CLUSTER_SET`], bound to the namespace `default`
//! ([`Ocm::bind_cluster_set`] binds it to others).
//!
//! OCM's binaries and manifests come from `scripts/testbed ocm-assets`
//! (built from `../shared/peers/ocm`) or `PLACEMENT_OCM_BIN`.

pub mod delivery;
mod hub;
mod managed;

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::karmada::{MemberKind, MemberSpec};
use crate::{ControlPlane, Identity, OpaServer, SidecarProcess, repo_root, wait_for};

pub use delivery::DeliveryGuard;
pub use managed::ManagedCluster;

/// The managed clusters, as registered with the hub.
pub const MANAGED_CLUSTERS: [MemberSpec; 3] = [
    MemberSpec {
        name: "ocm-eu-1",
        region: "europe-west1",
        pci_level: "2",
        kind: MemberKind::Node,
    },
    MemberSpec {
        name: "ocm-eu-2",
        region: "europe-west2",
        pci_level: "3",
        kind: MemberKind::Plain {
            cpu: "8",
            memory: "32Gi",
        },
    },
    MemberSpec {
        name: "ocm-us-1",
        region: "us-central1",
        pci_level: "3",
        kind: MemberKind::Plain {
            cpu: "16",
            memory: "64Gi",
        },
    },
];

/// The ManagedClusterSet of the three clusters (OCM's exclusive set label).
pub const CLUSTER_SET: &str = "testbed";
/// OCM's label of a cluster's (exclusive) ManagedClusterSet.
pub const CLUSTER_SET_LABEL: &str = "cluster.open-cluster-management.io/clusterset";
/// The region label of the bed's ManagedClusters.
pub const REGION_LABEL: &str = "placement-policy.io/region";
/// The jurisdiction label of the bed's ManagedClusters (`eu`, `non-eu`).
pub const JURISDICTION_LABEL: &str = "placement-policy.io/jurisdiction";
/// OCM's well-known ClusterClaim of a cluster's region, claimed on each
/// managed cluster and reported by its agent.
pub const CLAIM_REGION: &str = "region.open-cluster-management.io";
/// How often a managed cluster's agent renews its lease; the hub marks the
/// cluster unavailable after five times that without a renewal.
pub const LEASE_DURATION_SECONDS: u32 = 5;

/// The type placement-sync replicates the ManagedClusters from.
pub const MANAGED_CLUSTERS_TYPE: &str = "cluster.open-cluster-management.io/v1/managedclusters";

/// The flags of placement-sync as OCM's decider: ManagedClusters replicated,
/// the policies of `policy_namespace`, opted-in Placements decided;
/// workloads are not remediated (they live in the managed clusters).
pub fn decider_args(policy_namespace: &str) -> Vec<String> {
    vec![
        format!("--replicate-cluster={MANAGED_CLUSTERS_TYPE}"),
        format!("--policy-namespace={policy_namespace}"),
        "--decide-ocm-placements".to_owned(),
        "--remediation=off".to_owned(),
    ]
}

/// Folder holding OCM's three binaries (`ocm-placement`, `ocm-registration`,
/// `ocm-work`) with `manifests/` of the same snapshot: `PLACEMENT_OCM_BIN`,
/// else `scripts/testbed ocm-assets`. Panics with the reason when neither can
/// provide it.
pub fn ocm_assets() -> &'static Path {
    static ASSETS: OnceLock<PathBuf> = OnceLock::new();
    ASSETS.get_or_init(|| {
        let dir = match std::env::var("PLACEMENT_OCM_BIN") {
            Ok(dir) => PathBuf::from(dir),
            Err(_) => {
                let output = std::process::Command::new(repo_root().join("scripts/testbed"))
                    .arg("ocm-assets")
                    .stderr(std::process::Stdio::inherit())
                    .output()
                    .expect("run scripts/testbed ocm-assets");
                assert!(
                    output.status.code() != Some(3),
                    "the OCM tests need Open Cluster Management: PLACEMENT_OCM_BIN is not set and \
                     its source is absent (../shared/peers/ocm, or $PLACEMENT_OCM_SRC); run \
                     without them (`--skip ocm_`), as scripts/test does there"
                );
                assert!(
                    output.status.success(),
                    "scripts/testbed ocm-assets failed (exit {:?})",
                    output.status.code()
                );
                PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
            }
        };
        for needed in [
            "ocm-placement",
            "ocm-registration",
            "ocm-work",
            "manifests/cluster-manager/hub/crds",
            "manifests/klusterlet/managed",
        ] {
            assert!(
                dir.join(needed).exists(),
                "{} has no {needed}: rebuild it with scripts/testbed ocm-assets",
                dir.display()
            );
        }
        dir
    })
}

/// A running OCM hub with its managed clusters. Every process ends with it
/// (or with the test process).
pub struct Ocm {
    /// Stopped first: the agents, then the hub's controllers, before what
    /// they talk to.
    clusters: Vec<ManagedCluster>,
    components: hub::HubComponents,
    hub: ControlPlane,
}

impl Deref for Ocm {
    type Target = ControlPlane;

    /// The hub's API server.
    fn deref(&self) -> &ControlPlane {
        &self.hub
    }
}

impl Ocm {
    /// One hub shared by the tests of a test binary (each test uses its own
    /// namespaces). Started on first use; it ends with the test process.
    pub fn shared() -> &'static Ocm {
        static SHARED: OnceLock<Result<Ocm, String>> = OnceLock::new();
        crate::shared(&SHARED, "OCM hub", Ocm::start)
    }

    /// Start the hub and the managed clusters side by side, have every
    /// cluster's agents join the hub (CSR approved, cluster accepted), label
    /// the clusters and put them in [`CLUSTER_SET`]; wait until the hub
    /// reports every one joined and available with its claims.
    pub fn start() -> Ocm {
        crate::install_crypto();
        let assets = ocm_assets();
        let (hub, components, clusters) = std::thread::scope(|scope| {
            let (hub, signer) = hub::start_apiserver(assets);
            let bootstrap = managed::bootstrap_kubeconfig(&hub);
            let clusters: Vec<_> = MANAGED_CLUSTERS
                .iter()
                .map(|spec| {
                    let bootstrap = bootstrap.clone();
                    scope.spawn(move || ManagedCluster::start(*spec, assets, &bootstrap))
                })
                .collect();
            let components = hub::start_components(&hub, &signer, assets);
            let clusters: Vec<ManagedCluster> = clusters
                .into_iter()
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p))
                })
                .collect();
            (hub, components, clusters)
        });
        let ocm = Ocm {
            clusters,
            components,
            hub,
        };
        for cluster in &ocm.clusters {
            cluster.start_registration_agent();
        }
        managed::accept(&ocm.hub, &ocm.clusters);
        for cluster in &ocm.clusters {
            cluster.start_work_agent();
        }
        ocm.configure_clusters();
        ocm.grant_decider();
        ocm.wait_clusters_available();
        ocm.bind_cluster_set("default");
        ocm
    }

    /// The permissions the chart's docs have an OCM hub grant placement-sync
    /// (`charts/placement-policy/files/ocm-hub-clusterrole.yaml`), bound to
    /// the sidecar's identity, which has the chart's own RBAC besides.
    fn grant_decider(&self) {
        let path = repo_root().join("charts/placement-policy/files/ocm-hub-clusterrole.yaml");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mut documents = crate::kubectl::yaml_documents(&text);
        assert_eq!(
            documents.first().map(|d| &d["kind"]),
            Some(&json!("ClusterRole")),
            "{} starts with the ClusterRole",
            path.display()
        );
        let subjects = json!([{"kind": "ServiceAccount", "name": crate::control_plane::SIDECAR_ACCOUNT,
                               "namespace": crate::SYSTEM_NAMESPACE}]);
        // Each role bound where it is: the ClusterRole on the hub, the Role
        // in its namespace.
        let bindings: Vec<Value> = documents
            .iter()
            .map(|role| {
                let kind = role["kind"].as_str().unwrap_or_default();
                let mut binding = json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": format!("{kind}Binding"),
                    "metadata": {"name": role["metadata"]["name"]},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind,
                                "name": role["metadata"]["name"]},
                    "subjects": subjects,
                });
                if let Some(namespace) = role["metadata"]["namespace"].as_str() {
                    binding["metadata"]["namespace"] = json!(namespace);
                }
                binding
            })
            .collect();
        documents.extend(bindings);
        crate::kubectl::apply_documents(&self.kubeconfig(Identity::Admin), documents);
    }

    /// Label every ManagedCluster (region, jurisdiction, PCI level, the
    /// cluster set) and shorten its lease, so that a stopped agent is seen
    /// within half a minute.
    fn configure_clusters(&self) {
        let set = json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta2",
            "kind": "ManagedClusterSet",
            "metadata": {"name": CLUSTER_SET},
            "spec": {"clusterSelector": {"selectorType": "ExclusiveClusterSetLabel"}},
        });
        crate::kubectl::apply_documents(&self.kubeconfig(Identity::Admin), vec![set]);
        for cluster in &self.clusters {
            let mut labels = cluster.labels();
            labels[CLUSTER_SET_LABEL] = json!(CLUSTER_SET);
            let patch = json!({
                "metadata": {"labels": labels},
                "spec": {"leaseDurationSeconds": LEASE_DURATION_SECONDS},
            });
            self.kubectl_ok(&[
                "patch",
                "managedcluster",
                cluster.name(),
                "--type=merge",
                "-p",
                &patch.to_string(),
            ]);
        }
    }

    /// Bind [`CLUSTER_SET`] to `namespace` (created if missing) and wait until
    /// the binding is Bound: Placements there may select the bed's clusters.
    pub fn bind_cluster_set(&self, namespace: &str) {
        // It may exist (`default`).
        let _ = self.kubectl(&["create", "namespace", namespace]);
        let binding = json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta2",
            "kind": "ManagedClusterSetBinding",
            "metadata": {"name": CLUSTER_SET, "namespace": namespace},
            "spec": {"clusterSet": CLUSTER_SET},
        });
        crate::kubectl::apply_documents(&self.kubeconfig(Identity::Admin), vec![binding]);
        wait_for(
            "the ManagedClusterSetBinding to be Bound",
            Duration::from_secs(60),
            || {
                let out = self.kubectl(&[
                    "get",
                    "managedclustersetbinding",
                    CLUSTER_SET,
                    "-n",
                    namespace,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Bound\")].status}",
                ]);
                (String::from_utf8_lossy(&out.stdout).trim() == "True").then_some(())
            },
        );
    }

    /// Install the SIG-Multicluster PlacementDecision CRD (KEP-5313; the
    /// chart's copy of cluster-inventory-api's) on the hub, once.
    pub fn install_sig_placement_decisions(&self) {
        let path = repo_root()
            .join("charts/placement-policy/files/multicluster.x-k8s.io_placementdecisions.yaml");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        hub::apply_crds_with(
            &self.hub_kubeconfig(),
            &crate::kubectl::yaml_documents(&text),
        );
    }

    /// The hub's API server (also reachable through `Deref`).
    pub fn hub(&self) -> &ControlPlane {
        &self.hub
    }

    /// The administrator's kubeconfig of the hub.
    pub fn hub_kubeconfig(&self) -> PathBuf {
        self.hub.kubeconfig(Identity::Admin)
    }

    pub fn clusters(&self) -> &[ManagedCluster] {
        &self.clusters
    }

    /// The managed cluster named `name` (one of [`MANAGED_CLUSTERS`]).
    pub fn cluster(&self, name: &str) -> &ManagedCluster {
        self.clusters
            .iter()
            .find(|c| c.name() == name)
            .unwrap_or_else(|| panic!("no managed cluster {name}"))
    }

    /// The hub's ManagedCluster objects.
    pub fn managed_clusters(&self) -> Vec<Value> {
        let text = self.kubectl_ok(&["get", "managedclusters", "-o", "json"]);
        let list: Value = serde_json::from_str(&text).expect("ManagedCluster list JSON");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Wait until the hub reports every managed cluster joined and
    /// available, with its region claim.
    pub fn wait_clusters_available(&self) {
        wait_for(
            "the hub to report every managed cluster joined and available",
            Duration::from_secs(180),
            || {
                self.check_components();
                let clusters = self.managed_clusters();
                let ready = MANAGED_CLUSTERS.iter().all(|spec| {
                    clusters.iter().any(|c| {
                        c["metadata"]["name"] == spec.name
                            && condition_true(c, "ManagedClusterJoined")
                            && available(c)
                            && claim(c, CLAIM_REGION) == Some(spec.region)
                    })
                });
                ready.then_some(())
            },
        );
    }

    /// The process id of hub component `name` (`ocm-placement-controller`,
    /// `ocm-registration-controller`, `ocm-work-manager`,
    /// `kube-controller-manager`), for measuring it.
    pub fn component_pid(&self, name: &str) -> Option<u32> {
        self.components.pid(name)
    }

    /// Panics with the log's tail when a hub component or a running agent
    /// has exited.
    pub fn check_components(&self) {
        self.components.check();
        for cluster in &self.clusters {
            cluster.check_agents();
        }
    }

    /// placement-sync against the hub and `opa`, loading policies from
    /// `policy_namespace`, replicating the ManagedClusters and deciding the
    /// Placements that opt in, with `extra` flags; as the sidecar's identity,
    /// with the chart's RBAC and the hub permissions docs/ocm.md names. The
    /// one start the OCM tests and `testbed up --ocm` share.
    pub fn start_placement_sync(
        &self,
        opa: &OpaServer,
        policy_namespace: &str,
        extra: &[&str],
    ) -> SidecarProcess {
        let mut args = decider_args(policy_namespace);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        SidecarProcess::start_as(&self.hub, Identity::Sidecar, opa, &args)
    }

    /// The delivery guard: the webhook against `opa` and the policies of
    /// `policy_namespace`, registered with the hub for ManifestWorks and
    /// ManifestWorkReplicaSets as configuration `name` (removed with it).
    /// The one start the OCM tests and `testbed up --ocm` share.
    pub fn start_delivery_guard(
        &self,
        opa: &OpaServer,
        policy_namespace: &str,
        name: &str,
    ) -> DeliveryGuard {
        DeliveryGuard::start(&self.hub, opa, policy_namespace, name)
    }

    /// Where the logs are, and the state of the ManagedClusters, for a
    /// failing test.
    pub fn diagnostics(&self) -> String {
        let clusters = self.kubectl(&["get", "managedclusters", "--show-labels"]);
        let mut text = String::from_utf8_lossy(&clusters.stdout).into_owned();
        text.push_str(&format!(
            "(hub logs in {}; agents in {})\n",
            self.hub.dir().display(),
            self.clusters
                .iter()
                .map(|c| format!("{}: {}", c.name(), c.dir().display()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        text
    }
}

/// Whether an object's condition `type_` is `True`.
pub fn condition_true(object: &Value, type_: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == type_ && c["status"] == "True")
}

/// Whether the hub reports a ManagedCluster available
/// (`ManagedClusterConditionAvailable=True`).
pub fn available(cluster: &Value) -> bool {
    condition_true(cluster, "ManagedClusterConditionAvailable")
}

/// The value of a ManagedCluster's claim `name` (`status.clusterClaims`).
pub fn claim<'a>(cluster: &'a Value, name: &str) -> Option<&'a str> {
    cluster["status"]["clusterClaims"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)?["value"]
        .as_str()
}
