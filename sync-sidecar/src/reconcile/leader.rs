//! Lease-based leader election for the remediator (crate `kube-lease-manager`:
//! server-side apply on a `coordination.k8s.io/v1` Lease, renewed before expiry).
//!
//! Only a confirmed holder is leader: any error talking to the API server drops
//! leadership at once (the remediator checks before every patch) and the
//! manager is rebuilt, which re-reads the Lease and reports leadership again
//! when this identity still holds it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, Patch};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::writers::LeaderSettings;
use crate::kube_writes::{FIELD_MANAGER, patch_params};
use crate::metrics::Metrics;
use policy_client::retry::Backoff;

/// Start leader election and return the leadership flag. Without settings this
/// replica is always the leader.
pub(crate) fn elect(
    client: Client,
    settings: Option<LeaderSettings>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    let Some(settings) = settings else {
        let (tx, rx) = watch::channel(true);
        metrics.leader.set(1);
        let task = tokio::spawn(async move {
            cancel.cancelled().await;
            drop(tx);
        });
        return (rx, task);
    };
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        campaign(client, settings, tx, metrics, cancel).await;
    });
    (rx, task)
}

fn set(tx: &watch::Sender<bool>, metrics: &Metrics, leader: bool, settings: &LeaderSettings) {
    let changed = tx.send_if_modified(|v| {
        let changed = *v != leader;
        *v = leader;
        changed
    });
    metrics.leader.set(i64::from(leader));
    if changed {
        if leader {
            tracing::info!(identity = %settings.identity, lease = %settings.lease_name, "became the remediation leader");
        } else {
            tracing::info!(identity = %settings.identity, lease = %settings.lease_name, "not the remediation leader");
        }
    }
}

async fn build(
    client: &Client,
    settings: &LeaderSettings,
) -> Result<LeaseManager, kube_lease_manager::LeaseManagerError> {
    let duration = settings.lease_duration.as_secs().max(3);
    let grace = (duration / 3).max(1);
    LeaseManagerBuilder::new(client.clone(), &settings.lease_name)
        .with_namespace(&settings.lease_namespace)
        .with_identity(&settings.identity)
        .with_duration(duration)
        .with_grace(grace)
        .with_field_manager(FIELD_MANAGER)
        .build()
        .await
}

async fn campaign(
    client: Client,
    settings: LeaderSettings,
    tx: watch::Sender<bool>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let backoff = Backoff {
        min_delay: Duration::from_millis(500),
        max_delay: Duration::from_secs(10),
    };
    let mut delays = backoff.delays();
    loop {
        let manager = tokio::select! {
            m = build(&client, &settings) => m,
            _ = cancel.cancelled() => break,
        };
        match manager {
            Ok(manager) => loop {
                let changed = tokio::select! {
                    c = manager.changed() => c,
                    _ = cancel.cancelled() => {
                        set(&tx, &metrics, false, &settings);
                        if let Err(e) = manager.release().await {
                            tracing::warn!(error = %e, "cannot release the remediation Lease");
                        }
                        return;
                    }
                };
                match changed {
                    Ok(leader) => {
                        delays = backoff.delays();
                        set(&tx, &metrics, leader, &settings);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "leader election error; stepping down until the Lease is confirmed");
                        set(&tx, &metrics, false, &settings);
                        break;
                    }
                }
            },
            Err(e) => {
                set(&tx, &metrics, false, &settings);
                tracing::warn!(error = %e, lease = %settings.lease_name, namespace = %settings.lease_namespace, "cannot set up leader election");
            }
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(10));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = cancel.cancelled() => break,
        }
    }
    set(&tx, &metrics, false, &settings);
}

/// Annotation on the Lease: the configured revision ([`crate::replication::revision`])
/// the leader last applied a pass over everything at.
pub(crate) const APPLIED_ANNOTATION: &str = "placement-policy.io/applied-revision";

/// Where the leader records the revision it applied: its Lease (without
/// leader election, nowhere: a restart then guards its first pass).
#[derive(Clone)]
pub(crate) struct AppliedRecord {
    api: Api<Lease>,
    name: String,
}

impl AppliedRecord {
    pub(crate) fn new(client: &Client, settings: Option<&LeaderSettings>) -> Option<Self> {
        settings.map(|s| AppliedRecord {
            api: Api::namespaced(client.clone(), &s.lease_namespace),
            name: s.lease_name.clone(),
        })
    }

    /// The revision recorded; `None` when there is none or it cannot be read.
    pub(crate) async fn get(&self) -> Option<String> {
        match self.api.get_opt(&self.name).await {
            Ok(lease) => lease?
                .metadata
                .annotations?
                .get(APPLIED_ANNOTATION)
                .cloned(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the applied revision from the Lease");
                None
            }
        }
    }

    pub(crate) async fn set(&self, revision: &str) -> bool {
        let patch =
            serde_json::json!({"metadata": {"annotations": {APPLIED_ANNOTATION: revision}}});
        match self
            .api
            .patch(&self.name, &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot record the applied revision on the Lease");
                false
            }
        }
    }
}
