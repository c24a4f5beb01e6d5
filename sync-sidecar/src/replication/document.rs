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
mod tests {
    use super::*;
    use serde_json::json;

    fn rs_resource() -> ApiResource {
        ApiResource {
            group: "apps".into(),
            version: "v1".into(),
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            plural: "replicasets".into(),
        }
    }

    #[test]
    fn paths() {
        let key = ObjectKey::new(Some("default"), "nginx-eu");
        assert_eq!(
            type_path("kubernetes", "replicasets"),
            "kubernetes/replicasets"
        );
        assert_eq!(type_path("/a/b/", "pods"), "a/b/pods");
        assert_eq!(
            object_path("kubernetes", "replicasets", &key, true),
            "kubernetes/replicasets/default/nginx-eu"
        );
        let cluster = ObjectKey::new(None, "gce-europe-west1");
        assert_eq!(
            object_path("kubernetes", "clusters", &cluster, false),
            "kubernetes/clusters/gce-europe-west1"
        );
        assert_eq!(key.to_string(), "default/nginx-eu");
        assert_eq!(cluster.to_string(), "gce-europe-west1");
    }

    #[test]
    fn managed_fields_are_stripped_and_type_filled_in() {
        let object: DynamicObject = serde_json::from_value(json!({
            "metadata": {
                "name": "nginx-eu",
                "namespace": "default",
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
                "labels": {"app": "nginx-eu"}
            },
            "spec": {"replicas": 4}
        }))
        .unwrap();
        let value = object_value(&object, &rs_resource());
        assert_eq!(value["apiVersion"], "apps/v1");
        assert_eq!(value["kind"], "ReplicaSet");
        assert!(value["metadata"].get("managedFields").is_none());
        assert_eq!(value["metadata"]["labels"]["app"], "nginx-eu");
        assert_eq!(value["spec"]["replicas"], 4);

        let mut other = json!({"metadata": {"managedFields": []}, "kind": "Cluster"});
        strip_managed_fields(&mut other);
        assert_eq!(other, json!({"metadata": {}, "kind": "Cluster"}));
        let mut no_meta = json!({"kind": "X"});
        strip_managed_fields(&mut no_meta);
        assert_eq!(no_meta, json!({"kind": "X"}));
    }

    #[test]
    fn existing_type_meta_is_kept() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "a"}
        }))
        .unwrap();
        let value = object_value(&object, &rs_resource());
        assert_eq!(value["kind"], "ReplicaSet");
    }

    fn document(objects: &[(ObjectKey, &str)], namespaced: bool) -> Value {
        let objects: Vec<(ObjectKey, Bytes)> = objects
            .iter()
            .map(|(k, json)| (k.clone(), Bytes::copy_from_slice(json.as_bytes())))
            .collect();
        let json = type_document(objects.iter().map(|(k, json)| (k, json)), namespaced);
        serde_json::from_slice(&json.joined()).expect("the document is JSON")
    }

    #[test]
    fn whole_type_documents() {
        let a = ObjectKey::new(Some("ns1"), "a");
        let b = ObjectKey::new(Some("ns1"), "b\"q\"");
        let c = ObjectKey::new(Some("ns2"), "c");
        let doc = document(
            &[(a.clone(), "1"), (b.clone(), "2"), (c.clone(), "3")],
            true,
        );
        assert_eq!(doc, json!({"ns1": {"a": 1, "b\"q\"": 2}, "ns2": {"c": 3}}));
        // The same objects in a cluster-scoped layout.
        let doc = document(&[(a, "1"), (b, "2"), (c, "3")], false);
        assert_eq!(doc, json!({"a": 1, "b\"q\"": 2, "c": 3}));

        let x = ObjectKey::new(None, "x");
        let y = ObjectKey::new(Some("ns"), "y");
        let doc = document(&[(x, r#"{"k":"v"}"#), (y, "[]")], true);
        assert_eq!(doc, json!({"x": {"k": "v"}, "ns": {"y": []}}));

        assert_eq!(document(&[], true), json!({}));
    }

    #[test]
    fn object_json_is_object_value_encoded() {
        let object: DynamicObject = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "n"}, "data": {"k": "v"}
        }))
        .unwrap();
        let json = object_json(&object, &rs_resource());
        assert_eq!(json.len(), json.capacity());
        let value: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value, object_value(&object, &rs_resource()));
    }
}
