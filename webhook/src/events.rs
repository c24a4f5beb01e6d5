//! Kubernetes Events on the object under review, so developers see why.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use policy_client::text::truncate;
use serde_json::Value;

use crate::metrics::Metrics;
use crate::review::AdmissionRequest;

/// Publishes Events without delaying the admission response. Without a
/// Kubernetes client it only logs.
#[derive(Clone, Default)]
pub struct EventSink {
    recorder: Option<Arc<Recorder>>,
    metrics: Option<Arc<Metrics>>,
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSink")
            .field("enabled", &self.recorder.is_some())
            .finish()
    }
}

impl EventSink {
    pub fn disabled() -> Self {
        EventSink::default()
    }

    pub fn new(client: Client, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: "placement-webhook".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        EventSink {
            recorder: Some(Arc::new(Recorder::new(client, reporter))),
            metrics: Some(metrics),
        }
    }

    /// Emit a Warning Event about the object of `request`. Skipped for dry-run
    /// requests, which must have no side effects.
    pub fn emit(&self, request: &AdmissionRequest, reason: &str, message: &str) {
        if request.dry_run.unwrap_or(false) {
            return;
        }
        let Some(recorder) = self.recorder.clone() else {
            return;
        };
        let reference = object_reference(request);
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            // The Events API caps notes at 1 kB.
            note: Some(truncate(message, 1000).into_owned()),
            action: format!("Admit{}", capitalized(request.operation.as_str())),
            secondary: None,
        };
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, object = ?reference.name, "cannot publish Event");
                if let Some(metrics) = metrics {
                    metrics.event_failed();
                }
            }
        });
    }
}

fn capitalized(op: &str) -> String {
    let lower = op.to_ascii_lowercase();
    let mut chars = lower.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// The object the Event is about. Objects being created have no uid yet; a
/// `generateName` object has no name yet either, so its prefix stands in.
pub fn object_reference(request: &AdmissionRequest) -> ObjectReference {
    let object = request.object.as_ref().or(request.old_object.as_ref());
    let meta = object.and_then(|o| o.get("metadata"));
    let field = |name: &str| {
        meta.and_then(|m| m.get(name))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let api_version = if request.kind.group.is_empty() {
        request.kind.version.clone()
    } else {
        format!("{}/{}", request.kind.group, request.kind.version)
    };
    ObjectReference {
        api_version: Some(api_version),
        kind: Some(request.kind.kind.clone()),
        name: request
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| field("name"))
            .or_else(|| field("generateName")),
        namespace: request.namespace.clone().or_else(|| field("namespace")),
        uid: field("uid"),
        resource_version: None,
        field_path: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::{GroupVersionKind, GroupVersionResource, Operation};
    use serde_json::json;

    fn request(object: Value) -> AdmissionRequest {
        AdmissionRequest {
            uid: "u".into(),
            kind: GroupVersionKind {
                group: "apps".into(),
                version: "v1".into(),
                kind: "ReplicaSet".into(),
            },
            resource: GroupVersionResource {
                group: "apps".into(),
                version: "v1".into(),
                resource: "replicasets".into(),
            },
            sub_resource: None,
            name: None,
            namespace: Some("team-a".into()),
            operation: Operation::Create,
            user_info: Value::Null,
            object: Some(object),
            old_object: None,
            dry_run: None,
        }
    }

    #[test]
    fn reference_names_the_object() {
        let r = object_reference(&request(json!({"metadata": {"name": "web", "uid": "abc"}})));
        assert_eq!(r.api_version.as_deref(), Some("apps/v1"));
        assert_eq!(r.kind.as_deref(), Some("ReplicaSet"));
        assert_eq!(r.name.as_deref(), Some("web"));
        assert_eq!(r.namespace.as_deref(), Some("team-a"));
        assert_eq!(r.uid.as_deref(), Some("abc"));
        let r = object_reference(&request(json!({"metadata": {"generateName": "web-"}})));
        assert_eq!(r.name.as_deref(), Some("web-"));
        assert_eq!(capitalized("CREATE"), "Create");
    }
}
