//! The reconciler's targets: one watched type each, of workloads (their
//! placement annotations), of Karmada bindings (their `spec.clusters`) or of
//! OCM Placements (their PlacementDecisions).

use std::sync::Arc;

use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::Selector;

use crate::replication::document::ObjectKey;
use crate::replication::watched::WatchedType;

/// What a target keeps placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Workloads' placement annotations; `act`: remediation is on (with it
    /// off, the type is only the Karmada scheduler's source of templates).
    Workloads { act: bool },
    /// Karmada ResourceBindings or ClusterResourceBindings.
    Bindings,
    /// Open Cluster Management Placements.
    Placements,
}

pub(crate) struct Target {
    pub(crate) kind: Kind,
    pub(crate) api: Api<DynamicObject>,
    pub(crate) watched: Arc<WatchedType>,
    /// The object selector, when the watch (shared with a replicator) could
    /// not apply it.
    pub(crate) selector: Option<Selector>,
}

impl Target {
    pub(crate) fn resource(&self) -> &ApiResource {
        &self.watched.resource
    }

    /// The resourceVersion the watch holds of `key`.
    pub(crate) fn resource_version(&self, key: &ObjectKey) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(rename = "resourceVersion")]
            resource_version: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Object {
            metadata: Meta,
        }
        let json = self.watched.objects.get(key)?;
        serde_json::from_slice::<Object>(&json)
            .ok()?
            .metadata
            .resource_version
    }
}

/// `resource/namespace/name` of an object, for logs and reports.
pub(crate) fn describe(resource: &ApiResource, key: Option<&ObjectKey>) -> String {
    match key {
        Some(key) => format!("{}/{key}", resource.plural),
        None => resource.plural.clone(),
    }
}
