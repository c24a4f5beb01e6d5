//! The flags of the replica that writes placements: remediation and the
//! workloads it acts on, the ownership record's keys, the Karmada scheduler
//! and guardrail, the OCM decider, and leader election.

use std::path::PathBuf;
use std::time::Duration;

use policy_client::configmaps::{ConfigMapSelection, DEFAULT_POLICY_NAMESPACE};
use policy_client::ownership_keys::OwnershipKeys;

use super::guard::GuardArgs;
use super::values::{namespaced_name, trimmed_list};
use crate::error::SyncError;
use crate::gvr::Gvr;
use crate::scope::Scope;

/// Default Lease name for remediation leader election.
pub(super) const DEFAULT_LEASE_NAME: &str = "placement-policy-remediator";
/// Default `--scheduler-name`: the `spec.schedulerName` a PropagationPolicy sets
/// to hand its bindings to placement-policy.
const DEFAULT_SCHEDULER_NAME: &str = "placement-policy";

/// What the remediator does with objects whose placement is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
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

/// Leader election parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaderSettings {
    pub(crate) lease_name: String,
    pub(crate) lease_namespace: String,
    pub(crate) identity: String,
    pub(crate) lease_duration: Duration,
}

/// What the remediator does, to which workloads, and how fast.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct RemediationArgs {
    /// Remediation mode [default: `auto` with a policy namespace; `off` in
    /// kube-mgmt's mode (`--namespaces` without `--policy-namespace`), whose
    /// deployments have neither the webhook nor the RBAC to re-place workloads].
    #[arg(long, env = "PLACEMENT_SYNC_REMEDIATION", value_enum)]
    pub(crate) remediation: Option<RemediationMode>,

    /// Workload type the remediator keeps placed, `[group/]version/resource`
    /// (repeatable, or comma-separated).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REMEDIATE",
        value_delimiter = ',',
        default_value = "apps/v1/replicasets,apps/v1/deployments"
    )]
    pub(crate) remediate: Vec<Gvr>,

    #[command(flatten)]
    pub(crate) scope: ScopeArgs,

    #[command(flatten)]
    pub(crate) guard: GuardArgs,

    #[command(flatten)]
    pub(crate) ownership: OwnershipArgs,

    /// Maximum remediation patches per second (0 = unlimited).
    #[arg(long, env = "PLACEMENT_SYNC_REMEDIATION_RATE", default_value_t = 200.0)]
    pub(crate) remediation_rate: f64,

    /// Quiet time that coalesces remediation triggers, e.g. `500ms`.
    #[arg(long, env = "PLACEMENT_SYNC_REMEDIATION_DEBOUNCE", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub(crate) remediation_debounce: Duration,
}

impl RemediationArgs {
    pub(super) fn rate(&self) -> Result<f64, SyncError> {
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
    pub(super) fn mode(
        &self,
        selection: &ConfigMapSelection,
    ) -> Result<RemediationMode, SyncError> {
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
pub(super) struct ScopeArgs {
    /// Namespaces whose workloads are never remediated, comma-separated: the
    /// webhook configuration's excluded namespaces.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_SCOPE_EXCLUDE_NAMESPACES",
        value_delimiter = ','
    )]
    pub(crate) scope_exclude_namespaces: Vec<String>,

    /// Only workloads in namespaces matching this label selector are remediated
    /// (the webhook configuration's namespaceSelector).
    #[arg(long, env = "PLACEMENT_SYNC_SCOPE_NAMESPACE_SELECTOR")]
    pub(crate) scope_namespace_selector: Option<String>,

    /// Only workloads matching this label selector are remediated (the webhook
    /// configuration's objectSelector).
    #[arg(long, env = "PLACEMENT_SYNC_SCOPE_OBJECT_SELECTOR")]
    pub(crate) scope_object_selector: Option<String>,
}

impl ScopeArgs {
    pub(super) fn scope(&self) -> Result<Scope, SyncError> {
        let given = |s: &Option<String>| s.clone().filter(|s| !s.trim().is_empty());
        let object_selector = given(&self.scope_object_selector);
        // Matched here too when the watch is shared with a replicator: a
        // selector that cannot be read fails now.
        if let Some(selector) = &object_selector {
            crate::scope::parse_label_selector(selector)
                .map_err(|e| SyncError::Config(format!("--scope-object-selector: {e}")))?;
        }
        Ok(Scope {
            excluded_namespaces: trimmed_list(&self.scope_exclude_namespaces),
            namespace_selector: given(&self.scope_namespace_selector),
            object_selector,
        })
    }
}

/// The keys that sign the ownership record, shared with the webhook.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct OwnershipArgs {
    /// Secret (`NAMESPACE/NAME`) holding the keys that sign the ownership record,
    /// shared with the webhook (which creates them); read and followed.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_OWNERSHIP_SECRET",
        conflicts_with = "ownership_key_file"
    )]
    pub(crate) ownership_secret: Option<String>,

    /// File holding those keys (one base64 key per line, the signing key first).
    #[arg(long, env = "PLACEMENT_SYNC_OWNERSHIP_KEY_FILE")]
    pub(crate) ownership_key_file: Option<PathBuf>,
}

impl OwnershipArgs {
    pub(super) fn keys(&self) -> Result<OwnershipKeySource, SyncError> {
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
pub(super) struct KarmadaArgs {
    /// Schedule Karmada ResourceBindings and ClusterResourceBindings whose
    /// `spec.schedulerName` is `--scheduler-name`: the policy decides their
    /// clusters within what their placement selects (karmada-scheduler
    /// ignores them). Replicate Karmada's Clusters with
    /// `--replicate-cluster=cluster.karmada.io/v1alpha1/clusters`.
    #[arg(long, env = "PLACEMENT_SYNC_SCHEDULE_KARMADA_BINDINGS")]
    pub(crate) schedule_karmada_bindings: bool,

    /// Guardrail: keep the placement of every other binding (karmada-
    /// scheduler's) within the clusters the policy allows its template,
    /// admitting it again when the answer changes. The webhook, registered
    /// with Karmada's API server for bindings, narrows every binding write.
    #[arg(long, env = "PLACEMENT_SYNC_GUARD_KARMADA_BINDINGS")]
    pub(crate) guard_karmada_bindings: bool,

    /// Guardrail: how long a guarded binding may still deliver to a member
    /// its narrowed placement no longer allows (karmada-scheduler moving the
    /// replicas) before placement-sync takes the member out of
    /// `spec.clusters` itself: karmada-scheduler writes nothing when it
    /// cannot satisfy the narrowed placement (a spread constraint, a
    /// division it cannot meet), which would leave the replicas there.
    #[arg(long, env = "PLACEMENT_SYNC_KARMADA_RESCHEDULE_GRACE", default_value = "15s", value_parser = humantime::parse_duration)]
    pub(crate) karmada_reschedule_grace: std::time::Duration,

    /// The scheduler name of the bindings this sidecar schedules (the
    /// guardrail leaves them alone), and the
    /// `placement-policy.io/scheduler-name` of the OCM Placements it decides.
    #[arg(long, env = "PLACEMENT_SYNC_SCHEDULER_NAME", default_value = DEFAULT_SCHEDULER_NAME)]
    pub(crate) scheduler_name: String,
}

impl KarmadaArgs {
    /// Which bindings are scheduled and which guarded.
    pub(super) fn settings(&self) -> Result<KarmadaSettings, SyncError> {
        let settings = KarmadaSettings {
            scheduler_name: self.scheduler_name.trim().to_owned(),
            schedule: self.schedule_karmada_bindings,
            guard: self.guard_karmada_bindings,
            reschedule_grace: self.karmada_reschedule_grace,
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
pub(super) struct OcmArgs {
    /// Decide the Open Cluster Management Placements (on the hub this
    /// sidecar talks to) that opt in: annotated
    /// `cluster.open-cluster-management.io/experimental-scheduling-disable:
    /// "true"` (OCM's scheduler skips them) and
    /// `placement-policy.io/scheduler-name: <--scheduler-name>`. The policy
    /// decides their PlacementDecisions. Replicate the ManagedClusters with
    /// `--replicate-cluster=cluster.open-cluster-management.io/v1/managedclusters`.
    #[arg(long, env = "PLACEMENT_SYNC_DECIDE_OCM_PLACEMENTS")]
    pub(crate) decide_ocm_placements: bool,

    /// Also publish each decision of a Placement as a SIG-Multicluster
    /// PlacementDecision (`multicluster.x-k8s.io/v1alpha1`, KEP-5313; its
    /// CRD must be installed on the hub).
    #[arg(long, env = "PLACEMENT_SYNC_SIG_PLACEMENT_DECISIONS")]
    pub(crate) sig_placement_decisions: bool,
}

impl OcmArgs {
    /// The decider, when it decides Placements, named `scheduler_name`.
    pub(super) fn decider(&self, scheduler_name: &str) -> Result<Option<OcmDecider>, SyncError> {
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
pub(super) struct LeaderArgs {
    /// Whether to elect a remediation leader through a Lease (turn off only for a
    /// single replica run outside a cluster).
    #[arg(long, env = "PLACEMENT_SYNC_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) leader_election: bool,

    /// Name of the Lease used for leader election.
    #[arg(long, env = "PLACEMENT_SYNC_LEASE_NAME", default_value = DEFAULT_LEASE_NAME)]
    pub(crate) lease_name: String,

    /// Namespace of the Lease (default: `POD_NAMESPACE`, else the policy namespace).
    #[arg(long, env = "PLACEMENT_SYNC_LEASE_NAMESPACE")]
    pub(crate) lease_namespace: Option<String>,

    /// Leader election identity (default: `POD_NAME`, else the host name).
    #[arg(long, env = "POD_NAME")]
    pub(crate) identity: Option<String>,

    /// Lease duration, e.g. `15s`.
    #[arg(long, env = "PLACEMENT_SYNC_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub(crate) lease_duration: Duration,
}

impl LeaderArgs {
    /// The election, when this replica `writes` placements and election is
    /// on; `None` otherwise (a lone replica always writes).
    pub(super) fn settings(
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

/// `POD_NAME` is read by clap; without it the host name stands in.
pub(super) fn default_identity() -> String {
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

/// Which of Karmada's bindings placement-sync acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KarmadaSettings {
    /// Our scheduler's name (`spec.schedulerName` of the bindings we schedule).
    pub(crate) scheduler_name: String,
    /// Schedule the bindings naming it.
    pub(crate) schedule: bool,
    /// Guard every other binding.
    pub(crate) guard: bool,
    /// How long a guarded binding may deliver to a member its record no
    /// longer allows before it is taken out (`--karmada-reschedule-grace`).
    pub(crate) reschedule_grace: std::time::Duration,
}

impl KarmadaSettings {
    pub(crate) fn any(&self) -> bool {
        self.schedule || self.guard
    }
}
