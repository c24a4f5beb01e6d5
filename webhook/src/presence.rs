//! Whether placement policies exist, which decides fail-closed vs fail-open.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

/// The ConfigMap the API server publishes into every namespace; never a policy.
const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

/// Where the webhook learns whether policies exist.
#[derive(Clone)]
pub enum PolicyPresence {
    /// Known up front: the embedded engine's policy directory, or a deployment
    /// without API access (which must assume policies exist).
    Fixed { exist: bool, source: String },
    /// ConfigMaps in the policy namespace, kept by a reflector (no API call per
    /// request). Until the first list completes, policies are assumed to exist.
    ConfigMaps {
        store: Store<ConfigMap>,
        namespace: String,
        synced: Arc<AtomicBool>,
    },
}

impl fmt::Debug for PolicyPresence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl PolicyPresence {
    pub fn fixed(exist: bool, source: impl Into<String>) -> Self {
        PolicyPresence::Fixed {
            exist,
            source: source.into(),
        }
    }

    /// Watch the ConfigMaps of `namespace` (optionally only those matching
    /// `label_selector`). The reflector runs until the process ends.
    pub fn watch_config_maps(
        client: Client,
        namespace: &str,
        label_selector: Option<&str>,
    ) -> Self {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let mut config = watcher::Config::default();
        if let Some(selector) = label_selector {
            config = config.labels(selector);
        }
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let ns = namespace.to_owned();
        tokio::spawn(async move {
            let stream = watcher(api, config)
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
        let flag = Arc::clone(&synced);
        let ready_store = store.clone();
        let ns = namespace.to_owned();
        tokio::spawn(async move {
            if ready_store.wait_until_ready().await.is_ok() {
                flag.store(true, Ordering::Release);
                tracing::info!(namespace = %ns, "policy ConfigMaps listed");
            }
        });
        PolicyPresence::ConfigMaps {
            store,
            namespace: namespace.to_owned(),
            synced,
        }
    }

    /// Whether the first list has completed (always true for `Fixed`).
    pub fn is_synced(&self) -> bool {
        match self {
            PolicyPresence::Fixed { .. } => true,
            PolicyPresence::ConfigMaps { synced, .. } => synced.load(Ordering::Acquire),
        }
    }

    pub fn policies_exist(&self) -> bool {
        match self {
            PolicyPresence::Fixed { exist, .. } => *exist,
            PolicyPresence::ConfigMaps { store, synced, .. } => {
                !synced.load(Ordering::Acquire) || !store.state_filter(is_policy).is_empty()
            }
        }
    }

    /// For messages: where policies were looked for, and what was found.
    pub fn describe(&self) -> String {
        match self {
            PolicyPresence::Fixed { source, .. } => source.clone(),
            PolicyPresence::ConfigMaps {
                store,
                namespace,
                synced,
            } => {
                if !synced.load(Ordering::Acquire) {
                    format!("policy ConfigMaps in namespace {namespace} not listed yet")
                } else {
                    let count = store.state_filter(is_policy).len();
                    format!("{count} policy ConfigMap(s) in namespace {namespace}")
                }
            }
        }
    }
}

/// A ConfigMap counts as a policy when it holds data and is not the root CA bundle.
fn is_policy(cm: &ConfigMap) -> bool {
    cm.metadata.name.as_deref() != Some(ROOT_CA_CONFIGMAP)
        && cm.metadata.deletion_timestamp.is_none()
        && (cm.data.as_ref().is_some_and(|d| !d.is_empty())
            || cm.binary_data.as_ref().is_some_and(|d| !d.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn root_ca_and_empty_config_maps_are_not_policies() {
        assert!(is_policy(&cm("placement", &[("main.rego", "package x")])));
        assert!(!is_policy(&cm(ROOT_CA_CONFIGMAP, &[("ca.crt", "...")])));
        assert!(!is_policy(&cm("empty", &[])));
    }

    #[test]
    fn fixed_presence() {
        let p = PolicyPresence::fixed(true, "2 modules in policies/");
        assert!(p.policies_exist());
        assert!(p.is_synced());
        assert_eq!(p.describe(), "2 modules in policies/");
    }
}
