//! Command line flags (with environment fallbacks) and the validated settings.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use policy_client::DEFAULT_DECISION_PATH;
use policy_client::configmaps::{
    ConfigMapFlags, ConfigMapFlagsEnv, ConfigMapSelection, DEFAULT_POLICY_NAMESPACE,
};
use policy_client::opa::Token;
use policy_client::ownership_keys::OwnershipKeys;

use crate::error::SyncError;
use crate::reconcile::KarmadaSettings;
use crate::reconcile::blast::BlastRadius;
use crate::reconcile::health::PartitionRule;
use crate::reconcile::scope::Scope;
use crate::replication::gvr::Gvr;

/// Default engine path below which replicated objects are stored.
const DEFAULT_REPLICATE_PATH: &str = "kubernetes";
/// Default engine document the sidecar uses to notice engine restarts.
const DEFAULT_SENTINEL_PATH: &str = "system/placement-sync/sentinel";
/// Default Lease name for remediation leader election.
const DEFAULT_LEASE_NAME: &str = "placement-policy-remediator";
/// Default `--scheduler-name`: the `spec.schedulerName` a PropagationPolicy sets
/// to hand its bindings to placement-policy.
const DEFAULT_SCHEDULER_NAME: &str = "placement-policy";

/// What the remediator does with objects whose placement is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum RemediationMode {
    /// PATCH stale objects to the current decision.
    Auto,
    /// Emit an Event per stale object and count them; patch nothing.
    Report,
    /// No remediation at all (no leader election either).
    Off,
}

/// Where the keys of the ownership record come from.
#[derive(Debug, Clone)]
pub(crate) enum OwnershipKeySource {
    /// A Secret the webhook fills.
    Secret {
        namespace: String,
        name: String,
    },
    Fixed(OwnershipKeys),
    /// A key of this process only (records nobody else verifies).
    Ephemeral,
}

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

    #[command(flatten)]
    bundles: BundleArgs,

    #[command(flatten)]
    engine_sync: EngineSyncArgs,
}

/// Which objects are replicated into the engine, and where.
#[derive(Debug, Clone, clap::Args)]
struct ReplicationArgs {
    /// Namespaced resource type to replicate, `[group/]version/resource`
    /// (repeatable, or comma-separated).
    #[arg(long, env = "PLACEMENT_SYNC_REPLICATE", value_delimiter = ',')]
    replicate: Vec<Gvr>,

    /// Cluster-scoped resource type to replicate, `[group/]version/resource`
    /// (repeatable, or comma-separated).
    #[arg(long, env = "PLACEMENT_SYNC_REPLICATE_CLUSTER", value_delimiter = ',')]
    replicate_cluster: Vec<Gvr>,

    /// Engine data path under which replicated objects are written.
    #[arg(long, env = "PLACEMENT_SYNC_REPLICATE_PATH", default_value = DEFAULT_REPLICATE_PATH)]
    replicate_path: String,

    /// Namespaces whose objects are not replicated (comma-separated).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REPLICATE_IGNORE_NAMESPACES",
        value_delimiter = ','
    )]
    replicate_ignore_namespaces: Vec<String>,

    /// Write only the replicated types the loaded policies read (found in
    /// their source, e.g. `data.kubernetes.clusters`); the others are watched
    /// but kept out of the engine. A policy that starts reading a type is
    /// loaded only after that type is written.
    #[arg(long, env = "PLACEMENT_SYNC_REPLICATE_ONLY_READ_TYPES")]
    replicate_only_read_types: bool,
}

impl ReplicationArgs {
    /// Every type to replicate, each plural once: the plural names the
    /// type's engine path, so two types with one plural would share it.
    fn specs(&self) -> Result<Vec<ReplicateSpec>, SyncError> {
        let mut specs = Vec::new();
        let mut seen = BTreeSet::new();
        let namespaced = self.replicate.iter().map(|g| (g, ReplicaScope::Namespaced));
        let cluster = self
            .replicate_cluster
            .iter()
            .map(|g| (g, ReplicaScope::Cluster));
        for (gvr, scope) in namespaced.chain(cluster) {
            if !seen.insert(gvr.resource.clone()) {
                return Err(SyncError::Config(format!(
                    "resource {:?} is replicated twice; each plural name may appear once because it names the engine path",
                    gvr.resource
                )));
            }
            specs.push(ReplicateSpec {
                gvr: gvr.clone(),
                scope,
            });
        }
        Ok(specs)
    }

    fn path(&self) -> Result<String, SyncError> {
        normalize_path(&self.replicate_path)
            .ok_or_else(|| SyncError::Config("--replicate-path must not be empty".to_owned()))
    }

    fn ignore_namespaces(&self) -> BTreeSet<String> {
        trimmed_list(&self.replicate_ignore_namespaces)
    }
}

/// How to reach OPA.
#[derive(Debug, Clone, clap::Args)]
struct OpaArgs {
    /// Base URL of OPA (a trailing `/v1`, as kube-mgmt takes it, is accepted).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_OPA_URL",
        default_value = "http://127.0.0.1:8181"
    )]
    opa_url: String,

    /// File holding the bearer token for OPA (never logged). kube-mgmt's
    /// `--opa-auth-token-file` is the same flag.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_OPA_TOKEN_FILE",
        alias = "opa-auth-token-file"
    )]
    opa_token_file: Option<PathBuf>,

    /// The bearer token for OPA itself (kube-mgmt's flag; prefer the file,
    /// which keeps it out of the process list). Never logged.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_OPA_AUTH_TOKEN",
        conflicts_with = "opa_token_file",
        hide_env_values = true
    )]
    opa_auth_token: Option<String>,

    /// Accept any certificate from an https OPA (kube-mgmt's flag; for tests).
    #[arg(long, env = "PLACEMENT_SYNC_OPA_ALLOW_INSECURE")]
    opa_allow_insecure: bool,

    /// PEM file of a CA to trust for an https OPA.
    #[arg(long, env = "PLACEMENT_SYNC_OPA_CA_FILE")]
    opa_ca_file: Option<PathBuf>,

    /// Limit for one request to OPA, e.g. `5s`.
    #[arg(long, env = "PLACEMENT_SYNC_OPA_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    opa_timeout: Duration,
}

impl OpaArgs {
    fn url(&self) -> Result<reqwest::Url, SyncError> {
        parse_opa_url(&self.opa_url)
    }

    /// The token from its file (read now, so a missing file fails at start),
    /// else the one given inline.
    fn token(&self) -> Result<Option<Token>, SyncError> {
        let Some(path) = &self.opa_token_file else {
            return Ok(self
                .opa_auth_token
                .as_deref()
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(Token::new));
        };
        let raw = std::fs::read_to_string(path).map_err(|e| {
            SyncError::Config(format!(
                "cannot read --opa-token-file {}: {e}",
                path.display()
            ))
        })?;
        let token = raw.trim();
        if token.is_empty() {
            return Err(SyncError::Config(format!(
                "--opa-token-file {} is empty",
                path.display()
            )));
        }
        Ok(Some(Token::new(token)))
    }

    fn ca_pem(&self) -> Result<Option<Vec<u8>>, SyncError> {
        self.opa_ca_file
            .as_ref()
            .map(|path| {
                std::fs::read(path).map_err(|e| {
                    SyncError::Config(format!("cannot read --opa-ca-file {}: {e}", path.display()))
                })
            })
            .transpose()
    }
}

/// Which ConfigMaps hold policies and which data: kube-mgmt's flags, with
/// kube-mgmt's meaning (the webhook's too, but for `--enable-data`).
#[derive(Debug, Clone, clap::Args)]
struct ConfigMapArgs {
    #[command(flatten)]
    selection: ConfigMapFlags<SyncEnv>,

    /// Load JSON/YAML data from ConfigMaps.
    #[arg(long, env = "PLACEMENT_SYNC_ENABLE_DATA", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    enable_data: bool,
}

/// The sidecar's environment variables of the ConfigMap selection flags.
#[derive(Debug, Clone)]
struct SyncEnv;

impl ConfigMapFlagsEnv for SyncEnv {
    const POLICY_NAMESPACE: &'static str = "PLACEMENT_SYNC_POLICY_NAMESPACE";
    const NAMESPACES: &'static str = "PLACEMENT_SYNC_NAMESPACES";
    const ENABLE_POLICIES: &'static str = "PLACEMENT_SYNC_ENABLE_POLICIES";
    const POLICY_LABEL: &'static str = "PLACEMENT_SYNC_POLICY_LABEL";
    const POLICY_VALUE: &'static str = "PLACEMENT_SYNC_POLICY_VALUE";
    const DATA_LABEL: &'static str = "PLACEMENT_SYNC_DATA_LABEL";
    const DATA_VALUE: &'static str = "PLACEMENT_SYNC_DATA_VALUE";
}

impl ConfigMapArgs {
    fn selection(&self) -> Result<ConfigMapSelection, SyncError> {
        self.selection
            .selection(self.enable_data)
            .map_err(SyncError::Config)
    }
}

/// What the remediator does, to which workloads, and how fast.
#[derive(Debug, Clone, clap::Args)]
struct RemediationArgs {
    /// Remediation mode [default: `auto` with a policy namespace; `off` in
    /// kube-mgmt's mode (`--namespaces` without `--policy-namespace`), whose
    /// deployments have neither the webhook nor the RBAC to re-place workloads].
    #[arg(long, env = "PLACEMENT_SYNC_REMEDIATION", value_enum)]
    remediation: Option<RemediationMode>,

    /// Workload type the remediator keeps placed, `[group/]version/resource`
    /// (repeatable, or comma-separated).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REMEDIATE",
        value_delimiter = ',',
        default_value = "apps/v1/replicasets,apps/v1/deployments"
    )]
    remediate: Vec<Gvr>,

    #[command(flatten)]
    scope: ScopeArgs,

    #[command(flatten)]
    guard: GuardArgs,

    #[command(flatten)]
    ownership: OwnershipArgs,

    /// Maximum remediation patches per second (0 = unlimited).
    #[arg(long, env = "PLACEMENT_SYNC_REMEDIATION_RATE", default_value_t = 200.0)]
    remediation_rate: f64,

    /// Quiet time that coalesces remediation triggers, e.g. `500ms`.
    #[arg(long, env = "PLACEMENT_SYNC_REMEDIATION_DEBOUNCE", default_value = "500ms", value_parser = humantime::parse_duration)]
    remediation_debounce: Duration,
}

impl RemediationArgs {
    fn rate(&self) -> Result<f64, SyncError> {
        if self.remediation_rate >= 0.0 && self.remediation_rate.is_finite() {
            Ok(self.remediation_rate)
        } else {
            Err(SyncError::Config(
                "--remediation-rate must be a non-negative number".to_owned(),
            ))
        }
    }

    /// The mode; without `--remediation`, off in kube-mgmt's mode (no policy
    /// namespace), whose deployments cannot re-place workloads.
    fn mode(&self, selection: &ConfigMapSelection) -> Result<RemediationMode, SyncError> {
        let mode = self
            .remediation
            .unwrap_or(if selection.policy_namespace.is_some() {
                RemediationMode::Auto
            } else {
                RemediationMode::Off
            });
        if mode != RemediationMode::Off && self.remediate.is_empty() {
            return Err(SyncError::Config(
                "--remediate names no workload type; use --remediation=off to disable remediation"
                    .to_owned(),
            ));
        }
        Ok(mode)
    }
}

/// Which workloads the remediator acts on: those the webhook configuration
/// sends to the webhook.
#[derive(Debug, Clone, clap::Args)]
struct ScopeArgs {
    /// Namespaces whose workloads are never remediated, comma-separated: the
    /// webhook configuration's excluded namespaces.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_SCOPE_EXCLUDE_NAMESPACES",
        value_delimiter = ','
    )]
    scope_exclude_namespaces: Vec<String>,

    /// Only workloads in namespaces matching this label selector are remediated
    /// (the webhook configuration's namespaceSelector).
    #[arg(long, env = "PLACEMENT_SYNC_SCOPE_NAMESPACE_SELECTOR")]
    scope_namespace_selector: Option<String>,

    /// Only workloads matching this label selector are remediated (the webhook
    /// configuration's objectSelector).
    #[arg(long, env = "PLACEMENT_SYNC_SCOPE_OBJECT_SELECTOR")]
    scope_object_selector: Option<String>,
}

impl ScopeArgs {
    fn scope(&self) -> Result<Scope, SyncError> {
        let given = |s: &Option<String>| s.clone().filter(|s| !s.trim().is_empty());
        let object_selector = given(&self.scope_object_selector);
        // Matched here too when the watch is shared with a replicator: a
        // selector that cannot be read fails now.
        if let Some(selector) = &object_selector {
            crate::reconcile::scope::parse_label_selector(selector)
                .map_err(|e| SyncError::Config(format!("--scope-object-selector: {e}")))?;
        }
        Ok(Scope {
            excluded_namespaces: trimmed_list(&self.scope_exclude_namespaces),
            namespace_selector: given(&self.scope_namespace_selector),
            object_selector,
        })
    }
}

/// The blast-radius guard: when a pass is held until confirmed.
#[derive(Debug, Clone, clap::Args)]
struct GuardArgs {
    /// Hold a remediation pass (report it, patch nothing) that would rewrite or
    /// remove the placement of more than this share of the placed workloads,
    /// until an administrator confirms it (1 never holds).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REMEDIATION_HOLD_SHARE",
        default_value_t = 0.5
    )]
    remediation_hold_share: f64,

    /// Passes changing at most this many placements are never held.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REMEDIATION_HOLD_MIN",
        default_value_t = 10
    )]
    remediation_hold_min: usize,

    /// Cluster health changes re-place without confirmation, unless at least
    /// this share of the clusters (and at least 3) turned unhealthy within
    /// --remediation-partition-window: that looks like a partition of the
    /// control plane, and is held like an edit (kube-controller-manager's
    /// --unhealthy-zone-threshold).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REMEDIATION_PARTITION_THRESHOLD",
        default_value_t = 0.55
    )]
    remediation_partition_threshold: f64,

    /// The window of --remediation-partition-threshold, e.g. `60s`.
    #[arg(long, env = "PLACEMENT_SYNC_REMEDIATION_PARTITION_WINDOW", default_value = "60s", value_parser = humantime::parse_duration)]
    remediation_partition_window: Duration,
}

impl GuardArgs {
    fn blast_radius(&self) -> Result<BlastRadius, SyncError> {
        if !(0.0..=1.0).contains(&self.remediation_hold_share) {
            return Err(SyncError::Config(format!(
                "--remediation-hold-share must be between 0 and 1, got {}",
                self.remediation_hold_share
            )));
        }
        Ok(BlastRadius {
            share: self.remediation_hold_share,
            min: self.remediation_hold_min,
        })
    }

    fn partition(&self) -> Result<PartitionRule, SyncError> {
        if !(0.0..=1.0).contains(&self.remediation_partition_threshold) {
            return Err(SyncError::Config(format!(
                "--remediation-partition-threshold must be between 0 and 1, got {}",
                self.remediation_partition_threshold
            )));
        }
        Ok(PartitionRule {
            threshold: self.remediation_partition_threshold,
            window: self.remediation_partition_window,
        })
    }
}

/// The keys that sign the ownership record, shared with the webhook.
#[derive(Debug, Clone, clap::Args)]
struct OwnershipArgs {
    /// Secret (`NAMESPACE/NAME`) holding the keys that sign the ownership record,
    /// shared with the webhook (which creates them); read and followed.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_OWNERSHIP_SECRET",
        conflicts_with = "ownership_key_file"
    )]
    ownership_secret: Option<String>,

    /// File holding those keys (one base64 key per line, the signing key first).
    #[arg(long, env = "PLACEMENT_SYNC_OWNERSHIP_KEY_FILE")]
    ownership_key_file: Option<PathBuf>,
}

impl OwnershipArgs {
    fn keys(&self) -> Result<OwnershipKeySource, SyncError> {
        if let Some(secret) = &self.ownership_secret {
            let (namespace, name) = namespaced_name("--ownership-secret", secret)?;
            return Ok(OwnershipKeySource::Secret { namespace, name });
        }
        let Some(path) = &self.ownership_key_file else {
            return Ok(OwnershipKeySource::Ephemeral);
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            SyncError::Config(format!(
                "cannot read --ownership-key-file {}: {e}",
                path.display()
            ))
        })?;
        let keys = OwnershipKeys::from_text(&text).map_err(|e| {
            SyncError::Config(format!("--ownership-key-file {}: {e}", path.display()))
        })?;
        Ok(OwnershipKeySource::Fixed(keys))
    }
}

/// Scheduling and guarding Karmada bindings.
#[derive(Debug, Clone, clap::Args)]
struct KarmadaArgs {
    /// Schedule Karmada ResourceBindings and ClusterResourceBindings whose
    /// `spec.schedulerName` is `--scheduler-name`: the policy decides their
    /// clusters within what their placement selects (karmada-scheduler
    /// ignores them). Replicate Karmada's Clusters with
    /// `--replicate-cluster=cluster.karmada.io/v1alpha1/clusters`.
    #[arg(long, env = "PLACEMENT_SYNC_SCHEDULE_KARMADA_BINDINGS")]
    schedule_karmada_bindings: bool,

    /// Guardrail: keep the placement of every other binding (karmada-
    /// scheduler's) within the clusters the policy allows its template,
    /// admitting it again when the answer changes. The webhook, registered
    /// with Karmada's API server for bindings, narrows every binding write.
    #[arg(long, env = "PLACEMENT_SYNC_GUARD_KARMADA_BINDINGS")]
    guard_karmada_bindings: bool,

    /// The scheduler name of the bindings this sidecar schedules (the
    /// guardrail leaves them alone), and the
    /// `placement-policy.io/scheduler-name` of the OCM Placements it decides.
    #[arg(long, env = "PLACEMENT_SYNC_SCHEDULER_NAME", default_value = DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
}

impl KarmadaArgs {
    /// Which bindings are scheduled and which guarded.
    fn settings(&self) -> Result<KarmadaSettings, SyncError> {
        let settings = KarmadaSettings {
            scheduler_name: self.scheduler_name.trim().to_owned(),
            schedule: self.schedule_karmada_bindings,
            guard: self.guard_karmada_bindings,
        };
        if settings.any() && settings.scheduler_name.is_empty() {
            return Err(SyncError::Config(
                "--scheduler-name must not be empty".to_owned(),
            ));
        }
        Ok(settings)
    }
}

/// Deciding Open Cluster Management Placements.
#[derive(Debug, Clone, clap::Args)]
struct OcmArgs {
    /// Decide the Open Cluster Management Placements (on the hub this
    /// sidecar talks to) that opt in: annotated
    /// `cluster.open-cluster-management.io/experimental-scheduling-disable:
    /// "true"` (OCM's scheduler skips them) and
    /// `placement-policy.io/scheduler-name: <--scheduler-name>`. The policy
    /// decides their PlacementDecisions. Replicate the ManagedClusters with
    /// `--replicate-cluster=cluster.open-cluster-management.io/v1/managedclusters`.
    #[arg(long, env = "PLACEMENT_SYNC_DECIDE_OCM_PLACEMENTS")]
    decide_ocm_placements: bool,

    /// Also publish each decision of a Placement as a SIG-Multicluster
    /// PlacementDecision (`multicluster.x-k8s.io/v1alpha1`, KEP-5313; its
    /// CRD must be installed on the hub).
    #[arg(long, env = "PLACEMENT_SYNC_SIG_PLACEMENT_DECISIONS")]
    sig_placement_decisions: bool,
}

impl OcmArgs {
    /// The decider, when it decides Placements, named `scheduler_name`.
    fn decider(&self, scheduler_name: &str) -> Result<Option<OcmDecider>, SyncError> {
        match (self.decide_ocm_placements, scheduler_name.trim()) {
            (false, _) if self.sig_placement_decisions => Err(SyncError::Config(
                "--sig-placement-decisions needs --decide-ocm-placements".to_owned(),
            )),
            (false, _) => Ok(None),
            (true, "") => Err(SyncError::Config(
                "--scheduler-name must not be empty".to_owned(),
            )),
            (true, name) => Ok(Some(OcmDecider {
                scheduler_name: name.to_owned(),
                sig_placement_decisions: self.sig_placement_decisions,
            })),
        }
    }
}

/// The OCM decider's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OcmDecider {
    /// What the Placements it decides name in
    /// `placement-policy.io/scheduler-name`.
    pub(crate) scheduler_name: String,
    /// Publish SIG-Multicluster PlacementDecisions too.
    pub(crate) sig_placement_decisions: bool,
}

/// Leader election of the replica that writes placements.
#[derive(Debug, Clone, clap::Args)]
struct LeaderArgs {
    /// Whether to elect a remediation leader through a Lease (turn off only for a
    /// single replica run outside a cluster).
    #[arg(long, env = "PLACEMENT_SYNC_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,

    /// Name of the Lease used for leader election.
    #[arg(long, env = "PLACEMENT_SYNC_LEASE_NAME", default_value = DEFAULT_LEASE_NAME)]
    lease_name: String,

    /// Namespace of the Lease (default: `POD_NAMESPACE`, else the policy namespace).
    #[arg(long, env = "PLACEMENT_SYNC_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,

    /// Leader election identity (default: `POD_NAME`, else the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// Lease duration, e.g. `15s`.
    #[arg(long, env = "PLACEMENT_SYNC_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
}

impl LeaderArgs {
    /// The election, when this replica `writes` placements and election is
    /// on; `None` otherwise (a lone replica always writes).
    fn settings(
        &self,
        writes: bool,
        policy_namespace: Option<&str>,
    ) -> Result<Option<LeaderSettings>, SyncError> {
        if !(self.leader_election && writes) {
            return Ok(None);
        }
        let lease_namespace = self
            .lease_namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .or_else(|| policy_namespace.map(str::to_owned))
            .unwrap_or_else(|| DEFAULT_POLICY_NAMESPACE.to_owned());
        let identity = self
            .identity
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(default_identity);
        if self.lease_duration < Duration::from_secs(3) {
            return Err(SyncError::Config(
                "--lease-duration must be at least 3s".to_owned(),
            ));
        }
        Ok(Some(LeaderSettings {
            lease_name: self.lease_name.clone(),
            lease_namespace,
            identity,
            lease_duration: self.lease_duration,
        }))
    }
}

/// kube-mgmt's replication driven by bundles, which placement-sync does not
/// do: its flags are refused with a message rather than ignored.
#[derive(Debug, Clone, clap::Args)]
struct BundleArgs {
    /// kube-mgmt's bundle-driven replication (`--opa-config`), which
    /// placement-sync does not do: refused with a message rather than ignored.
    #[arg(long, hide = true)]
    opa_config: Option<PathBuf>,

    /// kube-mgmt's decision analysed for that replication; refused likewise.
    #[arg(long, hide = true)]
    analysis_entrypoint: Option<String>,
}

impl BundleArgs {
    fn refuse(&self) -> Result<(), SyncError> {
        if self.opa_config.is_some() || self.analysis_entrypoint.is_some() {
            return Err(SyncError::Config(
                "--opa-config and --analysis-entrypoint (kube-mgmt's replication driven by bundles) are not supported; replicate types with --replicate and --replicate-cluster".to_owned(),
            ));
        }
        Ok(())
    }
}

/// Keeping the engine in sync: noticing its restarts, and how many writes
/// go to it at once.
#[derive(Debug, Clone, clap::Args)]
struct EngineSyncArgs {
    /// How often the engine is checked for a restart, e.g. `2s`.
    #[arg(long, env = "PLACEMENT_SYNC_ENGINE_CHECK_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    engine_check_interval: Duration,

    /// Engine data path of the sentinel document used to notice engine restarts.
    #[arg(long, env = "PLACEMENT_SYNC_SENTINEL_PATH", default_value = DEFAULT_SENTINEL_PATH)]
    sentinel_path: String,

    /// Engine writes in flight at once.
    #[arg(long, env = "PLACEMENT_SYNC_WORKERS", default_value_t = 16)]
    workers: usize,
}

impl EngineSyncArgs {
    /// The sentinel's path; never under the replicated data, which a full
    /// sync of a type replaces.
    fn sentinel_path(&self, replicate_path: &str) -> Result<String, SyncError> {
        let sentinel_path = normalize_path(&self.sentinel_path)
            .ok_or_else(|| SyncError::Config("--sentinel-path must not be empty".to_owned()))?;
        if sentinel_path == replicate_path
            || sentinel_path.starts_with(&format!("{replicate_path}/"))
        {
            return Err(SyncError::Config(
                "--sentinel-path must not lie under --replicate-path".to_owned(),
            ));
        }
        Ok(sentinel_path)
    }

    fn workers(&self) -> Result<usize, SyncError> {
        match self.workers {
            0 => Err(SyncError::Config("--workers must be at least 1".to_owned())),
            n => Ok(n),
        }
    }

    fn check_interval(&self) -> Result<Duration, SyncError> {
        if self.engine_check_interval.is_zero() {
            return Err(SyncError::Config(
                "--engine-check-interval must be positive".to_owned(),
            ));
        }
        Ok(self.engine_check_interval)
    }
}

/// Whether a replicated type is namespaced (`--replicate`) or cluster-scoped
/// (`--replicate-cluster`); it decides the engine path layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplicaScope {
    Namespaced,
    Cluster,
}

/// One `--replicate`/`--replicate-cluster` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplicateSpec {
    pub(crate) gvr: Gvr,
    pub(crate) scope: ReplicaScope,
}

/// Leader election parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaderSettings {
    pub(crate) lease_name: String,
    pub(crate) lease_namespace: String,
    pub(crate) identity: String,
    pub(crate) lease_duration: Duration,
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
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Which ConfigMaps are policies and which are data.
    pub(crate) configmaps: ConfigMapSelection,
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
        let remediation_rate = args.remediation.rate()?;
        let workers = args.engine_sync.workers()?;
        let engine_check_interval = args.engine_sync.check_interval()?;
        let remediation = args.remediation.mode(&configmaps)?;
        let karmada = args.karmada.settings()?;
        let ocm_decider = args.ocm.decider(&args.karmada.scheduler_name)?;
        // Whoever writes placements elects one replica to do it: remediation,
        // the Karmada scheduler or guardrail, or the OCM decider (with
        // remediation off too).
        let writes = remediation != RemediationMode::Off || karmada.any() || ocm_decider.is_some();
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
        Ok(Settings {
            replicate,
            replicate_path,
            ignore_namespaces: args.replication.ignore_namespaces(),
            replicate_only_read_types: args.replication.replicate_only_read_types,
            opa_url,
            opa_token,
            opa_ca_pem,
            opa_timeout: args.opa.opa_timeout,
            kubeconfig: args.kubeconfig,
            configmaps,
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
            engine_check_interval,
            sentinel_path,
            workers,
        })
    }
}

/// `NAMESPACE/NAME` of an object a flag names.
fn namespaced_name(flag: &str, text: &str) -> Result<(String, String), SyncError> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => Err(SyncError::Config(format!(
            "{flag} must be NAMESPACE/NAME, got {text:?}"
        ))),
    }
}

/// A comma-separated list's entries, trimmed, empty ones left out.
fn trimmed_list(items: &[String]) -> BTreeSet<String> {
    items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Trim slashes; `None` when nothing is left.
fn normalize_path(path: &str) -> Option<String> {
    let trimmed = path.trim().trim_matches('/');
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

/// The OPA base URL; kube-mgmt users pass `http://host:8181/v1`, which is accepted.
fn parse_opa_url(raw: &str) -> Result<reqwest::Url, SyncError> {
    let mut url = reqwest::Url::parse(raw.trim())
        .map_err(|e| SyncError::Config(format!("--opa-url {raw:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(SyncError::Config(format!(
            "--opa-url must be http or https, got {:?}",
            url.scheme()
        )));
    }
    let path = url.path().trim_end_matches('/').to_owned();
    if let Some(base) = path.strip_suffix("/v1") {
        url.set_path(if base.is_empty() { "/" } else { base });
    }
    Ok(url)
}

/// `POD_NAME` is read by clap; without it the host name stands in.
fn default_identity() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| format!("placement-sync-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["placement-sync"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap()
    }

    #[test]
    fn repeatable_and_comma_separated_types() {
        let a = args(&[
            "--replicate=apps/v1/replicasets",
            "--replicate",
            "v1/services,v1/pods",
            "--replicate-cluster=federation.example.io/v1/clusters",
            "--replicate-ignore-namespaces=kube-system, kube-public",
            "--leader-election=false",
        ]);
        let s = Settings::from_args(a).unwrap();
        let names: Vec<String> = s.replicate.iter().map(|r| r.gvr.to_string()).collect();
        assert_eq!(
            names,
            [
                "apps/v1/replicasets",
                "v1/services",
                "v1/pods",
                "federation.example.io/v1/clusters"
            ]
        );
        assert_eq!(s.replicate[3].scope, ReplicaScope::Cluster);
        assert_eq!(s.replicate[0].scope, ReplicaScope::Namespaced);
        assert_eq!(
            s.ignore_namespaces.iter().collect::<Vec<_>>(),
            ["kube-public", "kube-system"]
        );
        assert!(s.leader.is_none());
    }

    #[test]
    fn defaults() {
        let s = Settings::from_args(args(&["--identity=pod-a"])).unwrap();
        assert_eq!(s.replicate_path, "kubernetes");
        assert_eq!(
            s.configmaps.policy_namespace.as_deref(),
            Some(DEFAULT_POLICY_NAMESPACE)
        );
        assert!(s.configmaps.namespaces.is_empty());
        assert_eq!(s.decision, "io/k8s/federation/admission");
        assert_eq!(s.remediation, RemediationMode::Auto);
        assert_eq!(
            s.remediate,
            vec![
                Gvr::new("apps", "v1", "replicasets"),
                Gvr::new("apps", "v1", "deployments")
            ]
        );
        assert_eq!(s.remediation_debounce, Duration::from_millis(500));
        assert_eq!(
            s.partition,
            PartitionRule {
                threshold: 0.55,
                window: Duration::from_secs(60)
            }
        );
        let leader = s.leader.unwrap();
        assert_eq!(leader.identity, "pod-a");
        assert_eq!(leader.lease_name, DEFAULT_LEASE_NAME);
        assert_eq!(s.opa_url.as_str(), "http://127.0.0.1:8181/");
    }

    #[test]
    fn bad_values_are_named() {
        assert!(Args::try_parse_from(["x", "--replicate=ReplicaSet"]).is_err());
        assert!(Args::try_parse_from(["x", "--remediation=sometimes"]).is_err());
        let dup = Settings::from_args(args(&[
            "--replicate=apps/v1/replicasets",
            "--replicate=extensions/v1beta1/replicasets",
        ]))
        .unwrap_err();
        assert!(dup.to_string().contains("replicated twice"), "{dup}");
        let label = Settings::from_args(args(&["--policy-label=a=b=c"])).unwrap_err();
        assert!(label.to_string().contains("--policy-label"), "{label}");
        let bundles = Settings::from_args(args(&["--analysis-entrypoint=main/main"])).unwrap_err();
        assert!(bundles.to_string().contains("not supported"), "{bundles}");
        let token =
            Settings::from_args(args(&["--opa-token-file=/nonexistent/token"])).unwrap_err();
        assert!(token.to_string().contains("--opa-token-file"), "{token}");
        let rate = Settings::from_args(args(&["--remediation-rate=-1"])).unwrap_err();
        assert!(rate.to_string().contains("--remediation-rate"), "{rate}");
    }

    #[test]
    fn each_group_names_its_flag() {
        let error = |flags: &[&str]| Settings::from_args(args(flags)).unwrap_err().to_string();
        for (flags, message) in [
            (
                &["--sentinel-path=kubernetes/x"][..],
                "--sentinel-path must not lie under --replicate-path",
            ),
            (
                &["--replicate-path=/"],
                "--replicate-path must not be empty",
            ),
            (&["--decision=/"], "--decision must not be empty"),
            (&["--workers=0"], "--workers must be at least 1"),
            (
                &["--engine-check-interval=0s"],
                "--engine-check-interval must be positive",
            ),
            (
                &["--schedule-karmada-bindings", "--scheduler-name= "],
                "--scheduler-name must not be empty",
            ),
            (
                &["--decide-ocm-placements", "--scheduler-name= "],
                "--scheduler-name must not be empty",
            ),
            (
                &["--sig-placement-decisions"],
                "--sig-placement-decisions needs --decide-ocm-placements",
            ),
            (
                &["--identity=pod-a", "--lease-duration=1s"],
                "--lease-duration must be at least 3s",
            ),
            (
                &["--ownership-secret=nameonly"],
                "--ownership-secret must be NAMESPACE/NAME, got \"nameonly\"",
            ),
            (
                &["--last-good-policies=ns/"],
                "--last-good-policies must be NAMESPACE/NAME, got \"ns/\"",
            ),
            (
                &["--remediation-hold-share=1.5"],
                "--remediation-hold-share must be between 0 and 1, got 1.5",
            ),
            (
                &["--remediation-partition-threshold=-0.1"],
                "--remediation-partition-threshold must be between 0 and 1, got -0.1",
            ),
        ] {
            assert_eq!(
                error(flags),
                format!("configuration: {message}"),
                "{flags:?}"
            );
        }
        // The first mistake in a fixed order is the one named.
        assert_eq!(
            error(&["--workers=0", "--replicate-path=/"]),
            "configuration: --replicate-path must not be empty"
        );
    }

    #[test]
    fn opa_url_accepts_kube_mgmt_style() {
        assert_eq!(
            parse_opa_url("http://localhost:8181/v1").unwrap().as_str(),
            "http://localhost:8181/"
        );
        assert_eq!(
            parse_opa_url("https://opa.example:8443/proxy/v1/")
                .unwrap()
                .as_str(),
            "https://opa.example:8443/proxy"
        );
        assert!(parse_opa_url("ftp://x").is_err());
        assert!(parse_opa_url("not a url").is_err());
    }

    #[test]
    fn kube_mgmt_flags_mean_kube_mgmt_mode() {
        let s = Settings::from_args(args(&[
            "--opa-url=https://127.0.0.1:8181/v1",
            "--namespaces=default,team-a",
            "--enable-data=false",
            "--policy-label=qweqwe/policy",
            "--policy-value=111",
            "--opa-allow-insecure",
            "--health-endpoint=0.0.0.0:8182",
            "--log-level=debug",
        ]))
        .unwrap();
        assert_eq!(s.configmaps.policy_namespace, None);
        assert_eq!(s.configmaps.namespaces, ["default", "team-a"]);
        assert!(s.configmaps.enable_policies && !s.configmaps.enable_data);
        assert_eq!(s.configmaps.policy_label, "qweqwe/policy");
        assert_eq!(s.opa_url.as_str(), "https://127.0.0.1:8181/");
        assert!(s.opa_allow_insecure);
        assert_eq!(s.listen.to_string(), "0.0.0.0:8182");
        // No webhook, no RBAC for workloads: nothing to remediate, no Lease.
        assert_eq!(s.remediation, RemediationMode::Off);
        assert!(s.leader.is_none());
        let asked = Settings::from_args(args(&[
            "--namespaces=default",
            "--remediation=report",
            "--identity=pod-a",
        ]))
        .unwrap();
        assert_eq!(asked.remediation, RemediationMode::Report);
        assert_eq!(
            asked.leader.unwrap().lease_namespace,
            DEFAULT_POLICY_NAMESPACE
        );
    }

    #[test]
    fn a_binding_scheduler_elects_a_leader_with_remediation_off() {
        let s = Settings::from_args(args(&[
            "--remediation=off",
            "--schedule-karmada-bindings",
            "--identity=pod-a",
        ]))
        .unwrap();
        assert_eq!(s.remediation, RemediationMode::Off);
        assert!(s.karmada.schedule && !s.karmada.guard);
        assert_eq!(s.karmada.scheduler_name, "placement-policy");
        assert_eq!(s.leader.unwrap().identity, "pod-a");
        let guard = Settings::from_args(args(&[
            "--remediation=off",
            "--guard-karmada-bindings",
            "--identity=pod-a",
        ]))
        .unwrap();
        assert!(guard.karmada.guard && !guard.karmada.schedule);
        assert!(guard.leader.is_some(), "the guardrail writes too");
        let alone = Settings::from_args(args(&["--remediation=off", "--identity=pod-a"])).unwrap();
        assert!(alone.leader.is_none());
    }

    #[test]
    fn the_placement_decider_elects_a_leader_and_shares_the_scheduler_name() {
        let s = Settings::from_args(args(&[
            "--remediation=off",
            "--decide-ocm-placements",
            "--sig-placement-decisions",
            "--scheduler-name=rego",
            "--identity=pod-a",
        ]))
        .unwrap();
        assert_eq!(
            s.ocm_decider,
            Some(OcmDecider {
                scheduler_name: "rego".into(),
                sig_placement_decisions: true
            })
        );
        assert!(!s.karmada.any(), "deciding Placements schedules no binding");
        assert_eq!(s.leader.unwrap().identity, "pod-a");
    }
}
