//! Which workloads the remediator acts on: exactly those the webhook
//! configuration sends to the webhook (the chart renders both from one set of
//! values): not in an excluded namespace, in a namespace matching the
//! namespace selector, matching the object selector. Selectors are evaluated
//! by the API server (label-selected watches), so they mean what they mean in
//! the webhook configuration.

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

/// The configured set (`--scope-*` flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub excluded_namespaces: BTreeSet<String>,
    /// A label selector on namespaces (`kubectl -l` syntax).
    pub namespace_selector: Option<String>,
    /// A label selector on the workloads themselves.
    pub object_selector: Option<String>,
}

impl Scope {
    /// The watch of a workload type: only objects matching the object selector.
    pub(crate) fn watch_config(&self) -> watcher::Config {
        match &self.object_selector {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        }
    }
}

/// The scope, with the namespaces its selector admits (watched).
#[derive(Clone)]
pub(crate) struct ScopeFilter {
    excluded: BTreeSet<String>,
    /// `None`: every namespace not excluded.
    selected: Option<Store<Namespace>>,
}

impl ScopeFilter {
    /// Start watching the selected namespaces (when a selector is set) until
    /// `cancel`; ready once they are listed.
    pub(crate) async fn start(
        client: &Client,
        scope: &Scope,
        cancel: &CancellationToken,
    ) -> ScopeFilter {
        let Some(selector) = &scope.namespace_selector else {
            return ScopeFilter {
                excluded: scope.excluded_namespaces.clone(),
                selected: None,
            };
        };
        let (store, writer) = reflector::store();
        let stream = watcher(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default().labels(selector),
        )
        .default_backoff()
        .reflect(writer);
        let cancel_watch = cancel.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    event = stream.next() => match event {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => tracing::warn!(error = %e, "namespace watch error; the watch recovers by itself"),
                        None => break,
                    },
                    _ = cancel_watch.cancelled() => break,
                }
            }
        });
        tokio::select! {
            _ = store.wait_until_ready() => {}
            _ = cancel.cancelled() => {}
        }
        ScopeFilter {
            excluded: scope.excluded_namespaces.clone(),
            selected: Some(store),
        }
    }

    /// Whether the remediator acts on `object` (the object selector is applied
    /// by the watch already).
    pub(crate) fn admits(&self, object: &DynamicObject) -> bool {
        let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
        if self.excluded.contains(namespace) {
            return false;
        }
        match &self.selected {
            None => true,
            Some(store) => store
                .state()
                .iter()
                .any(|ns| ns.metadata.name.as_deref() == Some(namespace)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(namespace: &str) -> DynamicObject {
        let mut object = DynamicObject::new(
            "rs",
            &kube::api::ApiResource::erase::<k8s_openapi::api::apps::v1::ReplicaSet>(&()),
        );
        object.metadata.namespace = Some(namespace.to_owned());
        object
    }

    #[test]
    fn excluded_namespaces_are_out_of_scope() {
        let filter = ScopeFilter {
            excluded: ["kube-system".to_owned()].into(),
            selected: None,
        };
        assert!(!filter.admits(&object("kube-system")));
        assert!(filter.admits(&object("team-a")));
    }
}
