//! Whether placement policies exist, which decides fail-closed vs fail-open.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use policy_client::configmaps::{ConfigMapKind, ConfigMapSelection};

/// Where the webhook learns whether policies exist.
#[derive(Clone)]
pub(crate) enum PolicyPresence {
    /// Known up front: the embedded engine's policy directory, or a deployment
    /// without API access (which must assume policies exist).
    Fixed { exist: bool, source: String },
    /// The ConfigMaps the selection names (the policy namespace and labelled
    /// ConfigMaps, as placement-sync loads them), kept by reflectors (no API
    /// call per request). Until every first list completes, policies are
    /// assumed to exist.
    ConfigMaps {
        stores: Vec<Store<ConfigMap>>,
        selection: Arc<ConfigMapSelection>,
        synced: Arc<AtomicBool>,
    },
}

impl fmt::Debug for PolicyPresence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl PolicyPresence {
    pub(crate) fn fixed(exist: bool, source: impl Into<String>) -> Self {
        PolicyPresence::Fixed {
            exist,
            source: source.into(),
        }
    }

    /// Watch the ConfigMaps `selection` may call policies: each namespace it
    /// names, or every namespace for `*`. The reflectors run until the process
    /// ends.
    pub(crate) fn watch_config_maps(client: Client, selection: ConfigMapSelection) -> Self {
        let apis: Vec<(String, Api<ConfigMap>)> = match selection.watched_namespaces() {
            Some(namespaces) => namespaces
                .into_iter()
                .map(|ns| (ns.clone(), Api::namespaced(client.clone(), &ns)))
                .collect(),
            None => vec![("*".to_owned(), Api::all(client.clone()))],
        };
        let synced = Arc::new(AtomicBool::new(false));
        let mut stores = Vec::new();
        for (ns, api) in apis {
            let (store, writer) = reflector::store();
            tokio::spawn(async move {
                let stream = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .reflect(writer)
                    .touched_objects();
                futures::pin_mut!(stream);
                while let Some(item) = stream.next().await {
                    if let Err(e) = item {
                        tracing::warn!(namespace = %ns, error = %e, "watching policy ConfigMaps");
                    }
                }
            });
            stores.push(store);
        }
        let flag = Arc::clone(&synced);
        let ready: Vec<Store<ConfigMap>> = stores.clone();
        let describe = selection.describe();
        tokio::spawn(async move {
            for store in ready {
                if store.wait_until_ready().await.is_err() {
                    return;
                }
            }
            flag.store(true, Ordering::Release);
            tracing::info!(policies = %describe, "policy ConfigMaps listed");
        });
        PolicyPresence::ConfigMaps {
            stores,
            selection: Arc::new(selection),
            synced,
        }
    }

    /// Whether the first list has completed (always true for `Fixed`).
    pub(crate) fn is_synced(&self) -> bool {
        match self {
            PolicyPresence::Fixed { .. } => true,
            PolicyPresence::ConfigMaps { synced, .. } => synced.load(Ordering::Acquire),
        }
    }

    pub(crate) fn policies_exist(&self) -> bool {
        match self {
            PolicyPresence::Fixed { exist, .. } => *exist,
            PolicyPresence::ConfigMaps { synced, .. } => {
                !synced.load(Ordering::Acquire) || self.count() > 0
            }
        }
    }

    /// Policy ConfigMaps known now.
    fn count(&self) -> usize {
        match self {
            PolicyPresence::Fixed { exist, .. } => usize::from(*exist),
            PolicyPresence::ConfigMaps {
                stores, selection, ..
            } => stores
                .iter()
                .map(|store| store.state_filter(|cm| is_policy(selection, cm)).len())
                .sum(),
        }
    }

    /// For messages: where policies were looked for, and what was found.
    pub(crate) fn describe(&self) -> String {
        match self {
            PolicyPresence::Fixed { source, .. } => source.clone(),
            PolicyPresence::ConfigMaps {
                selection, synced, ..
            } => {
                if !synced.load(Ordering::Acquire) {
                    format!(
                        "policy ConfigMaps ({}) not listed yet",
                        selection.describe()
                    )
                } else {
                    format!(
                        "{} policy ConfigMap(s): {}",
                        self.count(),
                        selection.describe()
                    )
                }
            }
        }
    }
}

/// A ConfigMap counts as a policy when the selection says so and it holds
/// something (and is not being deleted).
fn is_policy(selection: &ConfigMapSelection, cm: &ConfigMap) -> bool {
    let namespace = cm.metadata.namespace.as_deref().unwrap_or_default();
    let name = cm.metadata.name.as_deref().unwrap_or_default();
    selection.classify(namespace, name, cm.metadata.labels.as_ref()) == Some(ConfigMapKind::Policy)
        && cm.metadata.deletion_timestamp.is_none()
        && (cm.data.as_ref().is_some_and(|d| !d.is_empty())
            || cm.binary_data.as_ref().is_some_and(|d| !d.is_empty()))
}

#[cfg(test)]
mod tests;
