//! What can go wrong, each saying what to do.

use std::path::PathBuf;

use policy_client::embedded::LoadError;
use policy_client::engine::EngineError;
use policy_client::kube_client::KubeClientError;

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("no Kubernetes client: {0} (give --kubeconfig, or set KUBECONFIG)")]
    Client(#[from] KubeClientError),
    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Usage(String),
    #[error(
        "cannot load the policies of {} (the path is relative to the working directory {}): {source}",
        dir.display(),
        std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default()
    )]
    PolicyDir {
        dir: PathBuf,
        #[source]
        source: LoadError,
    },
    #[error("cannot read {}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} is not valid: {message}")]
    Invalid { what: String, message: String },
    #[error("the policy engine: {0}")]
    Engine(#[from] EngineError),
}

impl PluginError {
    /// An API call that failed, and what it was for.
    pub(crate) fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> PluginError {
        let action = action.into();
        move |source| PluginError::Api { action, source }
    }
}
