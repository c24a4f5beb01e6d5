//! A real Karmada federation: Karmada's control plane (etcd, kube-apiserver
//! with the aggregation layer, karmada-aggregated-apiserver, karmada-webhook,
//! karmada-controller-manager, karmada-scheduler) and three member clusters
//! registered in Push mode:
//!
//! | member | what it is | region | `placement-policy.io/pci-compliance-level` |
//! |---|---|---|---|
//! | `member-eu-1` | the single-node [`Cluster`](crate::Cluster): its pods run | europe-west1 | 2 |
//! | `member-eu-2` | etcd + kube-apiserver, one Node object | europe-west2 | 3 |
//! | `member-us-1` | etcd + kube-apiserver, one Node object | us-central1 | 3 |
//!
//! Karmada's binaries, CRDs and manifests come from `scripts/testbed
//! karmada-assets` (built from `../shared/peers/karmada`) or
//! `PLACEMENT_KARMADA_BIN`. The Karmada API server is a [`ControlPlane`]
//! (`Deref`): its kubeconfigs, clients, kubectl and helpers such as
//! `register_webhook` work as on a plain one.
//!
//! Workloads for `member-eu-1` use [`WORKLOAD_IMAGE`]: no registry is
//! reachable, so it is the sandbox (`pause`) image under a plain name,
//! imported into the node's containerd; it runs, does nothing and never exits.

mod control_plane;
mod members;
pub mod scenario;
mod works;

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::{ControlPlane, Identity, OpaServer, SidecarProcess, repo_root, wait_for};

pub use control_plane::COMPONENT_QPS;
pub use members::{Member, MemberKind, MemberSpec, PCI_LABEL, WORKLOAD_IMAGE, cluster_ready};

use control_plane::Components;

/// The flags of placement-sync as Karmada's scheduler: Karmada's Clusters
/// replicated, the policies of `policy_namespace`, bindings scheduled. The
/// templates are the users' objects: their bindings are scheduled, their
/// annotations left alone (remediating those needs the webhook registered
/// with Karmada's API server).
pub fn scheduler_args(policy_namespace: &str) -> Vec<String> {
    vec![
        format!("--replicate-cluster={KARMADA_CLUSTERS}"),
        format!("--policy-namespace={policy_namespace}"),
        "--schedule-karmada-bindings".to_owned(),
        "--remediation=off".to_owned(),
    ]
}

/// The flags of placement-sync as Karmada's guardrail: Karmada's Clusters
/// replicated, the policies of `policy_namespace`, every binding not handed to
/// placement-policy kept within the clusters the policy allows.
pub fn guardrail_args(policy_namespace: &str) -> Vec<String> {
    vec![
        format!("--replicate-cluster={KARMADA_CLUSTERS}"),
        format!("--policy-namespace={policy_namespace}"),
        "--guard-karmada-bindings".to_owned(),
        "--remediation=off".to_owned(),
    ]
}

/// What the webhook is registered for in Karmada's API server as the
/// guardrail: workload templates (denied when the policy cannot place them)
/// and ResourceBindings (narrowed), and the status updates of both (which
/// keep the stored annotations and a binding's placement), as the chart's.
pub fn guardrail_rules() -> serde_json::Value {
    serde_json::json!([
        {
            "apiGroups": ["apps"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["replicasets", "deployments", "replicasets/status", "deployments/status"],
            "scope": "Namespaced"
        },
        {
            "apiGroups": ["work.karmada.io"],
            "apiVersions": ["v1alpha2"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["resourcebindings", "resourcebindings/status"],
            "scope": "Namespaced"
        }
    ])
}

/// The match conditions of the guardrail's webhook, as the chart's: objects
/// being deleted are not sent, nor status updates that leave annotations
/// alone (Karmada's binding status controller writes every binding's status
/// several times).
pub fn guardrail_match_conditions() -> serde_json::Value {
    serde_json::json!([
        {"name": "not-being-deleted", "expression": "!has(object.metadata.deletionTimestamp)"},
        crate::control_plane::status_only_when_it_changes_annotations(),
        {"name": "binding-changes-what-is-decided", "expression": BINDING_CHANGES_WHAT_IS_DECIDED},
    ])
}

/// The chart's condition that keeps out the binding updates the guardrail
/// admits unevaluated (placement, template and record kept: karmada-scheduler
/// writing its result, Karmada's bookkeeping).
const BINDING_CHANGES_WHAT_IS_DECIDED: &str = "request.resource.group != 'work.karmada.io' || request.operation != 'UPDATE' || \
    !has(oldObject.metadata.annotations) || \
    !('placement-policy.io/allowed-clusters' in oldObject.metadata.annotations) || \
    !has(object.metadata.annotations) || \
    !('placement-policy.io/allowed-clusters' in object.metadata.annotations) || \
    object.metadata.annotations['placement-policy.io/allowed-clusters'] != \
    oldObject.metadata.annotations['placement-policy.io/allowed-clusters'] || \
    has(object.spec.placement) != has(oldObject.spec.placement) || \
    (has(object.spec.placement) && object.spec.placement != oldObject.spec.placement) || \
    object.spec.resource != oldObject.spec.resource";

/// The last hop in Karmada's API server, validated by the webhook at `url`
/// (its `/validate`) once every mutation is done, as the chart's
/// `<release>-karmada-delivery` configuration: Works in the execution
/// namespaces (`karmada-es-<member>`) and the bindings of the namespaces
/// `bindings` selects (a namespaceSelector; ClusterResourceBindings too when
/// `cluster_bindings`). A bed shared by several contenders scopes the Works
/// to the bindings of one set of namespaces with `works_of`: the Works
/// Karmada writes for the bindings of the namespaces whose names start with
/// it (by Karmada's annotation `resourcebinding.karmada.io/namespace`; the
/// chart checks every Work).
pub fn delivery_configuration(
    name: &str,
    url: &str,
    ca_pem: &str,
    bindings: serde_json::Value,
    cluster_bindings: bool,
    works_of: Option<&str>,
) -> serde_json::Value {
    let mut binding_rules = vec![serde_json::json!({
        "apiGroups": ["work.karmada.io"],
        "apiVersions": ["v1alpha2"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["resourcebindings"],
        "scope": "Namespaced"
    })];
    if cluster_bindings {
        binding_rules.push(serde_json::json!({
            "apiGroups": ["work.karmada.io"],
            "apiVersions": ["v1alpha2"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["clusterresourcebindings"],
            "scope": "Cluster"
        }));
    }
    let webhook = |webhook: &str, rules: serde_json::Value| {
        serde_json::json!({
            "name": webhook,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": url, "caBundle": placement_certs::ca_bundle(ca_pem)},
            "rules": rules,
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": 10,
            "failurePolicy": "Fail",
            "matchConditions": [{
                "name": "not-being-deleted",
                "expression": "!has(object.metadata.deletionTimestamp)"
            }, {
                "name": "changes-the-spec",
                "expression": "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) || object.spec != oldObject.spec"
            }]
        })
    };
    let mut works = webhook(
        "works.delivery.placement-policy.io",
        serde_json::json!([{
            "apiGroups": ["work.karmada.io"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["works"],
            "scope": "Namespaced"
        }]),
    );
    let conditions = works["matchConditions"].as_array_mut().expect("a list");
    conditions.push(serde_json::json!({
        "name": "in-an-execution-namespace",
        "expression": "request.namespace.startsWith('karmada-es-')"
    }));
    if let Some(prefix) = works_of {
        const KEY: &str = "resourcebinding.karmada.io/namespace";
        conditions.push(serde_json::json!({
            "name": "of-these-bindings",
            "expression": format!(
                "has(object.metadata.annotations) && '{KEY}' in object.metadata.annotations && object.metadata.annotations['{KEY}'].startsWith('{prefix}')"
            )
        }));
    }
    let mut bindings_webhook = webhook(
        "bindings.delivery.placement-policy.io",
        serde_json::Value::Array(binding_rules),
    );
    bindings_webhook["namespaceSelector"] = bindings;
    bindings_webhook["matchConditions"]
        .as_array_mut()
        .expect("a list")
        .push(serde_json::json!({
            "name": "may-add-a-member",
            "expression": MAY_ADD_A_MEMBER
        }));
    serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [works, bindings_webhook]
    })
}

/// The chart's condition on a binding's delivery check: a binding that
/// delivers to no member adds none, nor does an update that keeps its
/// members and its template (a new version of the same template is the
/// same).
const MAY_ADD_A_MEMBER: &str = "((has(object.spec.clusters) && size(object.spec.clusters) > 0) || \
    (has(object.spec.requiredBy) && size(object.spec.requiredBy) > 0)) && \
    (request.operation != 'UPDATE' || \
    [object.spec.resource.apiVersion, object.spec.resource.kind, object.spec.resource.name] != \
    [oldObject.spec.resource.apiVersion, oldObject.spec.resource.kind, oldObject.spec.resource.name] || \
    (has(object.spec.resource.namespace) ? object.spec.resource.namespace : '') != \
    (has(oldObject.spec.resource.namespace) ? oldObject.spec.resource.namespace : '') || \
    (has(object.spec.resource.uid) ? object.spec.resource.uid : '') != \
    (has(oldObject.spec.resource.uid) ? oldObject.spec.resource.uid : '') || \
    (has(object.spec.clusters) ? object.spec.clusters : []) != \
    (has(oldObject.spec.clusters) ? oldObject.spec.clusters : []) || \
    (has(object.spec.requiredBy) ? object.spec.requiredBy : []) != \
    (has(oldObject.spec.requiredBy) ? oldObject.spec.requiredBy : []))";

/// The members, as registered with Karmada.
pub const MEMBERS: [MemberSpec; 3] = [
    MemberSpec {
        name: "member-eu-1",
        region: "europe-west1",
        pci_level: "2",
        kind: MemberKind::Node,
    },
    MemberSpec {
        name: "member-eu-2",
        region: "europe-west2",
        pci_level: "3",
        kind: MemberKind::Plain {
            cpu: "8",
            memory: "32Gi",
        },
    },
    MemberSpec {
        name: "member-us-1",
        region: "us-central1",
        pci_level: "3",
        kind: MemberKind::Plain {
            cpu: "16",
            memory: "64Gi",
        },
    },
];

/// The light members of a bed of `count` members (none for three): named
/// `member-004` on, over six regions (three in the EU, two in the US, one in
/// Asia) and PCI levels 1 to 4 in turn, so every combination of region and
/// level has members. Their names are leaked (`MemberSpec` holds `'static`
/// names): once per bed.
pub fn light_members(count: usize) -> Vec<MemberSpec> {
    const REGIONS: [&str; 6] = [
        "europe-west1",
        "us-central1",
        "europe-west3",
        "us-east1",
        "europe-north1",
        "asia-east1",
    ];
    const PCI_LEVELS: [&str; 4] = ["1", "2", "3", "4"];
    (MEMBERS.len()..count)
        .map(|i| MemberSpec {
            name: Box::leak(format!("member-{:03}", i + 1).into_boxed_str()),
            region: REGIONS[i % REGIONS.len()],
            pci_level: PCI_LEVELS[(i / REGIONS.len()) % PCI_LEVELS.len()],
            kind: MemberKind::Light,
        })
        .collect()
}

/// The type placement-sync replicates Karmada's clusters from (into the same
/// engine path, `kubernetes/clusters`, as our own Cluster CRD).
pub const KARMADA_CLUSTERS: &str = "cluster.karmada.io/v1alpha1/clusters";

/// Folder holding Karmada's four binaries with `crds/` and `deploy/` of the
/// same snapshot: `PLACEMENT_KARMADA_BIN`, else `scripts/testbed
/// karmada-assets`. Panics with the reason when neither can provide it.
pub fn karmada_assets() -> &'static Path {
    static ASSETS: OnceLock<PathBuf> = OnceLock::new();
    ASSETS.get_or_init(|| {
        let dir = match std::env::var("PLACEMENT_KARMADA_BIN") {
            Ok(dir) => PathBuf::from(dir),
            Err(_) => {
                let output = std::process::Command::new(repo_root().join("scripts/testbed"))
                    .arg("karmada-assets")
                    .stderr(std::process::Stdio::inherit())
                    .output()
                    .expect("run scripts/testbed karmada-assets");
                assert!(
                    output.status.code() != Some(3),
                    "the Karmada tests need Karmada: PLACEMENT_KARMADA_BIN is not set and its \
                     source is absent (../shared/peers/karmada, or $PLACEMENT_KARMADA_SRC); \
                     run without them (`--skip karmada_`), as scripts/test does there"
                );
                assert!(
                    output.status.success(),
                    "scripts/testbed karmada-assets failed (exit {:?})",
                    output.status.code()
                );
                PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
            }
        };
        for needed in [
            "karmada-controller-manager",
            "karmada-scheduler",
            "karmada-webhook",
            "karmada-aggregated-apiserver",
            "crds",
            "deploy/webhook-configuration.yaml",
            "deploy/karmada-aggregated-apiserver-apiservice.yaml",
        ] {
            assert!(
                dir.join(needed).exists(),
                "{} has no {needed}: rebuild it with scripts/testbed karmada-assets",
                dir.display()
            );
        }
        dir
    })
}

/// A member that joined after the federation started ([`Karmada::join`]).
pub struct Joined<'a> {
    karmada: &'a Karmada,
    member: Member,
}

impl Deref for Joined<'_> {
    type Target = Member;

    fn deref(&self) -> &Member {
        &self.member
    }
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        let name = format!("clusters.cluster.karmada.io/{}", self.member.name());
        self.karmada.kubectl(&["delete", &name, "--timeout=60s"]);
    }
}

/// A running Karmada federation. Every process ends with it (or with the test
/// process).
pub struct Karmada {
    /// Stopped first: the controllers, before what they talk to.
    components: Components,
    members: Vec<Member>,
    plane: ControlPlane,
}

impl Deref for Karmada {
    type Target = ControlPlane;

    /// The Karmada API server.
    fn deref(&self) -> &ControlPlane {
        &self.plane
    }
}

impl Karmada {
    /// One federation shared by the tests of a test binary (each test uses its
    /// own namespaces). Started on first use; it ends with the test process.
    pub fn shared() -> &'static Karmada {
        static SHARED: OnceLock<Result<Karmada, String>> = OnceLock::new();
        crate::shared(&SHARED, "Karmada federation", Karmada::start)
    }

    /// Start Karmada's control plane and the three members side by side,
    /// register the members and wait until Karmada reports every one Ready
    /// with its resource summary.
    pub fn start() -> Karmada {
        Karmada::start_with(MEMBERS.len())
    }

    /// [`Karmada::start`] with `count` members: the three of [`MEMBERS`] and
    /// `count - 3` light ones ([`light_members`]) sharing one API server.
    /// Members that share an API server would fight over the objects Karmada
    /// applies to them, so a bed with light members runs Karmada's controller
    /// manager without its `execution` and `workStatus` controllers: Works
    /// are made, scheduled and guarded as anywhere, but never applied
    /// (scenario 8 of the benchmarks measures their execution on three real
    /// members).
    pub fn start_with(count: usize) -> Karmada {
        assert!(
            count >= MEMBERS.len(),
            "a Karmada bed has at least the {} members of MEMBERS",
            MEMBERS.len()
        );
        crate::install_crypto();
        let assets = karmada_assets();
        let light = light_members(count);
        let execution = light.is_empty();
        let (plane, components, mut members, host) = std::thread::scope(|scope| {
            let members: Vec<_> = MEMBERS
                .iter()
                .map(|spec| scope.spawn(move || Member::start(*spec)))
                .collect();
            let host = (!light.is_empty()).then(|| scope.spawn(members::start_light_host));
            let plane = control_plane::start_apiserver();
            let components = control_plane::start_components(&plane, assets, execution);
            fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
                handle
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            }
            let members: Vec<Member> = members.into_iter().map(join).collect();
            let host = host.map(join);
            (plane, components, members, host)
        });
        if let Some(host) = host {
            members.extend(
                light
                    .into_iter()
                    .map(|spec| Member::light(spec, host.clone())),
            );
        }
        let karmada = Karmada {
            components,
            members,
            plane,
        };
        // One apply for every member: a hundred kubectl runs take half a minute.
        let documents = karmada
            .members
            .iter()
            .flat_map(Member::registration)
            .collect();
        crate::kubectl::apply_documents(&karmada.karmada_kubeconfig(), documents);
        karmada.wait_members_ready();
        karmada
    }

    /// The Karmada API server (also reachable through `Deref`).
    pub fn plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// The administrator's kubeconfig of the Karmada API server.
    pub fn karmada_kubeconfig(&self) -> PathBuf {
        self.plane.kubeconfig(Identity::Admin)
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The member named `name` (one of [`MEMBERS`], or a light one).
    pub fn member(&self, name: &str) -> &Member {
        self.members
            .iter()
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("no member {name}"))
    }

    /// Karmada's `Cluster` objects, by name.
    pub fn clusters(&self) -> Vec<serde_json::Value> {
        let text = self.kubectl_ok(&["get", "clusters.cluster.karmada.io", "-o", "json"]);
        let list: serde_json::Value = serde_json::from_str(&text).expect("cluster list JSON");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Wait until Karmada reports every member `Ready=True` with a filled
    /// `status.resourceSummary`.
    pub fn wait_members_ready(&self) {
        wait_for(
            "Karmada to report every member Ready",
            Duration::from_secs(180 + 2 * self.members.len() as u64),
            || {
                self.components.check();
                let clusters = self.clusters();
                let ready = self.members.iter().all(|member| {
                    clusters.iter().any(|c| {
                        c["metadata"]["name"] == member.name()
                            && cluster_ready(c)
                            && c["status"]["resourceSummary"]["allocatable"]
                                .as_object()
                                .is_some_and(|a| a.contains_key("cpu"))
                    })
                });
                ready.then_some(())
            },
        );
    }

    /// The process id of Karmada component `name` (`karmada-scheduler`,
    /// `karmada-controller-manager`, ...), for measuring it.
    pub fn component_pid(&self, name: &str) -> Option<u32> {
        self.components.pid(name)
    }

    /// Panics with the log's tail when a Karmada component has exited.
    pub fn check_components(&self) {
        self.components.check();
    }

    /// placement-sync against the Karmada API server and `opa`, loading
    /// policies from `policy_namespace` and replicating Karmada's Clusters,
    /// with `extra` flags. The one start the Karmada tests and `testbed up
    /// --karmada` share: the scheduler's flags belong here.
    // It runs as the administrator until the chart grants the sidecar's
    // service account Karmada's resources.
    pub fn start_placement_sync(
        &self,
        opa: &OpaServer,
        policy_namespace: &str,
        extra: &[&str],
    ) -> SidecarProcess {
        let mut args = scheduler_args(policy_namespace);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        SidecarProcess::start_as(&self.plane, Identity::Admin, opa, &args)
    }

    /// placement-sync as the guardrail against the Karmada API server and
    /// `opa` ([`guardrail_args`]), with `extra` flags.
    pub fn start_guardrail_sync(
        &self,
        opa: &OpaServer,
        policy_namespace: &str,
        extra: &[&str],
    ) -> SidecarProcess {
        let mut args = guardrail_args(policy_namespace);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        SidecarProcess::start_as(&self.plane, Identity::Admin, opa, &args)
    }

    /// Register the webhook at `url` (its `/mutate`, trusting `ca_pem`) with
    /// Karmada's API server as the guardrail, for every namespace but
    /// Karmada's and the system's: workload templates, ResourceBindings and
    /// ClusterResourceBindings narrowed; and its `/validate` for the last
    /// hop ([`delivery_configuration`]) (`scripts/testbed up --karmada`).
    pub fn register_guardrail_webhook(&self, url: &str, ca_pem: &str) {
        let mut rules = guardrail_rules();
        if let Some(rules) = rules.as_array_mut() {
            rules.push(serde_json::json!({
                "apiGroups": ["work.karmada.io"],
                "apiVersions": ["v1alpha2"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["clusterresourcebindings"],
                "scope": "Cluster"
            }));
        }
        let configuration = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "placement-policy-guardrail"},
            "webhooks": [{
                "name": "placement.placement-policy.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": url, "caBundle": placement_certs::ca_bundle(ca_pem)},
                "rules": rules,
                "namespaceSelector": {"matchExpressions": [{
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", "kube-public", "kube-node-lease",
                               "karmada-system", "karmada-cluster", crate::POLICY_NAMESPACE]
                }]},
                "matchConditions": guardrail_match_conditions(),
                "sideEffects": "NoneOnDryRun",
                "timeoutSeconds": 10,
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never"
            }]
        });
        let delivery = delivery_configuration(
            "placement-policy-delivery",
            &url.replace("/mutate", "/validate"),
            ca_pem,
            serde_json::json!({"matchExpressions": [{
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "kube-public", "kube-node-lease",
                           "karmada-system", "karmada-cluster", crate::POLICY_NAMESPACE]
            }]}),
            true,
            None,
        );
        crate::kubectl::apply_documents(&self.karmada_kubeconfig(), vec![configuration, delivery]);
    }

    /// A member joining the federation now: a plain API server (one Node of
    /// `spec`'s capacity) registered as `spec` says, Ready before this
    /// returns. It leaves (its Cluster deleted) and stops when dropped.
    pub fn join(&self, spec: MemberSpec) -> Joined<'_> {
        let member = Member::start(spec);
        member.register(&self.plane);
        wait_for(
            &format!("Karmada to report {} Ready", spec.name),
            Duration::from_secs(120),
            || {
                self.clusters()
                    .iter()
                    .any(|c| c["metadata"]["name"] == spec.name && cluster_ready(c))
                    .then_some(())
            },
        );
        Joined {
            karmada: self,
            member,
        }
    }

    /// Where the logs are, and the state of the Clusters, for a failing test.
    pub fn diagnostics(&self) -> String {
        let clusters = self.kubectl(&["get", "clusters.cluster.karmada.io", "-o", "wide"]);
        let mut text = String::from_utf8_lossy(&clusters.stdout).into_owned();
        text.push_str(&format!(
            "(Karmada logs in {}; members in {})\n",
            self.plane.dir().display(),
            self.members
                .iter()
                .map(|m| format!("{}: {}", m.name(), m.dir().display()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        text
    }
}
