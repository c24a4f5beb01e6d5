//! What the reconciler is given: its configuration (from the flags) and the
//! shared pieces of the sidecar it reads (engine, metrics, triggers,
//! leadership).

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::runtime::events::Recorder;
use policy_client::engine::PolicyEngine;
use tokio::sync::watch;

use super::blast::{Guard, PolicyConfigMaps};
use super::leader::AppliedRecord;
use crate::cause::Trigger;
use crate::config::writers::{KarmadaSettings, OwnershipKeySource, RemediationMode};
use crate::engine_sync::SyncState;
use crate::metrics::Metrics;
use crate::policies::rego_refs::PolicyReads;
use crate::replication::revision::ReplicatedTypes;
use crate::scope::Scope;

/// Everything the reconciler needs.
#[derive(Clone)]
pub(crate) struct ReconcilerContext {
    pub(crate) client: Client,
    pub(crate) engine: Arc<dyn PolicyEngine>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) state: Arc<SyncState>,
    pub(crate) mode: RemediationMode,
    pub(crate) decision: String,
    pub(crate) rate: f64,
    pub(crate) debounce: Duration,
    pub(crate) scope: Scope,
    /// The blast-radius guard and its partition rule.
    pub(crate) guard: Guard,
    /// Where the keys of the ownership record come from (shared with the webhook).
    pub(crate) ownership_keys: OwnershipKeySource,
    /// Where held changes are reported and confirmed.
    pub(crate) policy_configmaps: PolicyConfigMaps,
    pub(crate) query_timeout: Duration,
    /// Fired, with why, when a policy or the data it reads changed.
    pub(crate) trigger: Arc<Trigger>,
    /// What the policies read, and the replicated types: the configured
    /// revision a pass applies.
    pub(crate) reads: PolicyReads,
    pub(crate) replicated: Arc<ReplicatedTypes>,
    /// Where the leader records the revision it applied.
    pub(crate) applied: Option<AppliedRecord>,
    pub(crate) leader: watch::Receiver<bool>,
    pub(crate) recorder: Recorder,
    /// Which Karmada bindings are scheduled and which guarded; unused
    /// without binding subscriptions.
    pub(crate) karmada: KarmadaSettings,
}
