//! What replicated objects look like in the engine, and where they live.
//!
//! Namespaced types: `{prefix}/{resource}/{namespace}/{name}`, the whole type as
//! `{namespace: {name: object}}` at `{prefix}/{resource}`. Cluster-scoped types:
//! `{prefix}/{resource}/{name}`, the whole type as `{name: object}`.

use bytes::Bytes;
use kube::api::{ApiResource, DynamicObject};
use policy_client::engine::EncodedJson;
use serde_json::Value;

/// Identifies one object of a type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ObjectKey {
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    pub(crate) fn new(namespace: Option<&str>, name: &str) -> Self {
        ObjectKey {
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
        }
    }

    pub(crate) fn of(object: &DynamicObject) -> Option<Self> {
        let name = object.metadata.name.as_deref()?;
        Some(ObjectKey::new(object.metadata.namespace.as_deref(), name))
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Engine path of a whole type: `{prefix}/{resource}`.
pub(crate) fn type_path(prefix: &str, resource: &str) -> String {
    format!("{}/{resource}", prefix.trim_matches('/'))
}

/// Engine path of one object. `namespaced` is the layout chosen by the flag; a
/// namespaced layout with an object lacking a namespace cannot happen with the API
/// server's data and falls back to the cluster-scoped form.
pub(crate) fn object_path(
    prefix: &str,
    resource: &str,
    key: &ObjectKey,
    namespaced: bool,
) -> String {
    match (&key.namespace, namespaced) {
        (Some(ns), true) => format!("{}/{ns}/{}", type_path(prefix, resource), key.name),
        _ => format!("{}/{}", type_path(prefix, resource), key.name),
    }
}

/// Remove `metadata.managedFields` (bulky, and no policy should read it).
pub(crate) fn strip_managed_fields(object: &mut Value) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
}

/// The JSON the engine receives for an object: `apiVersion` and `kind` filled in
/// (list responses leave them out of the items) and `managedFields` stripped.
pub(crate) fn object_value(object: &DynamicObject, resource: &ApiResource) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        let missing = |v: Option<&Value>| v.and_then(Value::as_str).is_none_or(str::is_empty);
        if missing(map.get("apiVersion")) {
            map.insert(
                "apiVersion".to_owned(),
                Value::String(resource.api_version.clone()),
            );
        }
        if missing(map.get("kind")) {
            map.insert("kind".to_owned(), Value::String(resource.kind.clone()));
        }
    }
    strip_managed_fields(&mut value);
    value
}

/// [`object_value`] encoded, without spare capacity (it is kept).
pub(crate) fn object_json(object: &DynamicObject, resource: &ApiResource) -> Vec<u8> {
    let mut json =
        serde_json::to_vec(&object_value(object, resource)).unwrap_or_else(|_| b"null".to_vec());
    json.shrink_to_fit();
    json
}

/// The whole-type document, encoded, from `(key, object JSON)` in key order
/// (so that the objects of one namespace come together, as the keys of a
/// `BTreeMap<ObjectKey, _>` do). Each object's JSON is a piece of its own
/// (its buffer shared, not copied); between them, one small piece carries the
/// separators and the names.
pub(crate) fn type_document<'a>(
    objects: impl IntoIterator<Item = (&'a ObjectKey, &'a Bytes)>,
    namespaced: bool,
) -> EncodedJson {
    fn name(out: &mut Vec<u8>, name: &str) {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, name);
        out.push(b':');
    }
    let mut pieces = Vec::new();
    let mut out = Vec::from(&b"{"[..]);
    let mut open: Option<&str> = None;
    let mut first = true;
    for (key, json) in objects {
        match (key.namespace.as_deref(), namespaced) {
            (Some(ns), true) if open == Some(ns) => out.push(b','),
            (Some(ns), true) => {
                if open.is_some() {
                    out.push(b'}');
                }
                if !first {
                    out.push(b',');
                }
                name(&mut out, ns);
                out.push(b'{');
                open = Some(ns);
            }
            _ => {
                if open.take().is_some() {
                    out.push(b'}');
                }
                if !first {
                    out.push(b',');
                }
            }
        }
        first = false;
        name(&mut out, &key.name);
        pieces.push(Bytes::from(std::mem::take(&mut out)));
        pieces.push(json.clone());
    }
    if open.is_some() {
        out.push(b'}');
    }
    out.push(b'}');
    pieces.push(out.into());
    EncodedJson::from_pieces(pieces)
}

#[cfg(test)]
mod tests;
