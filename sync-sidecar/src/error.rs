//! Errors of the sync sidecar.

use policy_client::engine::EngineError;

/// Everything that can go wrong in the sidecar. Messages never contain the OPA token.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot build a Kubernetes client: {0}")]
    KubeConfig(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("resource type {gvr} is not served by the API server: {reason}")]
    Discovery { gvr: String, reason: String },
    #[error("resource type {gvr} is {actual}, but was given with {flag}")]
    ScopeMismatch {
        gvr: String,
        actual: &'static str,
        flag: &'static str,
    },
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    #[error("cannot serve HTTP on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("a placement-sync task panicked: {0}")]
    TaskPanicked(String),
    #[error("{0}")]
    Serialize(#[from] serde_json::Error),
    #[error("a Karmada binding's resource template: {0}")]
    Template(#[from] policy_client::karmada::TemplateError),
    #[error(
        "the engine restarted while replicated data was being written for new policies; retrying"
    )]
    EngineRestarted,
}
