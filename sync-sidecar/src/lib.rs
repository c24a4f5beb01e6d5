//! `placement-sync`: the sidecar that runs beside the policy engine (OPA). One
//! folder per job:
//!
//! - `replication`: replicates Kubernetes objects of configured types into
//!   the engine, from one shared watch per type;
//! - `policies`: loads Rego modules (and data documents) from the ConfigMaps
//!   of the policy namespace, with hot reload and a status annotation;
//! - `engine_sync`: notices engine restarts and has every component reload,
//!   tracking whether the engine is in sync;
//! - `reconcile`: on one elected replica, keeps existing workloads placed by
//!   the current policy (remediation, behind the blast-radius guard),
//!   schedules Karmada bindings that name it as their scheduler and decides
//!   the OCM Placements that opt in;
//! - `server`: serves `/metrics`, `/healthz` and `/readyz`;
//! - `config`: the flags and the validated settings;
//! - `sidecar`: wires the parts together and runs them.
//!
//! They form layers, each importing only from those below it: `sidecar`
//! over `server` and `reconcile`, over `replication`, over `policies`, over
//! `engine_sync`, over `config`, and beneath them all what they share:
//! `cause` (why placements may be stale, and the trigger that carries it),
//! `gvr`, `scope`, `hex`, `queue`, `kube_writes` (the field manager of
//! every write), `metrics` and `error`.
//!
//! The binary parses [`Args`], builds [`Settings`] and calls [`run`]; nothing
//! else is public.

#![deny(unreachable_pub)]

mod cause;
mod config;
mod engine_sync;
mod error;
mod gvr;
mod hex;
mod kube_writes;
mod metrics;
mod policies;
mod queue;
mod reconcile;
mod replication;
mod scope;
mod server;
mod sidecar;

use std::sync::Arc;

use policy_client::engine::PolicyEngine;
use policy_client::opa::{Opa, OpaConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::{Args, Settings};
pub use error::SyncError;

use sidecar::Sidecar;

/// Build the Kubernetes client: `--kubeconfig` when given, else in-cluster config
/// or `KUBECONFIG`/`~/.kube/config`.
async fn kube_client(settings: &Settings) -> Result<kube::Client, SyncError> {
    use policy_client::kube_client::{KubeClientError, client};
    client(settings.kubeconfig.as_deref())
        .await
        .map_err(|e| match e {
            KubeClientError::Client(e) => SyncError::Kube(e),
            e => SyncError::KubeConfig(e.to_string()),
        })
}

/// Build the OPA client from the settings.
fn opa_engine(settings: &Settings) -> Result<Opa, SyncError> {
    let mut config = OpaConfig::new(settings.opa_url.clone());
    config.token = settings.opa_token.clone();
    config.ca_pem = settings.opa_ca_pem.clone();
    config.insecure = settings.opa_allow_insecure;
    config.request_timeout = settings.opa_timeout;
    Ok(Opa::new(config)?)
}

/// Bind the HTTP listener of `--listen`.
async fn bind(settings: &Settings) -> Result<TcpListener, SyncError> {
    TcpListener::bind(settings.listen)
        .await
        .map_err(|source| SyncError::Listen {
            addr: settings.listen,
            source,
        })
}

/// Build everything from the settings and run until `cancel`.
pub async fn run(settings: Settings, cancel: CancellationToken) -> Result<(), SyncError> {
    let client = kube_client(&settings).await?;
    let engine: Arc<dyn PolicyEngine> = Arc::new(opa_engine(&settings)?);
    let listener = bind(&settings).await?;
    Sidecar::new(settings, client, engine)
        .run(listener, cancel)
        .await
}
