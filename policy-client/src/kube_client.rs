//! The Kubernetes client of both components, from the same `--kubeconfig`
//! flag: the file when one is given, else kube's usual inference (in-cluster,
//! then `$KUBECONFIG` / `~/.kube/config`).

use std::path::{Path, PathBuf};

use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};

/// Why there is no client.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    /// The kubeconfig file given cannot be read or used.
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        source: KubeconfigError,
    },
    /// No file given, and none found by inference.
    #[error(transparent)]
    Infer(#[from] InferConfigError),
    /// A configuration, but no client from it.
    #[error(transparent)]
    Client(#[from] kube::Error),
}

/// The configuration of `kubeconfig` when given, else the inferred one.
pub async fn config(kubeconfig: Option<&Path>) -> Result<Config, KubeClientError> {
    let Some(path) = kubeconfig else {
        return Ok(Config::infer().await?);
    };
    let file = |source| KubeClientError::File {
        path: path.to_owned(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(file)?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(file)
}

/// A client of [`config`]'s configuration.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeClientError> {
    Ok(Client::try_from(config(kubeconfig).await?)?)
}
