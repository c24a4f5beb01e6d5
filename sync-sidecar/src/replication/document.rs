//! What replicated objects look like in the engine, and where they live.
//!
//! Namespaced types: `{prefix}/{resource}/{namespace}/{name}`, the whole type as
//! `{namespace: {name: object}}` at `{prefix}/{resource}`. Cluster-scoped types:
//! `{prefix}/{resource}/{name}`, the whole type as `{name: object}`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{ApiResource, DynamicObject};
use kube::core::DynamicResourceScope;
use policy_client::engine::EncodedJson;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

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

    /// The key of the object `metadata` describes.
    pub(crate) fn of(metadata: &ObjectMeta) -> Option<Self> {
        let name = metadata.name.as_deref()?;
        Some(ObjectKey::new(metadata.namespace.as_deref(), name))
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

/// `apiVersion` or `kind` absent or empty (list responses leave them out of
/// their items): the type's own is filled in.
fn type_missing(value: Option<&Value>) -> bool {
    value.and_then(Value::as_str).is_none_or(str::is_empty)
}

/// The JSON the engine receives for an object: `apiVersion` and `kind` filled in
/// (list responses leave them out of the items) and `managedFields` stripped.
pub(crate) fn object_value(object: &DynamicObject, resource: &ApiResource) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        if type_missing(map.get("apiVersion")) {
            map.insert(
                "apiVersion".to_owned(),
                Value::String(resource.api_version.clone()),
            );
        }
        if type_missing(map.get("kind")) {
            map.insert("kind".to_owned(), Value::String(resource.kind.clone()));
        }
    }
    strip_managed_fields(&mut value);
    value
}

/// An object as a type's watch delivers it: its metadata typed (its key, its
/// resourceVersion) and every other field as JSON, decoded in one pass (a
/// `DynamicObject`'s flattened fields are buffered, then decoded again).
/// The first list of 10,000 ConfigMaps took 374-381 ms so, 371-445 ms
/// through `DynamicObject`.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchedObject {
    metadata: ObjectMeta,
    /// Every top-level field but `metadata` (`apiVersion` and `kind` when
    /// the API server sent them: list items leave them out).
    fields: Map<String, Value>,
}

impl WatchedObject {
    /// The JSON the engine receives ([`object_value`]'s, byte for byte:
    /// keys in order at every level), without spare capacity (it is kept).
    /// `managedFields` is stripped as the watch delivers the object.
    pub(crate) fn json(&self, resource: &ApiResource) -> Vec<u8> {
        let metadata = serde_json::to_value(&self.metadata).unwrap_or(Value::Null);
        let api_version = Value::String(resource.api_version.clone());
        let kind = Value::String(resource.kind.clone());
        let mut top: BTreeMap<&str, &Value> =
            self.fields.iter().map(|(k, v)| (k.as_str(), v)).collect();
        if type_missing(top.get("apiVersion").copied()) {
            top.insert("apiVersion", &api_version);
        }
        if type_missing(top.get("kind").copied()) {
            top.insert("kind", &kind);
        }
        top.insert("metadata", &metadata);
        let mut json = serde_json::to_vec(&top).unwrap_or_else(|_| b"null".to_vec());
        json.shrink_to_fit();
        json
    }
}

impl<'de> Deserialize<'de> for WatchedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = WatchedObject;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Kubernetes object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WatchedObject, A::Error> {
                let mut object = WatchedObject::default();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "metadata" {
                        object.metadata = map.next_value()?;
                    } else {
                        object.fields.insert(key, map.next_value()?);
                    }
                }
                Ok(object)
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

impl Resource for WatchedObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(resource: &ApiResource) -> Cow<'_, str> {
        resource.group.as_str().into()
    }

    fn version(resource: &ApiResource) -> Cow<'_, str> {
        resource.version.as_str().into()
    }

    fn kind(resource: &ApiResource) -> Cow<'_, str> {
        resource.kind.as_str().into()
    }

    fn api_version(resource: &ApiResource) -> Cow<'_, str> {
        resource.api_version.as_str().into()
    }

    fn plural(resource: &ApiResource) -> Cow<'_, str> {
        resource.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
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
