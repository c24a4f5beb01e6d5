//! Command line flags (with environment fallbacks) and the validated settings.
//! The flags come in groups by job, each checking its own values: what goes
//! into the engine and how ([`engine`]), what the replica that writes
//! placements does ([`writers`]), and the blast-radius guard ([`guard`]).

pub(crate) mod engine;
pub(crate) mod guard;
#[cfg(test)]
mod tests;
mod values;
pub(crate) mod writers;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use policy_client::DEFAULT_DECISION_PATH;
use policy_client::configmaps::ConfigMapSelection;
use policy_client::opa::Token;

use crate::error::SyncError;
use crate::gvr::Gvr;
use crate::policies::owners::PackageOwners;
use crate::scope::Scope;
use engine::{BundleArgs, ConfigMapArgs, EngineSyncArgs, OpaArgs, ReplicateSpec, ReplicationArgs};
use guard::{BlastRadius, PartitionRule};
use values::{namespaced_name, normalize_path};
use writers::{
    KarmadaArgs, KarmadaSettings, LeaderArgs, LeaderSettings, OcmArgs, OcmDecider,
    OwnershipKeySource, RemediationArgs, RemediationMode,
};

/// Flags of `placement-sync`, in groups by job; each group checks its own
/// values. Every flag also reads an environment variable.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "placement-sync",
    version,
    about = "Replicates Kubernetes objects and policy ConfigMaps into the policy engine and remediates placement"
)]
pub struct Args {
    #[command(flatten)]
    replication: ReplicationArgs,

    #[command(flatten)]
    opa: OpaArgs,

    /// kubeconfig file; without it the in-cluster config or `KUBECONFIG` is used.
    #[arg(long, env = "PLACEMENT_SYNC_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    #[command(flatten)]
    configmaps: ConfigMapArgs,

    /// Log level: `error`, `warn`, `info` or `debug` (RUST_LOG, when set, wins).
    #[arg(long, env = "PLACEMENT_SYNC_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Decision path the remediator queries.
    #[arg(long, env = "PLACEMENT_SYNC_DECISION", default_value = DEFAULT_DECISION_PATH)]
    decision: String,

    #[command(flatten)]
    remediation: RemediationArgs,

    /// ConfigMap (`NAMESPACE/NAME`) where the last good policy set is kept,
    /// and read back before the policy ConfigMaps are loaded: a sidecar
    /// restarted while a policy ConfigMap is in error loads that set, not
    /// nothing. Needs `get` and `patch` on it.
    #[arg(long, env = "PLACEMENT_SYNC_LAST_GOOD_POLICIES")]
    last_good_policies: Option<String>,

    /// Only read the last good policy set (`--last-good-policies`), never
    /// write it: another sidecar (the remediator's) keeps it, so that this
    /// one's account cannot put a policy set in force. Needs only `get`.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_LAST_GOOD_POLICIES_READ_ONLY",
        requires = "last_good_policies"
    )]
    last_good_policies_read_only: bool,

    #[command(flatten)]
    karmada: KarmadaArgs,

    #[command(flatten)]
    ocm: OcmArgs,

    #[command(flatten)]
    leader: LeaderArgs,

    /// Plain-HTTP address for `/metrics`, `/healthz` (also `/health`) and
    /// `/readyz`. kube-mgmt's `--health-endpoint` is the same flag.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_LISTEN",
        alias = "health-endpoint",
        default_value = "0.0.0.0:8182"
    )]
    listen: SocketAddr,

    /// IPv6 callers of `--listen` count as one peer per prefix of this many
    /// bits (each peer holds at most a quarter of the connections): 64 by
    /// default; 128 counts each address apart, for clusters whose pods
    /// share a /64 with the scraper or the kubelet.
    #[arg(long, env = "PLACEMENT_SYNC_IPV6_PEER_PREFIX", default_value_t = placement_endpoint::Peers::DEFAULT_IPV6_PREFIX, value_parser = clap::value_parser!(u8).range(1..=128))]
    ipv6_peer_prefix: u8,

    #[command(flatten)]
    bundles: BundleArgs,

    #[command(flatten)]
    engine_sync: EngineSyncArgs,
}

/// Validated settings of the sidecar.
#[derive(Debug, Clone)]
pub struct Settings {
    pub(crate) replicate: Vec<ReplicateSpec>,
    pub(crate) replicate_path: String,
    pub(crate) ignore_namespaces: BTreeSet<String>,
    /// `--replicate-only-read-types`.
    pub(crate) replicate_only_read_types: bool,
    pub(crate) opa_url: reqwest::Url,
    pub(crate) opa_token: Option<Token>,
    pub(crate) opa_ca_pem: Option<Vec<u8>>,
    pub(crate) opa_timeout: Duration,
    /// `--decision-cache-memory`.
    pub(crate) decision_cache_memory: usize,
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Which ConfigMaps are policies and which are data.
    pub(crate) configmaps: ConfigMapSelection,
    /// Which packages only the owners' namespaces write.
    pub(crate) package_owners: PackageOwners,
    pub(crate) opa_allow_insecure: bool,
    pub(crate) decision: String,
    pub(crate) remediation: RemediationMode,
    pub(crate) remediate: Vec<Gvr>,
    /// Which Karmada bindings are scheduled and which guarded.
    pub(crate) karmada: KarmadaSettings,
    /// The OCM decider, when it decides Placements.
    pub(crate) ocm_decider: Option<OcmDecider>,
    pub(crate) remediation_rate: f64,
    pub(crate) remediation_debounce: Duration,
    /// What the remediator acts on.
    pub(crate) scope: Scope,
    /// When a pass is held until confirmed.
    pub(crate) blast_radius: BlastRadius,
    /// When cluster health changes look like a partition.
    pub(crate) partition: PartitionRule,
    /// Where the ownership record's keys come from.
    pub(crate) ownership_keys: OwnershipKeySource,
    /// Where the last good policy set is kept (`namespace`, `name`).
    pub(crate) last_good_policies: Option<(String, String)>,
    /// It is only read here.
    pub(crate) last_good_policies_read_only: bool,
    /// `None` when leader election is off (this replica always remediates).
    pub(crate) leader: Option<LeaderSettings>,
    pub(crate) listen: SocketAddr,
    /// How the callers of `listen` are grouped into peers.
    pub(crate) peers: placement_endpoint::Peers,
    pub(crate) engine_check_interval: Duration,
    pub(crate) sentinel_path: String,
    pub(crate) workers: usize,
}

impl Settings {
    /// Validate the flags and read the files they name. The checks run in a
    /// fixed order, so that of several mistakes the same one is named first.
    pub fn from_args(args: Args) -> Result<Self, SyncError> {
        let replicate = args.replication.specs()?;
        let replicate_path = args.replication.path()?;
        let sentinel_path = args.engine_sync.sentinel_path(&replicate_path)?;
        let decision = normalize_path(&args.decision)
            .ok_or_else(|| SyncError::Config("--decision must not be empty".to_owned()))?;
        let opa_url = args.opa.url()?;
        args.bundles.refuse()?;
        let opa_token = args.opa.token()?;
        let opa_ca_pem = args.opa.ca_pem()?;
        let configmaps = args.configmaps.selection()?;
        let package_owners = args
            .configmaps
            .owners(&configmaps, &decision)?
            .with_documents([replicate_path.clone(), sentinel_path.clone()]);
        let remediation_rate = args.remediation.rate()?;
        let workers = args.engine_sync.workers()?;
        let engine_check_interval = args.engine_sync.check_interval()?;
        let remediation = args.remediation.mode(&configmaps)?;
        let karmada = args.karmada.settings()?;
        let ocm_decider = args.ocm.decider(&args.karmada.scheduler_name)?;
        let writes = writes_placements(remediation, &karmada, ocm_decider.as_ref());
        let leader = args
            .leader
            .settings(writes, configmaps.policy_namespace.as_deref())?;
        let ownership_keys = args.remediation.ownership.keys()?;
        let last_good_policies = args
            .last_good_policies
            .as_deref()
            .map(|text| namespaced_name("--last-good-policies", text))
            .transpose()?;
        let blast_radius = args.remediation.guard.blast_radius()?;
        let partition = args.remediation.guard.partition()?;
        let scope = args.remediation.scope.scope()?;
        let peers = placement_endpoint::Peers::new(args.ipv6_peer_prefix)
            .map_err(|e| SyncError::Config(format!("--ipv6-peer-prefix: {e}")))?;
        Ok(Settings {
            replicate,
            replicate_path,
            ignore_namespaces: args.replication.ignore_namespaces(),
            replicate_only_read_types: args.replication.replicate_only_read_types,
            opa_url,
            opa_token,
            opa_ca_pem,
            opa_timeout: args.opa.opa_timeout,
            decision_cache_memory: args.opa.decision_cache_memory,
            kubeconfig: args.kubeconfig,
            configmaps,
            package_owners,
            opa_allow_insecure: args.opa.opa_allow_insecure,
            decision,
            remediation,
            remediate: args.remediation.remediate,
            karmada,
            ocm_decider,
            remediation_rate,
            remediation_debounce: args.remediation.remediation_debounce,
            scope,
            blast_radius,
            partition,
            ownership_keys,
            last_good_policies,
            last_good_policies_read_only: args.last_good_policies_read_only,
            leader,
            listen: args.listen,
            peers,
            engine_check_interval,
            sentinel_path,
            workers,
        })
    }

    /// Whether this sidecar writes placements, and so elects one replica to
    /// do it (see [`writes_placements`]).
    pub(crate) fn writes_placements(&self) -> bool {
        writes_placements(self.remediation, &self.karmada, self.ocm_decider.as_ref())
    }

    /// `--replicate-path` as its segments (`kubernetes/objects`:
    /// `kubernetes`, `objects`): where replicated objects are in the
    /// engine's data.
    pub(crate) fn replicate_root(&self) -> Vec<String> {
        self.replicate_path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The engine's top-level data documents that hold replicated data
    /// (the first segment of `--replicate-path`), never packages of policy.
    pub(crate) fn data_roots(&self) -> Vec<String> {
        self.replicate_path
            .split('/')
            .next()
            .map(str::to_owned)
            .into_iter()
            .collect()
    }
}

/// Whoever writes placements elects one replica to do it: remediation, the
/// Karmada scheduler or guardrail, or the OCM decider (with remediation off
/// too).
fn writes_placements(
    remediation: RemediationMode,
    karmada: &KarmadaSettings,
    ocm_decider: Option<&OcmDecider>,
) -> bool {
    remediation != RemediationMode::Off || karmada.any() || ocm_decider.is_some()
}
