//! OCM's managed clusters: each a [`Member`] server (the single-node cluster
//! or a plain API server) with its ClusterClaims and the klusterlet's two
//! agents run as processes, as the klusterlet runs them in pods: the
//! registration agent (joins the hub through a CSR, renews the cluster's
//! lease, reports its claims and resources) and the work agent (applies the
//! ManifestWorks of the cluster's namespace on the hub).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::json;

use super::{CLAIM_REGION, JURISDICTION_LABEL, REGION_LABEL};
use crate::karmada::{Member, MemberSpec, PCI_LABEL};
use crate::process::{Process, free_port};
use crate::{Cluster, ControlPlane, Identity, scratch_dir};

/// The agents' namespace on a managed cluster.
pub(super) const AGENT_NAMESPACE: &str = "open-cluster-management-agent";

/// The klusterlet's agents of one cluster; `None` while stopped.
#[derive(Default)]
struct Agents {
    registration: Option<Process>,
    work: Option<Process>,
}

/// One managed cluster.
pub struct ManagedCluster {
    /// Stopped before the server.
    agents: Mutex<Agents>,
    member: Member,
    /// The agents' logs and the hub kubeconfig the registration agent writes.
    dir: PathBuf,
    hub_bootstrap: PathBuf,
    assets: PathBuf,
}

impl ManagedCluster {
    /// Start the cluster's server, install what the agents need (their
    /// namespace, the managed cluster's CRDs) and its ClusterClaims.
    pub(super) fn start(spec: MemberSpec, assets: &Path, hub_bootstrap: &Path) -> ManagedCluster {
        let member = Member::start(spec);
        let dir = scratch_dir(&format!("ocm-agents-{}", spec.name));
        let managed = ManagedCluster {
            agents: Mutex::new(Agents::default()),
            member,
            dir,
            hub_bootstrap: hub_bootstrap.to_owned(),
            assets: assets.to_owned(),
        };
        let kubeconfig = managed.kubeconfig();
        crate::kubectl::kubectl_ok(&kubeconfig, &["create", "namespace", AGENT_NAMESPACE]);
        super::hub::apply_crds_with(&kubeconfig, &super::hub::managed_crds(assets));
        let claim = json!({
            "apiVersion": "cluster.open-cluster-management.io/v1alpha1",
            "kind": "ClusterClaim",
            "metadata": {"name": CLAIM_REGION},
            "spec": {"value": spec.region},
        });
        crate::kubectl::apply_documents(&kubeconfig, vec![claim]);
        managed
    }

    pub fn name(&self) -> &'static str {
        self.member.name()
    }

    pub fn spec(&self) -> MemberSpec {
        self.member.spec()
    }

    /// The labels the test bed gives its ManagedCluster on the hub: region,
    /// jurisdiction and PCI level, as the Karmada members are labelled.
    pub fn labels(&self) -> serde_json::Value {
        let spec = self.spec();
        let jurisdiction = if spec.region.starts_with("europe-") {
            "eu"
        } else {
            "non-eu"
        };
        json!({
            REGION_LABEL: spec.region,
            JURISDICTION_LABEL: jurisdiction,
            PCI_LABEL: spec.pci_level,
        })
    }

    /// The single-node cluster behind `ocm-eu-1` (its pods, containerd).
    pub fn cluster(&self) -> Option<&Cluster> {
        self.member.cluster()
    }

    pub fn server_url(&self) -> String {
        self.member.server_url()
    }

    /// The administrator's kubeconfig of the cluster's own API server.
    pub fn kubeconfig(&self) -> PathBuf {
        self.member.kubeconfig()
    }

    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        self.member.kubectl(args)
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        self.member.kubectl_ok(args)
    }

    /// Where the agents' logs are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The folder the registration agent keeps its hub kubeconfig in.
    fn hub_kubeconfig_dir(&self) -> PathBuf {
        self.dir.join("hub-kubeconfig")
    }

    /// The hub kubeconfig the registration agent wrote once the hub signed
    /// its CSR (its client certificate), if it has.
    pub(super) fn joined(&self) -> bool {
        self.hub_kubeconfig_dir().join("kubeconfig").exists()
    }

    fn spawn(&self, name: &str, program: &str, args: Vec<String>) -> Process {
        let log = self.dir.join(format!("{name}.log"));
        // A restarted agent gets a log of its own.
        let log = (1..)
            .map(|n| match n {
                1 => log.clone(),
                n => self.dir.join(format!("{name}-{n}.log")),
            })
            .find(|path| !path.exists())
            .expect("a free log name");
        Process::spawn(name, &self.assets.join(program), &args, &log)
            .unwrap_or_else(|e| panic!("start {name} of {}: {e}", self.name()))
    }

    /// Start the registration agent: it creates the ManagedCluster and a CSR
    /// on the hub with the bootstrap kubeconfig, and once the hub accepted it,
    /// keeps the cluster's lease, status and claims.
    pub(super) fn start_registration_agent(&self) {
        let args = vec![
            "agent".into(),
            format!("--cluster-name={}", self.name()),
            format!("--bootstrap-kubeconfig={}", self.hub_bootstrap.display()),
            format!("--kubeconfig={}", self.kubeconfig().display()),
            format!(
                "--hub-kubeconfig-dir={}",
                self.hub_kubeconfig_dir().display()
            ),
            format!("--namespace={AGENT_NAMESPACE}"),
            format!("--spoke-external-server-urls={}", self.server_url()),
            "--disable-leader-election".into(),
            format!("--listen=127.0.0.1:{}", free_port()),
            "--v=2".into(),
        ];
        let process = self.spawn("registration-agent", "ocm-registration", args);
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .registration = Some(process);
    }

    /// Start the work agent (after the cluster joined: it reads the hub
    /// kubeconfig the registration agent wrote).
    pub(super) fn start_work_agent(&self) {
        let hub = self.hub_kubeconfig_dir();
        let args = vec![
            "agent".into(),
            format!("--spoke-cluster-name={}", self.name()),
            format!("--hub-kubeconfig-dir={}", hub.display()),
            format!(
                "--workload-source-config={}",
                hub.join("kubeconfig").display()
            ),
            format!("--kubeconfig={}", self.kubeconfig().display()),
            format!("--namespace={AGENT_NAMESPACE}"),
            "--disable-leader-election".into(),
            format!("--listen=127.0.0.1:{}", free_port()),
            "--v=2".into(),
        ];
        let process = self.spawn("work-agent", "ocm-work", args);
        self.agents.lock().unwrap_or_else(|p| p.into_inner()).work = Some(process);
    }

    /// Stop both agents, as a crash of the klusterlet would: the cluster's
    /// lease is no longer renewed. [`ManagedCluster::start_agents`] brings
    /// them back (with the hub kubeconfig they have, no new CSR).
    pub fn stop_agents(&self) {
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        for agent in [agents.registration.take(), agents.work.take()]
            .into_iter()
            .flatten()
        {
            let mut agent = agent;
            agent.kill();
        }
    }

    /// Start the agents again after [`ManagedCluster::stop_agents`].
    pub fn start_agents(&self) {
        assert!(self.joined(), "{} never joined the hub", self.name());
        self.start_registration_agent();
        self.start_work_agent();
    }

    /// Panic with the log's tail when an agent that should run has exited.
    pub(super) fn check_agents(&self) {
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        let Agents { registration, work } = &mut *agents;
        for agent in [registration, work].into_iter().flatten() {
            assert!(
                !agent.has_exited(),
                "{} of {} exited:\n{}",
                agent.name(),
                self.name(),
                agent.log_tail(40)
            );
        }
    }

    /// The process id of the cluster's agent `name` (`registration-agent`,
    /// `work-agent`), for measuring it.
    pub fn agent_pid(&self, name: &str) -> Option<u32> {
        let agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        [&agents.registration, &agents.work]
            .into_iter()
            .flatten()
            .find(|p| p.name() == name)?
            .pid()
    }
}

/// Approve the registration CSRs of `names` on the hub and accept their
/// ManagedClusters (`spec.hubAcceptsClient`), as `clusteradm accept` does;
/// done when every one of them has its hub kubeconfig.
pub(super) fn accept(hub: &ControlPlane, clusters: &[ManagedCluster]) {
    let pending = |c: &&ManagedCluster| !c.joined();
    crate::wait_for(
        "the managed clusters' CSRs to be approved and signed",
        std::time::Duration::from_secs(180),
        || {
            for cluster in clusters.iter().filter(pending) {
                cluster.check_agents();
                approve_csrs(hub, cluster.name());
                // Fails until the agent has created it.
                let _ = hub.kubectl(&[
                    "patch",
                    "managedcluster",
                    cluster.name(),
                    "--type=merge",
                    "-p",
                    r#"{"spec":{"hubAcceptsClient":true}}"#,
                ]);
            }
            clusters.iter().all(|c| c.joined()).then_some(())
        },
    );
}

/// `kubectl certificate approve` of the cluster's CSRs not approved yet.
fn approve_csrs(hub: &ControlPlane, cluster: &str) {
    let selector = format!("open-cluster-management.io/cluster-name={cluster}");
    let list = hub.kubectl_ok(&["get", "csr", "-l", &selector, "-o", "json"]);
    let list: serde_json::Value = serde_json::from_str(&list).expect("CSR list JSON");
    for csr in list["items"].as_array().into_iter().flatten() {
        let decided = csr["status"]["conditions"]
            .as_array()
            .is_some_and(|conditions| !conditions.is_empty());
        if !decided && let Some(name) = csr["metadata"]["name"].as_str() {
            hub.kubectl_ok(&["certificate", "approve", name]);
        }
    }
}

/// The hub kubeconfig a registration agent bootstraps with: the hub's
/// administrator (the bootstrap identity `clusteradm join` is given).
pub(super) fn bootstrap_kubeconfig(hub: &ControlPlane) -> PathBuf {
    hub.kubeconfig(Identity::Admin)
}
