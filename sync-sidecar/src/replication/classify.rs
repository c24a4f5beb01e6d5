//! How a replicated object's change is told apart: a person's edit, a
//! change of cluster health, or other status ([`Cause`]).

use serde_json::Value;

use crate::cause::Cause;
use crate::hex::hex;
use crate::replication::document::ObjectKey;
use crate::replication::health::ClusterKind;

/// What an administrator configures of an object: everything but its status
/// and the metadata the API server keeps (labels and annotations stay); for
/// a cluster, its health fields aside.
pub(crate) fn configured(kind: Option<&ClusterKind>, object: &Value) -> Value {
    let mut view = object.clone();
    if let Value::Object(map) = &mut view {
        map.remove("status");
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            meta.retain(|k, _| {
                matches!(k.as_str(), "labels" | "annotations" | "name" | "namespace")
            });
        }
    }
    for field in kind.map(|k| k.health_fields).unwrap_or_default() {
        if let Some((parent, last)) = field.rsplit_once('/')
            && let Some(Value::Object(parent)) = view.pointer_mut(parent)
        {
            parent.remove(last);
        }
    }
    view
}

/// Why a change of replicated object `key` of type `resource` (`kind`: its
/// cluster kind, if it is one) from `before` to `after` (`None`: absent)
/// would re-place workloads.
pub(crate) fn classify(
    kind: Option<&ClusterKind>,
    resource: &str,
    key: &ObjectKey,
    before: Option<&Value>,
    after: Option<&Value>,
) -> Cause {
    let edit = |revision: String| Cause::Data {
        object: format!("{resource}/{key}"),
        revision,
    };
    let (Some(before), Some(after)) = (before, after) else {
        return edit(match after {
            Some(after) => revision(&configured(kind, after)),
            None => "deleted".to_owned(),
        });
    };
    let configured_after = configured(kind, after);
    if configured(kind, before) != configured_after {
        return edit(revision(&configured_after));
    }
    match kind {
        Some(kind) if (kind.healthy)(before) != (kind.healthy)(after) => Cause::Health,
        _ => Cause::Status,
    }
}

/// A short digest of a JSON value.
fn revision(value: &Value) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, value.to_string().as_bytes());
    hex(digest.as_ref(), 6)
}

#[cfg(test)]
mod tests;
